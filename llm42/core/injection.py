"""Seeded mismatch injection: plant a wrong candidate to exercise the rollback path on purpose.

One ``corrupt()`` call per verification window; with probability ``rate`` one candidate at a
uniformly random index is replaced by a different valid token id.

    injector = MismatchInjector(rate=0.1, seed=0)
    candidate_ids, injected = injector.corrupt(candidate_ids, vocab_size=32000)
"""

from __future__ import annotations

import random


class MismatchInjector:
    """Deterministic for a given seed: the same call sequence corrupts the same positions."""

    def __init__(self, rate: float, seed: int) -> None:
        if not 0.0 <= rate <= 1.0:  # also rejects NaN
            raise ValueError(
                f"--llm42-inject-mismatch-rate must be in [0, 1], got {rate}; "
                "pass e.g. 0.05 to corrupt one candidate in 5% of the windows"
            )
        self.rate = rate
        self.seed = seed
        self.num_calls = 0
        self.num_injected = 0
        self._rng = random.Random(seed)

    def corrupt(self, candidate_ids: list[int], vocab_size: int) -> tuple[list[int], int | None]:
        """Return (a copy of ``candidate_ids``, maybe with one token replaced; its index or None).

        The index is relative to ``candidate_ids``. The coin is drawn on every call, empty lists
        included, so one skipped window never shifts the choices of the later ones. ``decide()``
        treats the returned index as a mismatch even if the new token happens to be right.
        """
        self.num_calls += 1
        corrupted_ids = list(candidate_ids)
        if not (self._rng.random() < self.rate and corrupted_ids):
            return corrupted_ids, None
        if vocab_size < 2:
            raise ValueError(
                f"mismatch injection needs a vocabulary of >= 2 tokens, got {vocab_size}"
            )
        index = self._rng.randrange(len(corrupted_ids))
        # Draw from the vocabulary minus one slot, then step over the original id: always
        # different, always in [0, vocab_size), even if the original is out of range.
        token_id = self._rng.randrange(vocab_size - 1)
        if token_id >= corrupted_ids[index]:
            token_id += 1
        corrupted_ids[index] = token_id
        self.num_injected += 1
        return corrupted_ids, index
