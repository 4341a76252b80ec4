"""`VerifyDecision`: what verifying one window decided, a frozen value with its invariants.

Its own module so that the window state (`window.py`, which applies it) and the decision function
(`decision.py`, which makes it) both import it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from llm42.core.errors import InvariantError


@dataclass(frozen=True)
class VerifyDecision:
    """Result of verifying one window of one request.

    num_compared:          candidates compared, [u, min(n, e)).
    num_accepted:          compared candidates kept before the first mismatch (all if none).
    num_rejected:          output tokens dropped: the mismatched one and everything after it,
                           candidates past the window end included (0 when accepted).
    corrected_token_id:    the verifier's token that replaces the mismatched one, or None.
    new_num_verified:      u after applying (m + 1 on a rollback).
    new_num_output_tokens: n after applying (m + 1 on a rollback).
    mismatch_index:        output index m of the first mismatch, or None.
    injected:              the mismatch at m was planted by the ``MismatchInjector`` (False when
                           a natural mismatch came first or ``skip_compare`` ignored it).
    num_inconsistent:      re-run entries before u where the verifier disagrees with the committed
                           token: a verifier non-determinism signal, committed tokens stay.
    """

    num_compared: int
    num_accepted: int
    num_rejected: int
    corrected_token_id: int | None
    new_num_verified: int
    new_num_output_tokens: int
    mismatch_index: int | None
    injected: bool = False
    num_inconsistent: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.num_accepted <= self.num_compared:
            raise InvariantError(
                f"expected 0 <= accepted <= compared, found {self.num_accepted}, "
                f"{self.num_compared}"
            )
        if self.num_inconsistent < 0:
            raise InvariantError(f"num_inconsistent must be >= 0, found {self.num_inconsistent}")
        if self.mismatch_index is None:
            is_consistent = (
                self.num_rejected == 0
                and self.corrected_token_id is None
                and self.num_accepted == self.num_compared
                and not self.injected
            )
        else:
            is_consistent = (
                self.num_rejected >= 1
                and self.corrected_token_id is not None
                and self.num_accepted < self.num_compared
                and self.new_num_verified == self.new_num_output_tokens == self.mismatch_index + 1
            )
        if not is_consistent:
            raise InvariantError(f"inconsistent decision {self}")

    @property
    def is_rollback(self) -> bool:
        return self.mismatch_index is not None

    @property
    def num_committed(self) -> int:
        """Tokens this decision makes verified: the accepted ones plus the corrected one."""
        return self.num_accepted + (1 if self.is_rollback else 0)
