"""The per-rank decision ledger (`llm42.core.rank_ledger`) and the TP-agreement check built on it:
ranks that decided alike agree, any difference in what they committed or dropped does not.
(Merged over DP replicas in /llm42_stats: tests/test_endpoints.py.)"""

from __future__ import annotations

import pytest

from llm42.core import DecisionLedger, ranks_agree

# (rid, first_index, committed_ids, num_rolled_back, mismatch_index)
DECISIONS = [("a", 0, [5], 0, None),  # a prompt pass: o_0 verified
             ("a", 1, [6, 7, 8], 5, 3),  # rolled back at output index 3, 8 corrected
             ("b", 1, [9] * 8, 0, None)]  # a full window committed


def _ledger(decisions) -> dict:
    ledger = DecisionLedger()
    for decision in decisions:
        ledger.observe(*decision)
    return ledger.snapshot()


def test_ranks_with_the_same_decisions_agree():
    assert ranks_agree([_ledger(DECISIONS), _ledger(list(DECISIONS))])
    snap = _ledger(DECISIONS)
    assert {k: snap[k] for k in ("decisions", "committed_tokens", "rolled_back_tokens")} == {
        "decisions": 3, "committed_tokens": 12, "rolled_back_tokens": 5}


@pytest.mark.parametrize("other", [
    pytest.param([*DECISIONS[:1], ("a", 1, [6, 7, 9], 5, 3), *DECISIONS[2:]],
                 id="another corrected token"),
    pytest.param([*DECISIONS[:1], ("a", 1, [6, 7, 8], 4, 3), *DECISIONS[2:]],
                 id="fewer candidates dropped"),
    pytest.param([*DECISIONS[:1], ("a", 1, [6, 7, 8, 8], 4, 4), *DECISIONS[2:]],
                 id="mismatch one later"),
    pytest.param([DECISIONS[0], DECISIONS[2], DECISIONS[1]], id="same decisions, other order"),
    pytest.param(DECISIONS[:2], id="a decision missing"),
    pytest.param([*DECISIONS[:2], ("c", 1, [9] * 8, 0, None)], id="another request"),
])
def test_ranks_that_decided_otherwise_disagree(other):
    assert not ranks_agree([_ledger(DECISIONS), _ledger(other)])


def test_reset_starts_the_ledger_afresh():
    ledger = DecisionLedger()
    for decision in DECISIONS:
        ledger.observe(*decision)
    ledger.reset()
    assert ledger.snapshot() == _ledger([])
    assert ranks_agree([]) and ranks_agree([_ledger([])])

