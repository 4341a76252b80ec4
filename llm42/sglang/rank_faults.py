"""Test faults that make one tensor-parallel rank differ from its peers (TP rank 1 only).

On a CPU with gloo every rank computes the same logits, so nothing would show that the token
share (`tp_share`) does anything, or that the rank ledgers catch ranks that decide differently.
Never set outside tests:

- `LLM42_TEST_SKEW_RANK_TOKENS=1`: every id TP rank 1 samples (decode, prefill, verification
  passes) is changed *before* the share, as if its last all-reduce had differed by a bit. With
  the share the change never reaches a decision; without it rank 1 decides on other tokens.
- `LLM42_TEST_SPLIT_RANK_DECISION=1`: TP rank 1 writes another corrected token at each rollback,
  *after* the share: a rank that decides differently. Its ledger must then disagree.
"""

from __future__ import annotations

import dataclasses
import os

SKEW_ENV = "LLM42_TEST_SKEW_RANK_TOKENS"
SPLIT_ENV = "LLM42_TEST_SPLIT_RANK_DECISION"
FAULTY_RANK = 1


def _on(env: str) -> bool:
    from llm42.sglang import runtime

    rt = runtime.RUNTIME
    return (os.environ.get(env, "") not in ("", "0") and rt is not None
            and rt.tp_rank == FAULTY_RANK)


def skew_tokens(token_ids, vocab_size: int) -> None:
    """Rank 1's first sampled id of a call moved to the next vocabulary id (in place)."""
    if token_ids.numel() and _on(SKEW_ENV):
        token_ids[0] = (token_ids[0] + 1) % vocab_size


def split_decision(decision, vocab_size: int):
    """Rank 1's rollbacks take the vocabulary id after the verifier's corrected token."""
    if decision.is_rollback and _on(SPLIT_ENV):
        return dataclasses.replace(
            decision, corrected_token_id=(decision.corrected_token_id + 1) % vocab_size)
    return decision
