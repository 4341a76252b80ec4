"""DetRequestState: window arithmetic, readiness, events and invariant checks."""

from __future__ import annotations

import dataclasses

import pytest

from llm42.core import DetRequestState, InvariantError

from core_factories import P, accept, make_state, rollback


def assert_window(state: DetRequestState, *, k: int, start: int, end: int, num_real: int) -> None:
    found = (state.window_index, state.window_start, state.window_end, state.num_real_entries)
    assert found == (k, start, end, num_real), (
        f"u={state.num_verified_tokens} n={state.num_output_tokens} W={state.window_size}: "
        f"expected (k, start, end, num_real)={(k, start, end, num_real)}, found {found}"
    )


WINDOW_CASES = [
    # (W, u, n, finishing) -> (k, start, end, num_real, is_ready)
    ((4, 1, 1, False), (0, 0, 5, 0, False)),  # only o_0: nothing to verify
    ((4, 1, 4, False), (0, 0, 5, 3, False)),  # window 0 one short of full
    ((4, 1, 5, False), (0, 0, 5, 4, True)),  # window 0 full: candidates [1, 5)
    ((4, 1, 7, False), (0, 0, 5, 4, True)),  # decoded past the window end: row still W real
    ((4, 5, 5, False), (1, 4, 9, 0, False)),  # window 0 accepted, window 1 empty
    ((4, 5, 9, False), (1, 4, 9, 4, True)),  # window 1 full
    ((4, 5, 7, True), (1, 4, 9, 2, True)),  # window 1 cut short by EOS
    ((4, 5, 7, False), (1, 4, 9, 2, False)),  # same counts, not finishing: wait for W
    ((4, 3, 5, False), (0, 0, 5, 4, True)),  # after a rollback at 2: same window 0 again
    ((4, 3, 3, False), (0, 0, 5, 2, False)),  # after a rollback at 2: nothing left to check
    ((1, 1, 2, False), (0, 0, 2, 1, True)),  # W=1: one candidate per window
    ((1, 4, 5, False), (3, 3, 5, 1, True)),  # W=1, window 3
    ((3, 4, 6, True), (1, 3, 7, 2, True)),  # cut by max tokens inside window 1
]


@pytest.mark.parametrize(("args", "expected"), WINDOW_CASES)
def test_window_arithmetic(args, expected) -> None:
    window_size, u, n, finishing = args
    k, start, end, num_real, is_ready = expected
    state = make_state(window_size, u, n, finishing=finishing)
    assert_window(state, k=k, start=start, end=end, num_real=num_real)
    assert state.is_ready == is_ready, f"{args}: expected is_ready={is_ready}"
    assert state.prefix_len == P + start
    assert state.row_positions == [P + start + j for j in range(window_size)]
    assert state.num_candidate_tokens == n - u


def test_fresh_state_is_not_ready() -> None:
    state = DetRequestState(rid="r", window_size=4, num_prompt_tokens=P)
    assert (state.num_output_tokens, state.num_verified_tokens, state.is_ready) == (0, 0, False)
    assert state.window_index == 0


def test_events_drive_a_window_to_ready() -> None:
    state = DetRequestState(rid="r", window_size=4, num_prompt_tokens=P)
    state.on_first_token()
    assert (state.num_verified_tokens, state.num_output_tokens) == (1, 1)
    state.append_candidates(3)
    assert not state.is_ready, "3 of 4 candidates: not ready"
    finishing = dataclasses.replace(state)
    finishing.defer_finish("eos")
    assert finishing.is_ready, "finishing with candidates: ready"
    state.append_candidates()
    assert state.is_ready and state.num_real_entries == 4


def test_a_finish_is_deferred_only_while_candidates_exist_and_released_by_their_accept() -> None:
    with pytest.raises(InvariantError, match="only while candidates exist"):
        make_state(4, 5, 5).defer_finish("eos")  # nothing unverified: the finish stands
    state = make_state(4, 5, 7)
    state.defer_finish("eos")
    assert state.apply(accept(2, verified=7, outputs=7)) == "eos", "the accept of the last candidate releases the finish"
    assert not state.is_finishing and state.deferred_finish is None


def test_apply_accept_and_rollback_counters() -> None:
    state = make_state(4, 1, 6, finishing=True)
    state.ready_since_step = 3
    assert state.apply(accept(4, verified=5, outputs=6)) is None, "a candidate is left: the finish stays deferred"
    assert (state.num_verified_tokens, state.num_output_tokens) == (5, 6)
    assert state.is_finishing, "an accept keeps the finishing flag"
    assert state.ready_since_step is None, "the job ran: its wait starts over"
    assert state.apply(rollback(1, accepted=0, rejected=1, corrected=7, verified=6,
                                mismatch=5)) is None, "a rollback drops the finish: re-checked afresh"
    assert (state.num_verified_tokens, state.num_output_tokens) == (6, 6)
    assert not state.is_finishing, "a rollback clears the finishing flag"
    counters = (state.num_verify_passes, state.num_rollbacks, state.num_tokens_rolled_back)
    assert counters == (2, 1, 1), f"passes/rollbacks/rolled back: {counters}"


def test_apply_rejects_stale_decision() -> None:
    state = make_state(4, 1, 5)
    decision = accept(4, verified=5, outputs=5)
    state.append_candidates()  # the list moved on after the decision was computed
    with pytest.raises(InvariantError, match="stale decision"):
        state.apply(decision)


def test_drop_candidates() -> None:
    state = make_state(4, 5, 9, finishing=True)
    assert state.rollback_unverified() == 4
    assert (state.num_verified_tokens, state.num_output_tokens) == (5, 5)
    assert not state.is_finishing and state.num_rollbacks == 0, "dropping is not a rollback"
    assert state.rollback_unverified() == 0, "nothing left to drop"


def test_restart_forgets_outputs_and_keeps_counters() -> None:
    """A retracted request starts over from its prompt: window 0 is the next to verify."""
    state = make_state(4, 9, 12, finishing=True)
    state.num_verify_passes, state.num_rollbacks, state.ready_since_step = 3, 1, 7
    assert state.restart() == 12
    assert state.ready_since_step is None
    assert (state.num_verified_tokens, state.num_output_tokens) == (0, 0)
    assert not state.is_finishing and not state.is_ready
    assert (state.num_verify_passes, state.num_rollbacks, state.num_restarts) == (3, 1, 1)
    state.on_first_token()
    state.append_candidates(4)
    assert state.is_ready and state.window_index == 0 and state.prefix_len == P


def test_state_uses_identity_equality() -> None:
    a, b = make_state(4, 1, 1), make_state(4, 1, 1)
    assert a != b and len({a, b}) == 2


INVALID_STATES = [
    # constructor kwargs that break an invariant
    {"window_size": 0},  # window size < 1
    {"num_prompt_tokens": -1},  # negative prompt
    {"num_verified_tokens": 3, "num_output_tokens": 2},  # verified > output
    {"num_verified_tokens": 0, "num_output_tokens": 2},  # o_0 exists but is not verified
    {"num_verified_tokens": -1, "num_output_tokens": -1},  # negative counts
    {"num_rollbacks": -1},  # negative counter
    {"num_rollbacks": 2, "num_verify_passes": 1},  # more rollbacks than passes
]


@pytest.mark.parametrize("kwargs", INVALID_STATES)
def test_invalid_state_raises(kwargs) -> None:
    fields = {"rid": "bad", "window_size": 4, "num_prompt_tokens": P, **kwargs}
    with pytest.raises(InvariantError, match="bad"):
        DetRequestState(**fields)


def test_event_misuse_raises() -> None:
    fresh = DetRequestState(rid="r", window_size=4, num_prompt_tokens=P)
    with pytest.raises(InvariantError, match="before on_first_token"):
        fresh.append_candidates()
    fresh.on_first_token()
    with pytest.raises(InvariantError, match="expects no output"):
        fresh.on_first_token()
    with pytest.raises(InvariantError, match="cannot append"):
        fresh.append_candidates(-1)
    assert isinstance(InvariantError("x"), AssertionError), "reads as an internal assertion"
