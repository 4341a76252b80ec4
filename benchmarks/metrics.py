"""One benchmark run -> one JSON record (the schema every results JSONL line follows).

    rec = summarize(outputs, is_det, duration_s=12.3)     # throughput + latency percentiles
    rec.update(metadata)                                  # dataset, config, llm42 stats, ...

Latency keys: `{group_}{ttft,itl,e2e}_{p50,p99,mean}_ms` for group "" (all requests), "det_"
(requests labelled deterministic) and "normal_" (the rest); null when the group is empty.
`{group_}itl_p99_ci_ms`: [low, high], a 95 % bootstrap interval of the ITL p99 over requests.
`{group_}spec_accept_length`: tokens per speculative step (SGLang's `spec_accept_length`, over
the group's tokens); null on a server without speculative decoding.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from benchmarks.request_funcs import RequestOutput

LATENCIES = ("ttft", "itl", "e2e")
STATS = ("p50", "p99", "mean")
GROUPS = ("", "det_", "normal_")

# Keys present in every record, with their JSON types (None = may be null). `request_rate` is a
# number, or the string "inf" for all-at-once arrivals (JSON has no infinity).
REQUIRED_KEYS: dict[str, tuple[type, ...]] = {
    "dataset": (str,), "model": (str,), "config": (str,), "window_size": (int, type(None)),
    "verify_batch_size": (int, type(None)), "det_ratio": (float, int),
    "skip_compare": (bool, type(None)), "inject_mismatch_rate": (float, int, type(None)),
    "num_prompts": (int,), "request_rate": (float, int, str),
    "max_concurrency": (int, type(None)), "duration": (float, int, type(None)),
    "completed": (int,), "request_throughput": (float, int, type(None)),
    "input_throughput": (float, int, type(None)), "output_throughput": (float, int, type(None)),
    "total_throughput": (float, int, type(None)), "recompute_pct": (float, int, type(None)),
    "rollbacks": (int, type(None)), "verify_passes": (int, type(None)),
    "gpu": (str,), "git_commit": (str, type(None)),
    "command": (str,), "timestamp": (str,), "skipped": (bool,),
    "skip_reason": (str, type(None)),
}
for _g in GROUPS:
    for _lat in LATENCIES:
        for _s in ("p50", "p99"):
            REQUIRED_KEYS[f"{_g}{_lat}_{_s}_ms"] = (float, int, type(None))


def _ms_stats(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {s: None for s in STATS}
    arr = np.asarray(values, dtype=np.float64) * 1000.0
    return {"p50": float(np.percentile(arr, 50)), "p99": float(np.percentile(arr, 99)),
            "mean": float(arr.mean())}


def p99_interval(per_request: Sequence[Sequence[float]], *, confidence: float = 0.95,
                 n_resamples: int = 200, seed: int = 0) -> list[float] | None:
    """Bootstrap interval (ms) of the p99 of the pooled values, resampling whole requests.

    A request's inter-token latencies are correlated (they share its batch and its queueing), so
    resampling single values would understate how much a p99 moves between runs. None with fewer
    than two requests that have values."""
    import inspect

    from scipy.stats import bootstrap

    arrays = [np.asarray(a, dtype=np.float64) for a in per_request if len(a)]
    if len(arrays) < 2:
        return None

    def p99(index):
        return np.percentile(np.concatenate([arrays[int(i)] for i in index]), 99) * 1000.0

    rng = np.random.default_rng(seed)
    seeding = {"rng": rng} if "rng" in inspect.signature(bootstrap).parameters else {
        "random_state": rng}  # SciPy < 1.15
    res = bootstrap((np.arange(len(arrays)),), p99, vectorized=False, n_resamples=n_resamples,
                    confidence_level=confidence, method="percentile", **seeding)
    return [float(res.confidence_interval.low), float(res.confidence_interval.high)]


def latency_stats(outputs: Sequence[RequestOutput], prefix: str) -> dict:
    ok = [o for o in outputs if o.success]
    values = {"ttft": [o.ttft for o in ok], "itl": [x for o in ok for x in o.itl],
              "e2e": [o.latency for o in ok]}
    rec = {f"{prefix}{lat}_{s}_ms": v for lat in LATENCIES
           for s, v in _ms_stats(values[lat]).items()}
    rec[f"{prefix}itl_p99_ci_ms"] = p99_interval([o.itl for o in ok])
    rec[f"{prefix}spec_accept_length"] = spec_accept_length(ok)
    return rec


def spec_accept_length(outputs: Sequence[RequestOutput]) -> float | None:
    """Output tokens per speculative step over the requests that report SGLang's
    `spec_verify_ct` (its `spec_accept_length`, weighted by tokens); None when none does."""
    counted = [o for o in outputs if o.meta.get("spec_verify_ct")]
    if not counted:
        return None
    return sum(o.output_len for o in counted) / sum(int(o.meta["spec_verify_ct"]) for o in counted)


def summarize(outputs: Sequence[RequestOutput], is_det: Sequence[bool], *,
              prompt_lens: Sequence[int], duration_s: float) -> dict:
    """Throughput over the whole run and latency percentiles per group."""
    ok = [o for o in outputs if o.success]
    num_in = sum(n for n, o in zip(prompt_lens, outputs) if o.success)
    num_out = sum(o.output_len for o in ok)
    dur = max(duration_s, 1e-9)
    rec = {
        "duration": duration_s, "completed": len(ok), "failed": len(outputs) - len(ok),
        "total_input_tokens": num_in, "total_output_tokens": num_out,
        "request_throughput": len(ok) / dur, "input_throughput": num_in / dur,
        "output_throughput": num_out / dur, "total_throughput": (num_in + num_out) / dur,
        "det_completed": sum(1 for o, d in zip(outputs, is_det) if d and o.success),
        "normal_completed": sum(1 for o, d in zip(outputs, is_det) if not d and o.success),
    }
    rec.update(latency_stats(outputs, ""))
    rec.update(latency_stats([o for o, d in zip(outputs, is_det) if d], "det_"))
    rec.update(latency_stats([o for o, d in zip(outputs, is_det) if not d], "normal_"))
    rec["errors"] = sorted({o.error.strip().splitlines()[-1][:300] for o in outputs
                            if not o.success and o.error.strip()})[:5]
    return rec


def empty_summary() -> dict:
    """The metric keys of a run that did not happen (a skipped configuration), all null."""
    rec = {k: None for k in ("duration", "request_throughput", "input_throughput",
                              "output_throughput", "total_throughput")}
    rec.update(completed=0, failed=0, total_input_tokens=0, total_output_tokens=0,
               det_completed=0, normal_completed=0, errors=[])
    for g in GROUPS:
        for lat in LATENCIES:
            for s in STATS:
                rec[f"{g}{lat}_{s}_ms"] = None
        rec[f"{g}itl_p99_ci_ms"] = None
        rec[f"{g}spec_accept_length"] = None
    return rec


def schema_problems(rec: dict) -> list[str]:
    """Missing keys and keys of the wrong type ([] for a valid record)."""
    problems = [f"missing key {k!r}" for k in REQUIRED_KEYS if k not in rec]
    for key, types in REQUIRED_KEYS.items():
        if key in rec and not isinstance(rec[key], types):
            problems.append(f"{key!r} is {type(rec[key]).__name__} {rec[key]!r}, expected "
                            + " or ".join(t.__name__ for t in types))
        if key in rec and isinstance(rec[key], bool) and bool not in types:
            problems.append(f"{key!r} is a bool, expected a number")
    if rec.get("request_rate") is not None and isinstance(rec["request_rate"], str) and (
            rec["request_rate"] != "inf"):
        problems.append(f"'request_rate' string must be 'inf', got {rec['request_rate']!r}")
    return problems
