"""decide(): compare / commit / rollback arithmetic on aligned windows."""

from __future__ import annotations

import pytest

from llm42.core import PAD_TOKEN_ID, DetRequestState, InvariantError, VerifyDecision, decide

from core_factories import P, make_state


def output_token(index: int) -> int:
    return 100 + index


def make_case(window_size: int, u: int, n: int, *, finishing: bool = False):
    state = make_state(window_size, u, n, finishing=finishing)
    return state, [output_token(i) for i in range(n)]


def verifier_tokens(state: DetRequestState, differ_at: set[int]) -> list[int]:
    """[W] verifier ids: entry j predicts output index kW + 1 + j; padding after num_real."""
    ids = []
    for j in range(state.num_real_entries):
        index = state.window_start + 1 + j
        ids.append(900 + index if index in differ_at else output_token(index))
    return ids + [PAD_TOKEN_ID] * (state.window_size - len(ids))


def assert_decision(decision: VerifyDecision, expected: tuple) -> None:
    found = (
        decision.num_compared,
        decision.num_accepted,
        decision.num_rejected,
        decision.new_num_verified,
        decision.new_num_output_tokens,
        decision.mismatch_index,
        decision.num_inconsistent,
    )
    assert found == expected, (
        f"(compared, accepted, rejected, new_u, new_n, mismatch, inconsistent): "
        f"expected {expected}, found {found}"
    )


DECIDE_CASES = [
    # (W, u, n, finishing, verifier differs at) ->
    #     (compared, accepted, rejected, new_u, new_n, mismatch, inconsistent)
    ((4, 1, 5, False, set()), (4, 4, 0, 5, 5, None, 0)),  # full window accepted
    ((4, 1, 5, False, {1}), (4, 0, 4, 2, 2, 1, 0)),  # mismatch at first candidate
    ((4, 1, 5, False, {3}), (4, 2, 2, 4, 4, 3, 0)),  # mismatch in the middle
    ((4, 1, 5, False, {4}), (4, 3, 1, 5, 5, 4, 0)),  # mismatch at last candidate
    ((4, 1, 5, False, {2, 4}), (4, 1, 3, 3, 3, 2, 0)),  # two mismatches: first one wins
    ((4, 5, 9, False, set()), (4, 4, 0, 9, 9, None, 0)),  # second window accepted
    ((4, 5, 9, False, {7}), (4, 2, 2, 8, 8, 7, 0)),  # second window, mismatch in the middle
    ((4, 5, 7, True, set()), (2, 2, 0, 7, 7, None, 0)),  # window cut short by EOS, accepted
    ((4, 5, 7, True, {6}), (2, 1, 1, 7, 7, 6, 0)),  # cut short by EOS, the EOS is wrong
    ((4, 5, 6, True, set()), (1, 1, 0, 6, 6, None, 0)),  # cut by max tokens after one candidate
    ((4, 3, 5, False, set()), (2, 2, 0, 5, 5, None, 0)),  # re-verify window 0 after rollback
    ((4, 3, 5, False, {2}), (2, 2, 0, 5, 5, None, 1)),  # re-run entry before u differs
    ((4, 3, 5, False, {1, 4}), (2, 1, 1, 5, 5, 4, 1)),  # inconsistency and a real mismatch
    ((4, 3, 4, True, {3}), (1, 0, 1, 4, 4, 3, 0)),  # re-verify after rollback, cut by EOS
    ((4, 1, 8, False, set()), (4, 4, 0, 5, 8, None, 0)),  # past the window end: kept on accept
    ((4, 1, 8, False, {3}), (4, 2, 5, 4, 4, 3, 0)),  # past the window end: dropped on rollback
    ((4, 1, 8, False, {5, 6}), (4, 4, 0, 5, 8, None, 0)),  # tokens past e are not compared
    ((1, 1, 2, False, set()), (1, 1, 0, 2, 2, None, 0)),  # W=1 accepted
    ((1, 4, 6, False, {4}), (1, 0, 2, 5, 5, 4, 0)),  # W=1 rollback drops the later candidate
]


@pytest.mark.parametrize(("args", "expected"), DECIDE_CASES)
def test_decide(args, expected) -> None:
    window_size, u, n, finishing, differ_at = args
    state, output_ids = make_case(window_size, u, n, finishing=finishing)
    verifier_ids = verifier_tokens(state, differ_at)
    decision = decide(state, output_ids, verifier_ids)
    assert_decision(decision, expected)
    if decision.is_rollback:
        assert decision.corrected_token_id == 900 + decision.mismatch_index
        assert decision.num_committed == decision.num_accepted + 1
    else:
        assert decision.corrected_token_id is None
        assert decision.num_committed == decision.num_accepted
    state.apply(decision)  # must be consistent with the state it was computed for
    assert state.num_verified_tokens == expected[3] and state.num_output_tokens == expected[4]


def test_skip_compare_accepts_every_candidate() -> None:
    state, output_ids = make_case(4, 1, 5)
    decision = decide(state, output_ids, verifier_tokens(state, {1, 3}), skip_compare=True)
    assert_decision(decision, (4, 4, 0, 5, 5, None, 0))


@pytest.mark.parametrize(
    ("differ_at", "injected_index", "is_injected"),
    [
        ({3}, 3, True),  # the injected token caused the rollback
        ({2, 3}, 3, False),  # a natural mismatch came first: the injected token is just dropped
    ],
)
def test_injected_flag(differ_at, injected_index, is_injected) -> None:
    state, output_ids = make_case(4, 1, 5)
    decision = decide(
        state, output_ids, verifier_tokens(state, differ_at), injected_index=injected_index
    )
    assert decision.injected == is_injected, f"expected injected={is_injected}"


def test_injected_index_is_a_mismatch_even_when_right() -> None:
    """A planted token that happens to equal the verifier's still rolls back to the verifier's."""
    state, output_ids = make_case(4, 1, 5)
    decision = decide(state, output_ids, verifier_tokens(state, set()), injected_index=2)
    assert_decision(decision, (4, 1, 3, 3, 3, 2, 0))
    assert decision.injected and decision.corrected_token_id == output_token(2)


def test_skip_compare_ignores_injection() -> None:
    state, output_ids = make_case(4, 1, 5)
    decision = decide(
        state, output_ids, verifier_tokens(state, {2}), skip_compare=True, injected_index=2
    )
    assert not decision.is_rollback and not decision.injected


def test_decide_is_pure() -> None:
    state, output_ids = make_case(4, 1, 5)
    verifier_ids = verifier_tokens(state, {2})
    before = (list(output_ids), list(verifier_ids), state.num_verified_tokens)
    assert decide(state, output_ids, verifier_ids) == decide(state, output_ids, verifier_ids)
    assert (output_ids, verifier_ids, state.num_verified_tokens) == before


MISUSE_CASES = [
    # (u, n, output list length, verifier ids, injected index, message)
    (1, 5, 4, [101, 102, 103, 104], None, "list has 4"),  # output list out of sync
    (1, 1, 1, [], None, "nothing to verify"),  # no candidate
    (1, 5, 5, [101, 102], None, "expected >= 4 verifier"),  # verifier row too short
    (1, 5, 5, [101, PAD_TOKEN_ID, 103, 104], None, "padding id"),  # pad in a real entry
    (1, 5, 5, [101, 102, 103, 104], 5, "outside the compared range"),  # bad injected index
]


@pytest.mark.parametrize(("u", "n", "length", "verifier_ids", "injected", "message"), MISUSE_CASES)
def test_decide_misuse_raises(u, n, length, verifier_ids, injected, message) -> None:
    state, _ = make_case(4, u, n)
    output_ids = [output_token(i) for i in range(length)]
    with pytest.raises(InvariantError, match=message):
        decide(state, output_ids, verifier_ids, injected_index=injected)


VALID_ACCEPT = {
    "num_compared": 2,
    "num_accepted": 2,
    "num_rejected": 0,
    "corrected_token_id": None,
    "new_num_verified": 3,
    "new_num_output_tokens": 3,
    "mismatch_index": None,
}
VALID_ROLLBACK = {**VALID_ACCEPT, "num_accepted": 0, "num_rejected": 2, "corrected_token_id": 5}
VALID_ROLLBACK.update(new_num_verified=2, new_num_output_tokens=2, mismatch_index=1)

INCONSISTENT_DECISIONS = [
    # (valid base, overrides that contradict it)
    (VALID_ACCEPT, {"num_accepted": 3}),  # accepted > compared
    (VALID_ACCEPT, {"num_accepted": 1}),  # partial accept without a mismatch
    (VALID_ACCEPT, {"injected": True}),  # injected without a mismatch
    (VALID_ACCEPT, {"num_inconsistent": -1}),  # negative inconsistency count
    (VALID_ROLLBACK, {"corrected_token_id": None}),  # rollback without a corrected token
    (VALID_ROLLBACK, {"new_num_verified": 3}),  # u' != m + 1
    (VALID_ROLLBACK, {"num_rejected": 0}),  # rollback that drops nothing
]


def test_valid_bases_are_valid() -> None:
    assert not VerifyDecision(**VALID_ACCEPT).is_rollback
    assert VerifyDecision(**VALID_ROLLBACK).num_committed == 1


@pytest.mark.parametrize(("base", "overrides"), INCONSISTENT_DECISIONS)
def test_inconsistent_decision_raises(base, overrides) -> None:
    with pytest.raises(InvariantError):
        VerifyDecision(**{**base, **overrides})
