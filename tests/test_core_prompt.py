"""Prompt verification in the core (`verify_prompt`): window -1, prompt rows, o_0 decisions."""

from __future__ import annotations

import pytest

from llm42.core import (
    PAD_TOKEN_ID,
    DetRequestState,
    InvariantError,
    build_prompt_rows,
    build_row,
    decide,
    num_job_rows,
    plan_passes,
)

PROMPT = [7, 8, 9, 10, 11, 12, 13, 14, 15, 16]  # P = 10


def prompt_state(window_size: int = 4) -> DetRequestState:
    state = DetRequestState(rid="r", window_size=window_size, num_prompt_tokens=len(PROMPT),
                            verify_prompt=True)
    state.on_first_token()
    return state


def test_first_token_is_a_candidate_until_the_prompt_pass():
    state = prompt_state()
    assert (state.num_verified_tokens, state.num_output_tokens) == (0, 1)
    assert state.is_prompt_pending and state.is_ready  # due as soon as o_0 exists
    assert (state.window_index, state.window_start, state.compare_end) == (-1, -1, 1)
    state.append_candidates(3)  # decoding goes on meanwhile; only o_0 is compared
    assert (state.compare_end, state.num_real_entries) == (1, 1)
    with pytest.raises(InvariantError, match="prompt comes first"):
        build_row(state, [1, 2, 3, 4])


def test_prompt_rows_cover_the_prompt_and_only_the_last_entry_is_sampled():
    rows = build_prompt_rows(prompt_state(4), PROMPT)
    assert [r.input_ids for r in rows] == [
        (7, 8, 9, 10), (11, 12, 13, 14), (15, 16, PAD_TOKEN_ID, PAD_TOKEN_ID)]
    assert [r.prefix_len for r in rows] == [0, 4, 8]
    assert [r.positions for r in rows] == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11)]
    assert [(r.num_real, r.sample_from) for r in rows] == [(4, 4), (4, 4), (2, 1)]
    # rows of one prompt keep their order across passes of B rows (later rows read their KV)
    passes = plan_passes(rows, batch_size=2, window_size=4)
    assert [row.rid for p in passes for row in p.rows if not row.is_pad] == [r.rid for r in rows]
    # an exact multiple of W: the last row is full and samples its last entry
    last = build_prompt_rows(prompt_state(5), PROMPT)[-1]
    assert (last.num_real, last.sample_from, last.prefix_len) == (5, 4, 5)


@pytest.mark.parametrize(("verifier_o0", "rollback"), [(100, False), (555, True)])
def test_prompt_decision_accepts_or_replaces_o0(verifier_o0, rollback):
    state = prompt_state()
    state.append_candidates(3)
    output = [100, 101, 102, 103]
    decision = decide(state, output, [verifier_o0])
    assert decision.num_compared == 1 and decision.is_rollback == rollback
    state.apply(decision)
    assert not state.is_prompt_pending and state.num_verified_tokens == 1
    if rollback:  # o_0 replaced, its candidates dropped
        assert (decision.corrected_token_id, state.num_output_tokens) == (555, 1)
        assert decision.num_rejected == 4
    else:  # window 0 comes next, over the prompt's (now verified) KV
        assert state.num_output_tokens == 4 and state.window_start == 0


def test_restart_and_abort_keep_prompt_verification():
    state = prompt_state()
    state.append_candidates(2)
    assert state.rollback_unverified() == 3 and state.num_output_tokens == 0
    state.on_first_token()
    state.restart()
    state.on_first_token()
    assert state.is_prompt_pending and state.num_restarts == 1


def test_prompt_rows_misuse_raises():
    with pytest.raises(InvariantError, match="no prompt pass pending"):
        build_prompt_rows(DetRequestState(rid="r", window_size=4, num_prompt_tokens=10,
                                          verify_prompt=True), PROMPT)
    with pytest.raises(InvariantError, match="prompt tokens"):
        build_prompt_rows(prompt_state(), PROMPT[:-1])
    solo = DetRequestState(rid="r", window_size=4, num_prompt_tokens=10)
    solo.on_first_token()
    with pytest.raises(InvariantError, match="no prompt pass pending"):
        build_prompt_rows(solo, PROMPT)


def test_cached_prompt_rows_are_skipped_and_checked():
    """Prefix-cache hit of 8 tokens (two rows of W = 4): only the row over [8, 10) is replayed,
    with the same prefix, positions and inputs as the third row of a cold pass."""
    cold = build_prompt_rows(prompt_state(4), PROMPT)
    state = DetRequestState(rid="r", window_size=4, num_prompt_tokens=len(PROMPT),
                            verify_prompt=True)
    state.use_cached_prompt(8)
    state.on_first_token()
    warm = build_prompt_rows(state, PROMPT)
    assert [(r.input_ids, r.prefix_len, r.positions, r.sample_from) for r in warm] == [
        (r.input_ids, r.prefix_len, r.positions, r.sample_from) for r in cold[2:]]
    for bad in (6, 12):  # not a multiple of W; not below P
        with pytest.raises(InvariantError, match="multiple of W below P"):
            DetRequestState(rid="r", window_size=4, num_prompt_tokens=10, verify_prompt=True,
                            ).use_cached_prompt(bad)
    with pytest.raises(InvariantError, match="before a verified prefill"):
        DetRequestState(rid="r", window_size=4, num_prompt_tokens=10).use_cached_prompt(4)
    state.restart()
    assert state.num_cached_prompt_tokens == 0  # matched afresh by the next prefill


def next_state(window_size: int) -> DetRequestState:
    """A prompt pass that also verifies o_1 (`prompt_verifies_next`, inline verification)."""
    state = DetRequestState(rid="r", window_size=window_size, num_prompt_tokens=len(PROMPT),
                            verify_prompt=True, prompt_verifies_next=True)
    state.on_first_token()
    return state


@pytest.mark.parametrize(("window", "rows"), [
    (4, [((15, 16, 100, PAD_TOKEN_ID), 8, 3, 1)]),  # o_0 joins the last prompt row
    (5, [((12, 13, 14, 15, 16), 5, 5, 4), ((100,) + (PAD_TOKEN_ID,) * 4, 10, 1, 0)]),  # its own
])
def test_a_prompt_pass_that_verifies_next_replays_o0_at_position_p(window, rows):
    """The entry after the prompt's last is o_0 at position P: the prompt's last entry predicts
    o_0, o_0's predicts o_1, and every job row is counted for the pass budget."""
    state = next_state(window)
    output = [100]
    assert state.is_ready and (state.compare_end, state.num_real_entries) == (1, 1)
    got = build_prompt_rows(state, PROMPT, output)
    tail = [(r.input_ids, r.prefix_len, r.num_real, r.sample_from) for r in got[-len(rows):]]
    assert tail == rows
    assert num_job_rows(state) == len(got) == -(-(len(PROMPT) + 1) // window)
    sampled = [r.positions[j] for r in got for j in range(r.sample_from, r.num_real)]
    assert sampled == [len(PROMPT) - 1, len(PROMPT)]  # predicting o_0, then o_1
    with pytest.raises(InvariantError, match="output tokens"):
        build_prompt_rows(state, PROMPT, [])


@pytest.mark.parametrize(("verifier", "verified", "output", "corrected"), [
    ([100, 101], 2, 2, None),  # both accepted: o_2 can be verified inline
    ([100, 555], 2, 2, 555),  # o_1 replaced, o_2 dropped
    ([555, 101], 1, 1, 555),  # o_0 replaced, o_1 and o_2 dropped
])
def test_a_prompt_decision_that_verifies_next_compares_o0_and_o1(verifier, verified, output,
                                                                 corrected):
    state = next_state(4)
    state.append_candidates(2)
    decision = decide(state, [100, 101, 102], verifier)
    assert decision.num_compared == 2 and decision.corrected_token_id == corrected
    state.apply(decision)
    assert (state.num_verified_tokens, state.num_output_tokens) == (verified, output + (
        1 if corrected is None else 0))


def test_a_prompt_decision_that_verifies_next_without_o1_verifies_o0():
    """o_1 not decoded yet (SGLang's normal loop): the decision compares o_0 alone."""
    state = next_state(4)
    decision = decide(state, [100], [100, 101])
    assert decision.num_compared == 1 and not decision.is_rollback
    state.apply(decision)
    assert (state.num_verified_tokens, state.is_prompt_pending) == (1, False)
    with pytest.raises(InvariantError, match="only a verified prompt"):
        DetRequestState(rid="r", window_size=4, num_prompt_tokens=3, prompt_verifies_next=True)


def test_a_prompt_verified_with_its_prefill_commits_o0_on_arrival():
    """Inline prompt rows (`inline_prefill`): o_0 came from the verifier's logits, so prompt and
    o_0 are verified when o_0 arrives; nothing else is, and only a pending prompt with o_0 alone
    can be."""
    state = prompt_state(4)
    state.verify_prompt_on_arrival()
    assert (state.num_verified_tokens, state.is_prompt_pending, state.is_ready) == (1, False, False)
    state.append_candidates(1)
    with pytest.raises(InvariantError, match="pending prompt and o_0 alone"):
        state.verify_prompt_on_arrival()  # the prompt is no longer pending
    ahead = prompt_state(4)
    ahead.append_candidates(1)  # o_1 arrived first: a pass decides both
    with pytest.raises(InvariantError, match="pending prompt and o_0 alone"):
        ahead.verify_prompt_on_arrival()
