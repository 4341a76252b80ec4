"""One verification round, as pure functions the adapter applies: which jobs run now, their rows
grouped into fixed-shape passes, each job's decision (with an injected mismatch) and what becomes
of a deferred finish. Only running the passes on the model and editing the engine's token lists
and KV stay in the adapter (`llm42.sglang.verify_passes`).

    chosen = due_jobs(states, step, config)                   # stamps readiness, picks jobs
    chosen, later = cap_jobs(states, chosen, step, config)    # the step's row budget, if any
    for plan in plan_round([job_rows(s, prompt, out) for s in jobs], B, W): ... run the pass
    decision = decide_job(state, output_ids, verifier_ids, injector, vocab_size)
    ... truncate / correct the token list and KV to match the decision ...
    settled = settle(state, decision)                         # finish, re-check or decode on
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llm42.core.config import ROW_INVARIANT, Llm42Config
from llm42.core.decision import VerifyDecision, decide
from llm42.core.injection import MismatchInjector
from llm42.core.planner import (
    VerifyPass,
    VerifyRow,
    build_prompt_rows,
    build_row,
    cap_step_rows,
    num_job_rows,
    plan_passes,
    select_jobs,
)
from llm42.core.window import DetRequestState


def due_jobs(states: Sequence[DetRequestState], step: int, config: Llm42Config,
             hold: bool = False, urgent: Sequence[bool] | None = None) -> list[int]:
    """Indices of the ready `states` to verify now (`planner.select_jobs`), most pressing first.

    Each job's wait counts from the decode step it was first seen ready (`note_ready`, stamped
    here); a finishing job is urgent once it waited `Llm42Config.finish_wait_steps` steps (by
    default W // 4, capped at the max verify wait). `hold`: the step is about to prefill.
    `urgent[i]`: state i's job is due now whatever it waited (an inline-verify catch-up)."""
    for state in states:
        state.note_ready(step)
    waits = [step - s.ready_since_step for s in states]
    urgent = urgent or [False] * len(states)
    return select_jobs([num_job_rows(s) for s in states], waits,
                       [(s.is_finishing and w >= config.finish_wait_steps) or u
                        for s, w, u in zip(states, waits, urgent)],
                       config.verify_batch_size, config.verify_wait_steps,
                       config.max_passes_per_step, hold)


def cap_jobs(states: Sequence[DetRequestState], chosen: Sequence[int], step: int,
             config: Llm42Config) -> tuple[list[int], list[int]]:
    """`chosen` (`due_jobs`' indices into `states`) cut to the step's row budget,
    `--llm42-max-pass-rows-per-step` (`planner.cap_step_rows`): the indices to verify now, most
    pressing first, and those deferred to a later step (still ready, their waits kept, so they
    come first then). Without a cap, `chosen` as it is and nothing deferred."""
    if config.max_pass_rows_per_step is None:
        return list(chosen), []
    picked = cap_step_rows([num_job_rows(states[i]) for i in chosen],
                           [step - states[i].ready_since_step for i in chosen],
                           [states[i].is_finishing for i in chosen],
                           config.max_pass_rows_per_step)
    run = [chosen[k] for k in picked]
    return run, [i for i in chosen if i not in run]


def range_is_fixed(state: DetRequestState) -> bool:
    """The job's rows are the same whatever a decode step in flight appends: a full window (its
    end is fixed), a prompt (its rows need o_0 only; with `prompt_verifies_next` they also
    predict o_1, compared if that step brought it), or a finishing request's partial window: the
    step in flight decoded one token past the withheld finish, and the adapter drops that token
    instead of appending it (`update_finish_state_hook`). Only such jobs may run before that
    step's result is processed (decisions wait for it); every ready job is one of them."""
    return (state.is_prompt_pending or state.num_output_tokens >= state.window_end
            or state.is_finishing)


def job_rows(state: DetRequestState, prompt_ids: Sequence[int],
             output_ids: Sequence[int]) -> list[VerifyRow]:
    """The rows of a job: the prompt's rows while the prompt pass is pending, else its window."""
    if state.is_prompt_pending:
        return build_prompt_rows(state, prompt_ids, output_ids)
    return [build_row(state, output_ids)]


@dataclass(frozen=True)
class PassPlan:
    """One pass of a round and whose its real rows are: ``owners[i]`` is the job of row i and
    ``decides[i]`` whether row i is that job's last (its result decides the job)."""

    vpass: VerifyPass
    owners: tuple[int, ...]  # [num_real_rows] job indices
    decides: tuple[bool, ...]  # [num_real_rows]

    def row_owners(self, jobs: Sequence) -> list:
        """The owner of each of the pass's rows, from one item per job (e.g. its request);
        None for the pass's dummy rows."""
        return [jobs[j] for j in self.owners] + [None] * self.vpass.num_pad_rows


def plan_round(jobs: Sequence[Sequence[VerifyRow]], batch_size: int,
               window_size: int) -> list[PassPlan]:
    """The rows of `jobs`, in order, in passes of B x W; a job is decided by its last row (one
    row for a window, ceil(P / W) rows for a prompt, possibly spread over several passes), from
    the verifier tokens of all its rows in order (`RowResult` entries from `sample_from` on)."""
    owners = [j for j, rows in enumerate(jobs) for _ in rows]
    decides = [i == len(rows) - 1 for rows in jobs for i in range(len(rows))]
    plans, start = [], 0
    for vpass in plan_passes([row for rows in jobs for row in rows], batch_size, window_size):
        end = start + vpass.num_real_rows
        plans.append(PassPlan(vpass, tuple(owners[start:end]), tuple(decides[start:end])))
        start = end
    return plans


def round_plans(jobs: Sequence[Sequence[VerifyRow]], config: Llm42Config) -> list[PassPlan]:
    """`plan_round` with the config's pass size: B rows, or under the row-invariant verifier
    (where B is no numeric) the round's rows in one pass, whose entries fill R-row forwards
    across jobs instead of each B rows starting a new one."""
    rows_per_pass = config.verify_batch_size
    if config.verifier == ROW_INVARIANT:
        rows_per_pass = max(1, sum(len(rows) for rows in jobs))
    return plan_round(jobs, rows_per_pass, config.window_size)


def decide_job(state: DetRequestState, output_ids: Sequence[int], verifier_ids: Sequence[int],
               injector: MismatchInjector, vocab_size: int,
               skip_compare: bool = False) -> VerifyDecision:
    """The decision for the job's verifier tokens; the injector may plant one mismatch among the
    compared candidates of a copy of `output_ids` (never with `skip_compare`)."""
    candidates, injected = list(output_ids), None
    if not skip_compare:
        u = state.num_verified_tokens
        corrupted, index = injector.corrupt(candidates[u : state.compare_end], vocab_size)
        if index is not None:
            injected = u + index
            candidates[injected] = corrupted[index]
    return decide(state, candidates, verifier_ids, skip_compare=skip_compare,
                  injected_index=injected)


@dataclass(frozen=True)
class Settlement:
    """What the adapter does after a decision, its token list already matching it.

    was_prompt:     the decision verified the prompt (its KV may now be shared).
    finish:         a deferred finish the decision released: finish the request with it.
    recheck_finish: a rollback; the corrected token may be EOS or complete a stop string.
    """

    was_prompt: bool
    finish: object | None
    recheck_finish: bool


def settle(state: DetRequestState, decision: VerifyDecision) -> Settlement:
    """Apply `decision` to `state` and say what becomes of the request's finish."""
    was_prompt = state.is_prompt_pending
    released = state.apply(decision)
    return Settlement(was_prompt, released, decision.is_rollback)


def withhold_finish(state: DetRequestState, finish: object) -> bool:
    """A finish the fast path just produced: withheld (True) while unverified candidates caused
    it, until the decision verifying them releases it (`settle`); else it stands."""
    if state.num_candidate_tokens == 0:
        return False
    state.defer_finish(finish)
    return True
