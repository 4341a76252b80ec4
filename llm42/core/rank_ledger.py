"""What one scheduler rank committed and rolled back, comparable across tensor-parallel ranks.

Under TP every rank runs its own scheduler over its shard of the KV cache, and every rank must
apply the same decisions to it: a rank that committed a token its peers rolled back (or wrote a
different corrected token) computes the next steps over KV the others do not have, and nothing
in the outputs needs to show it. Each rank therefore keeps a ledger of its decisions: counts plus
a running digest over every decision's request id, verified range, mismatch and the token ids it
committed, in the order decided. Ranks agree when their ledgers are equal.

    ledger = DecisionLedger()
    ledger.observe(rid, first_index, committed_ids, num_rolled_back, mismatch_index)
    ranks_agree([rank0.snapshot(), rank1.snapshot()])   # the /llm42_stats check
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

_FIELDS = ("decisions", "committed_tokens", "rolled_back_tokens", "digest")


def _new_hash():
    return hashlib.blake2b(digest_size=16)


@dataclass(eq=False)
class DecisionLedger:
    """Counts and an order-sensitive digest of one rank's decisions since start or reset."""

    num_decisions: int = 0
    num_committed_tokens: int = 0
    num_rolled_back_tokens: int = 0
    _hash: Any = field(default_factory=_new_hash)

    def observe(self, rid: str, first_index: int, committed_ids: Sequence[int],
                num_rolled_back: int, mismatch_index: int | None) -> None:
        """One decision: output indices [first_index, first_index + len(committed_ids)) now
        verified with `committed_ids` (the corrected token last on a rollback at
        `mismatch_index`), `num_rolled_back` candidates dropped."""
        self.num_decisions += 1
        self.num_committed_tokens += len(committed_ids)
        self.num_rolled_back_tokens += num_rolled_back
        record = (rid, first_index, tuple(committed_ids), num_rolled_back, mismatch_index)
        self._hash.update(repr(record).encode())

    def reset(self) -> None:
        self.num_decisions = self.num_committed_tokens = self.num_rolled_back_tokens = 0
        self._hash = _new_hash()

    def snapshot(self) -> dict[str, int | str]:
        return {"decisions": self.num_decisions, "committed_tokens": self.num_committed_tokens,
                "rolled_back_tokens": self.num_rolled_back_tokens,
                "digest": self._hash.hexdigest()}


def ranks_agree(ledgers: Sequence[dict]) -> bool:
    """Whether the ledger snapshots of one replica's TP ranks record the same decisions."""
    return len({tuple(ledger[k] for k in _FIELDS) for ledger in ledgers}) <= 1
