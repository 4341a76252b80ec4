"""Bitwise comparison of repeated generations (token ids and log-probability floats).

    rep = compare_repetitions([(ids_1, lps_1), (ids_2, lps_2), ...])
    rep.identical, rep.first_divergence, rep.max_abs_logprob_diff
    bits(ref_logprobs) == bits(got_logprobs)   # any nesting of lists, dicts and floats

Positions are 0-based output positions. Log-probs are compared by their IEEE-754 bits (so -0.0
differs from 0.0, and NaN equals a NaN of the same bits); JSON carries a server's float exactly
(shortest round-trip repr), so equal bits here mean equal bits there.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass

Sample = tuple[Sequence[int], Sequence[float]]  # (output token ids, their log-probs)


def bits(value):
    """Floats as their IEEE-754 bits (so -0.0 != 0.0 and NaN == NaN), recursively through
    lists, tuples and dicts; anything else as it is."""
    if isinstance(value, float):
        return "f" + struct.pack(">d", value).hex()
    if isinstance(value, dict):
        return {k: bits(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [bits(v) for v in value]
    return value


@dataclass(frozen=True)
class PairDiff:
    """How one repetition differs from the reference (all None when bitwise identical)."""

    first_token_divergence: int | None  # first position whose token id differs (or length)
    first_logprob_divergence: int | None  # first position whose log-prob bits differ
    max_abs_logprob_diff: float  # over positions before the first token divergence

    @property
    def first_divergence(self) -> int | None:
        found = [p for p in (self.first_token_divergence, self.first_logprob_divergence)
                 if p is not None]
        return min(found) if found else None

    @property
    def identical(self) -> bool:
        return self.first_divergence is None


def compare_pair(ref: Sample, got: Sample) -> PairDiff:
    ref_ids, ref_lps = list(ref[0]), list(ref[1])
    got_ids, got_lps = list(got[0]), list(got[1])
    token_div = next((i for i, (a, b) in enumerate(zip(ref_ids, got_ids)) if a != b), None)
    if token_div is None and len(ref_ids) != len(got_ids):
        token_div = min(len(ref_ids), len(got_ids))
    lp_div = next((i for i, (a, b) in enumerate(zip(ref_lps, got_lps)) if bits(a) != bits(b)),
                  None)
    if lp_div is None and len(ref_lps) != len(got_lps):
        lp_div = min(len(ref_lps), len(got_lps))
    # Log-probs of different tokens are not comparable: stop at the first token divergence.
    upto = min(len(ref_lps), len(got_lps), token_div if token_div is not None else len(ref_lps))
    diffs = [abs(a - b) for a, b in zip(ref_lps[:upto], got_lps[:upto])
             if not (math.isnan(a) or math.isnan(b))]
    return PairDiff(token_div, lp_div, max(diffs, default=0.0))


@dataclass(frozen=True)
class RequestReport:
    """One deterministic request over all its repetitions (repetition 0 is the reference)."""

    num_repetitions: int
    diffs: tuple[PairDiff, ...]  # repetition k+1 vs repetition 0

    @property
    def identical(self) -> bool:
        return all(d.identical for d in self.diffs)

    @property
    def num_divergent(self) -> int:
        return sum(not d.identical for d in self.diffs)

    @property
    def first_divergence(self) -> int | None:
        found = [d.first_divergence for d in self.diffs if d.first_divergence is not None]
        return min(found) if found else None

    @property
    def first_token_divergence(self) -> int | None:
        found = [d.first_token_divergence for d in self.diffs
                 if d.first_token_divergence is not None]
        return min(found) if found else None

    @property
    def max_abs_logprob_diff(self) -> float:
        return max((d.max_abs_logprob_diff for d in self.diffs), default=0.0)


def compare_repetitions(samples: Sequence[Sample]) -> RequestReport:
    if len(samples) < 2:
        raise ValueError(f"need at least 2 repetitions to compare, got {len(samples)}.")
    return RequestReport(len(samples), tuple(compare_pair(samples[0], s) for s in samples[1:]))


def expectation_holds(mode: str, reports: Sequence[RequestReport]) -> bool:
    """llm42: every request bitwise identical; control: at least one divergence."""
    if mode == "llm42":
        return bool(reports) and all(r.identical for r in reports)
    if mode == "control":
        return any(not r.identical for r in reports)
    raise ValueError(f"mode must be 'llm42' or 'control', got {mode!r}.")
