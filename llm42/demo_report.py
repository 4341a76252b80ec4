"""What `make demo` prints: whether a request answered the same bit for bit alone and under
load, and `/llm42_stats` in a few sentences. Pure functions over plain values, so the verdicts
and the summary are tested without a server (tests/test_demo.py):

    print(verdict_line(compare(alone, loaded), deterministic=True, device="cpu"))
    print("\\n".join(stats_summary(requests.get(url + "/llm42_stats").json())))
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Answer:
    """One chat answer: its text, the output token ids and each token's logprob."""

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    seconds: float = 0.0


@dataclass(frozen=True)
class Comparison:
    """Two answers of one request. `first_difference`: the first output index whose token id
    or logprob differs (a length difference counts at the shorter length); None if identical."""

    num_tokens: tuple[int, int]
    same_token_ids: bool
    first_difference: int | None

    @property
    def identical(self) -> bool:
        return self.first_difference is None


def _same_float(x: float, y: float) -> bool:
    """Bitwise equality as JSON gives it back: NaN equals NaN, -0.0 differs from 0.0."""
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    return x == y and math.copysign(1.0, x) == math.copysign(1.0, y)


def compare(a: Answer, b: Answer) -> Comparison:
    pairs = zip(zip(a.token_ids, a.logprobs), zip(b.token_ids, b.logprobs))
    first = next((i for i, ((ta, la), (tb, lb)) in enumerate(pairs)
                  if ta != tb or not _same_float(la, lb)), None)
    lengths = (len(a.token_ids), len(b.token_ids))
    if first is None and (lengths[0] != lengths[1] or len(a.logprobs) != len(b.logprobs)):
        first = min(lengths)
    return Comparison(num_tokens=lengths, same_token_ids=a.token_ids == b.token_ids,
                      first_difference=first)


def verdict_line(c: Comparison, *, deterministic: bool, device: str) -> str:
    """The verdict on one request's two answers (alone, then under load), said plainly."""
    if deterministic:
        if c.identical:
            return (f"IDENTICAL bit for bit: all {c.num_tokens[0]} token ids and logprobs are "
                    "the same alone and under load.")
        return (f"DIFFERENT from token {c.first_difference}: llm42's guarantee did not hold "
                "here. Please report it with the server log.")
    if c.identical:
        if device == "cpu":
            return (f"unchanged here ({c.num_tokens[0]} tokens): on CPU, SGLang's kernels "
                    "happened to compute this request the same way alone and in the batch. On a "
                    "GPU, batching changes reduction orders and normal requests drift.")
        return (f"unchanged this time ({c.num_tokens[0]} tokens): batching did not change "
                "this request's numerics in this run, though nothing guarantees that.")
    if c.same_token_ids:
        return (f"CHANGED: the same token ids, but the logprobs differ from token "
                f"{c.first_difference}: batching changed its numerics.")
    return (f"CHANGED from token {c.first_difference}: batching changed its numerics and "
            "then its tokens. Nothing guarantees a normal request's output.")


def stats_summary(stats: dict | str) -> list[str]:
    """`/llm42_stats` in a few lines: passes, rollbacks and what recompute % means."""
    if not isinstance(stats, dict):
        return [f"GET /llm42_stats: {stats}"]
    if not stats.get("enabled"):
        return ["llm42 is not enabled on this server (GET /llm42_stats says so)."]
    window, batch = stats["window_size"], stats["verify_batch_size"]
    verified, rolled = stats["verified_tokens"], stats["tokens_rolled_back"]
    finished = f"{stats['det_requests_finished']} deterministic requests finished."
    if stats.get("verifier") == "row-invariant":
        inline = stats.get("inline_verified_tokens", 0)
        lines = [
            "Verifier row-invariant: each verified token's bits depend on its request alone, "
            "not on the batch, the window size or how the prompt was prefilled.",
            f"{finished} {verified + inline} tokens were verified and sent: {inline} as they "
            f"were decoded (inline), {verified} by {stats['verify_passes']} verification "
            f"passes (windows of up to {window} tokens).",
        ]
    else:
        lines = [
            f"{finished} Their tokens went through {stats['verify_passes']} verification "
            f"passes (each replays up to {batch} windows of {window} tokens); {verified} tokens "
            "were verified and sent.",
        ]
    lines += [
        f"Rollbacks: {stats['rollbacks']} windows where the replay computed a different token "
        f"than the fast path; {rolled} decoded tokens from those points on were thrown away "
        "and decoded again.",
        f"Recompute {stats['recompute_pct']:.1f} %: the share of the tokens passes checked that "
        f"rollbacks threw away, {rolled} / ({verified} + {rolled}). Normal requests never pay "
        "it.",
    ]
    if stats.get("inconsistent_tokens"):
        lines.append(f"WARNING: {stats['inconsistent_tokens']} committed tokens were computed "
                     "differently when verified again (should stay 0).")
    if stats.get("unproven_backend"):
        lines.append(f"Attention backend without a determinism proof: "
                     f"{stats['unproven_backend']}.")
    lines.append("Every counter and the settings in use: GET /llm42_stats")
    return lines
