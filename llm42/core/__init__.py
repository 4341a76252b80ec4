"""Engine-agnostic llm42 core: window state, decisions, planning, verify rounds, injection,
statistics, the per-rank decision ledger.

Pure Python (no sglang, torch or numpy), so its tests run in milliseconds.

    from llm42.core import DetRequestState, decide, build_row, plan_passes
"""

from llm42.core.config import Llm42Config
from llm42.core.decision import PAD_TOKEN_ID, VerifyDecision, decide
from llm42.core.errors import InvariantError
from llm42.core.injection import MismatchInjector
from llm42.core.planner import (
    VerifyPass,
    VerifyRow,
    build_prompt_rows,
    build_row,
    cap_step_rows,
    num_job_rows,
    overdue_wait,
    plan_passes,
    select_jobs,
)
from llm42.core.rank_ledger import DecisionLedger, ranks_agree
from llm42.core.stats import Llm42Stats
from llm42.core.verify_round import (
    PassPlan,
    Settlement,
    cap_jobs,
    decide_job,
    due_jobs,
    job_rows,
    plan_round,
    range_is_fixed,
    settle,
    withhold_finish,
)
from llm42.core.window import DetRequestState

__all__ = [
    "PAD_TOKEN_ID",
    "DecisionLedger",
    "DetRequestState",
    "InvariantError",
    "Llm42Config",
    "Llm42Stats",
    "MismatchInjector",
    "PassPlan",
    "Settlement",
    "VerifyDecision",
    "VerifyPass",
    "VerifyRow",
    "build_prompt_rows",
    "build_row",
    "cap_jobs",
    "cap_step_rows",
    "decide",
    "decide_job",
    "due_jobs",
    "job_rows",
    "num_job_rows",
    "overdue_wait",
    "plan_passes",
    "plan_round",
    "range_is_fixed",
    "ranks_agree",
    "select_jobs",
    "settle",
    "withhold_finish",
]
