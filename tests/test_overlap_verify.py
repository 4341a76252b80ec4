"""`--llm42-overlap-verify` queues a pass before the decode step in flight is processed; only jobs
whose compared candidates that step cannot change may go first (`verify_round.range_is_fixed`).
The end-to-end check (bitwise outputs, `overlapped_passes`) is in test_batched_prefill.py."""

from __future__ import annotations

import dataclasses

import pytest

from core_factories import make_state
from llm42.core import DetRequestState
from llm42.core.verify_round import range_is_fixed

W = 4


def _after_step(state: DetRequestState) -> DetRequestState:
    """What processing the in-flight decode step does to a request: one more candidate, unless
    its finish is withheld: the token past it is dropped (`update_finish_state_hook`)."""
    later = dataclasses.replace(state)
    if not state.is_finishing:
        later.append_candidates(1)
    return later


@pytest.mark.parametrize(("state", "fixed"), [
    (make_state(W, u=1, n=5), True),    # window 0 full (n >= e = 5)
    (make_state(W, u=1, n=7), True),    # full, candidates already past it
    (make_state(W, u=5, n=9), True),    # window 1 full
    (make_state(W, u=1, n=3, finishing=True), True),  # partial window of a finishing request
    (make_state(W, u=5, n=6, finishing=True), True),
    (make_state(W, u=1, n=3), False),  # a partial window still decoding (not ready anyway)
    (DetRequestState(rid="p", window_size=W, num_prompt_tokens=9, verify_prompt=True,
                     num_verified_tokens=0, num_output_tokens=1), True),  # prompt pass: o_0
])
def test_only_jobs_whose_compared_range_cannot_grow_go_first(state, fixed):
    assert range_is_fixed(state) is fixed
    later = _after_step(state)
    same = (later.compare_end, later.num_real_entries, later.window_start) == (
        state.compare_end, state.num_real_entries, state.window_start)
    assert same is fixed  # the predicate is exactly "the pass's rows stay valid"
