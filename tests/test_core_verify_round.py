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
    cap_jobs,
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


def test_a_finishing_window_waits_max_finish_wait_steps_unless_a_pass_has_room():
    """--llm42-max-finish-wait 3 (B = 2, max verify wait 6): a finishing partial window seen at
    step 10 is not urgent until step 13; a full window due meanwhile takes it into its pass (the
    room is free); 0 verifies it at once, and by default it waits W // 4 steps."""
    config = Llm42Config(window_size=8, verify_batch_size=2, max_verify_wait=6,
                         max_finish_wait=3)
    finishing = replace(make_state(8, 1, 4, finishing=True), rid="f")
    assert due_jobs([finishing], 10, config) == []
    assert due_jobs([finishing], 12, config) == [] and finishing.ready_since_step == 10
    assert due_jobs([finishing], 13, config) == [0], "waited max_finish_wait steps"
    late = replace(make_state(8, 1, 4, finishing=True), rid="g")
    full = replace(make_state(8, 1, 9), rid="w")
    due_jobs([full], 20, config)  # the full window has waited since step 20
    assert sorted(due_jobs([late, full], 26, config)) == [0, 1], "shares the due window's pass"
    assert late.ready_since_step == 26, "it had waited no step"
    at_once = replace(make_state(8, 1, 4, finishing=True), rid="h")
    assert due_jobs([at_once], 0, replace(config, max_finish_wait=0)) == [0]
    default = replace(config, max_finish_wait=None)  # W // 4 = 2, under the verify wait of 6
    assert default.finish_wait_steps == 2 and Llm42Config().finish_wait_steps == 64 // 4
    assert replace(default, max_verify_wait=1).finish_wait_steps == 1, "capped at the verify wait"
    assert Llm42Config(verifier="row-invariant").finish_wait_steps == 0
    waiting = replace(make_state(8, 1, 4, finishing=True), rid="i")
    assert due_jobs([waiting], 30, default) == [] and due_jobs([waiting], 31, default) == []
    assert due_jobs([waiting], 32, default) == [0], "waited W // 4 steps"


def test_cap_jobs_holds_the_rest_of_a_step_back_for_the_next():
    """--llm42-max-pass-rows-per-step 2 (row-invariant): two windows, a 2-row prompt and a
    finishing window ready at step 5. The finishing window and the first window take the
    budget; the others wait, keep their stamps and go first at the next steps, ahead of the
    windows that become ready after them."""
    config = Llm42Config(window_size=W, verifier="row-invariant", max_pass_rows_per_step=2)
    w = [replace(make_state(W, 1, 5), rid=f"w{i}") for i in range(4)]
    states = [w[0], _prompt_state("p", 2 * W), w[1],
              replace(make_state(W, 1, 5, finishing=True), rid="f")]
    chosen = due_jobs(states, 5, config)
    assert sorted(chosen) == [0, 1, 2, 3], "row-invariant: every ready job is due at once"
    assert cap_jobs(states, chosen, 5, config) == ([3, 0], [1, 2]), "finishing first"
    for step, ready, ran, held in [
        (6, [states[1], w[1], w[2]], ["p"], ["w1", "w2"]),  # waited 1 step: prompt, w1
        (7, [w[1], w[2], w[3]], ["w1", "w2"], ["w3"]),  # w1 waited 2 steps, w2 1, w3 0
    ]:
        run, later = cap_jobs(ready, due_jobs(ready, step, config), step, config)
        assert ([ready[i].rid for i in run], [ready[i].rid for i in later]) == (ran, held), step
    assert [s.ready_since_step for s in w] == [5, 5, 6, 7], "a held job keeps its stamp"


def test_cap_jobs_without_a_cap_or_over_it():
    states = [replace(make_state(W, 1, 5), rid=f"w{i}") for i in range(3)]
    no_cap = Llm42Config(window_size=W, verifier="row-invariant")
    assert cap_jobs(states, [2, 0, 1], 0, no_cap) == ([2, 0, 1], []), "chosen as it is"
    prompt = _prompt_state("p", 3 * W)  # 3 rows against a budget of 2: runs alone
    capped = replace(no_cap, max_pass_rows_per_step=2)
    assert cap_jobs([prompt, *states], due_jobs([prompt, *states], 0, capped), 0, capped) == (
        [0], [1, 2, 3])


def test_decide_job_plants_the_injected_mismatch_in_a_copy():
    state, outputs = make_state(W, 1, 5), [7] * 5
    decision = decide_job(state, outputs, [7] * W, MismatchInjector(1.0, 0), vocab_size=50)
    assert decision.is_rollback and decision.injected and outputs == [7] * 5
    skipped = decide_job(state, outputs, [8] * W, MismatchInjector(1.0, 0), 50, skip_compare=True)
    assert not skipped.is_rollback and not skipped.injected
