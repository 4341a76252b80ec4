"""Seeded mismatch injection: plant a wrong candidate to exercise the rollback path on purpose.

One ``corrupt()`` call per verification window; with probability ``rate`` one candidate at a
uniformly random index is replaced by a different valid token id.

    injector = MismatchInjector(rate=0.1, seed=0)
    candidate_ids, injected = injector.corrupt(candidate_ids, vocab_size=32000)
"""

from __future__ import annotations

import random
from collections.abc import Collection


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

    def corrupt(
        self, candidate_ids: list[int], vocab_size: int, avoid_ids: Collection[int] = ()
    ) -> tuple[list[int], int | None]:
        """Return (a copy of ``candidate_ids``, maybe with one token replaced; its index or None).

        The index is relative to ``candidate_ids``. ``avoid_ids`` (pass the stop token ids) are
        never planted: a planted EOS that happens to be right would end the request mid-window.
        The coin is drawn on every call, empty lists included, so one skipped window never shifts
        the choices of the later ones.
        """
        self.num_calls += 1
        corrupted_ids = list(candidate_ids)
        if not (self._rng.random() < self.rate and corrupted_ids):
            return corrupted_ids, None
        index = self._rng.randrange(len(corrupted_ids))
        corrupted_ids[index] = self._draw_other(corrupted_ids[index], vocab_size, avoid_ids)
        self.num_injected += 1
        return corrupted_ids, index

    def _draw_other(self, token_id: int, vocab_size: int, avoid_ids: Collection[int]) -> int:
        """Uniform over [0, vocab_size) minus ``token_id`` minus ``avoid_ids``."""
        excluded = sorted({t for t in (token_id, *avoid_ids) if 0 <= t < vocab_size})
        num_choices = vocab_size - len(excluded)
        if num_choices < 1:
            raise ValueError(
                f"mismatch injection needs a token other than {excluded} in a vocabulary of "
                f"{vocab_size}; use a larger vocabulary or fewer avoided ids"
            )
        # Draw among the allowed slots, then step over each excluded id at or below the draw.
        choice = self._rng.randrange(num_choices)
        for excluded_id in excluded:
            if choice >= excluded_id:
                choice += 1
        return choice
