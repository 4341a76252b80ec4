"""`llm42.core.verify_round`: the pure steps of a round the adapter applies (the randomized
end-to-end check is test_core_simulation.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from core_factories import make_state
from llm42.core import (
    DetRequestState,
    Llm42Config,
    MismatchInjector,
    decide_job,
    due_jobs,
    job_rows,
    plan_round,
)

W = 4


def _prompt_state(rid: str, num_prompt: int) -> DetRequestState:
    return DetRequestState(rid=rid, window_size=W, num_prompt_tokens=num_prompt,
                           verify_prompt=True, num_output_tokens=1)


@pytest.mark.parametrize(("job_sizes", "batch_size", "owners", "decides"), [
    # job sizes (rows) -> per pass: owner job of each real row, and which rows decide
    ([1, 1, 1], 2, [(0, 1), (2,)], [(True, True), (True,)]),  # windows, last pass padded
    ([3, 1], 2, [(0, 0), (0, 1)], [(False, False), (True, True)]),  # a prompt across passes
    ([1, 2], 4, [(0, 1, 1)], [(True, False, True)]),  # one pass, the prompt's last row decides
])
def test_plan_round_says_whose_each_row_is_and_which_row_decides(job_sizes, batch_size,
                                                                  owners, decides):
    states = [replace(make_state(W, 1, 5), rid=f"r{i}") if size == 1
              else _prompt_state(f"p{i}", W * size) for i, size in enumerate(job_sizes)]
    jobs = [job_rows(s, [3] * s.num_prompt_tokens, [7] * s.num_output_tokens) for s in states]
    assert [len(rows) for rows in jobs] == job_sizes
    plans = plan_round(jobs, batch_size, W)
    assert [p.owners for p in plans] == owners and [p.decides for p in plans] == decides
    assert all(p.vpass.batch_size == batch_size for p in plans)


def test_due_jobs_counts_waits_from_the_first_step_a_job_was_seen_ready():
    config = Llm42Config(window_size=W, verify_batch_size=2, max_verify_wait=3)
    state = make_state(W, 1, 5)
    assert due_jobs([state], 10, config) == [] and state.ready_since_step == 10
    assert due_jobs([state], 12, config) == [] and state.ready_since_step == 10, "kept"
    assert due_jobs([state], 13, config) == [0], "waited max_verify_wait steps"


def test_decide_job_plants_the_injected_mismatch_in_a_copy():
    state, outputs = make_state(W, 1, 5), [7] * 5
    decision = decide_job(state, outputs, [7] * W, MismatchInjector(1.0, 0), vocab_size=50)
    assert decision.is_rollback and decision.injected and outputs == [7] * 5
    skipped = decide_job(state, outputs, [8] * W, MismatchInjector(1.0, 0), 50, skip_compare=True)
    assert not skipped.is_rollback and not skipped.injected
