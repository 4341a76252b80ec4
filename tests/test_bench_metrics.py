"""One run -> one JSON record (`benchmarks/metrics.py`): the schema check and the p99
confidence interval.
"""

from __future__ import annotations

from bench_factories import result_row

from benchmarks.metrics import schema_problems


def test_schema_problems():
    assert schema_problems(result_row("nondet", 0.0, 10.0)) == []
    bad = result_row("nondet", 0.0, 10.0)
    del bad["gpu"]
    bad["completed"] = "6"
    bad["request_rate"] = "fast"
    problems = "\n".join(schema_problems(bad))
    assert "missing key 'gpu'" in problems and "'completed' is str" in problems
    assert "'request_rate' string must be 'inf'" in problems


def test_p99_interval_resamples_whole_requests():
    """The interval holds the pooled p99, is reproducible, narrows with more requests, and is
    wider than a resampling of single values would make it when requests differ."""
    import numpy as np

    from benchmarks.metrics import p99_interval

    rng = np.random.default_rng(1)
    # each request has its own level (its batch, its queueing): correlated values
    reqs = [rng.normal(level, 0.001, 50) for level in rng.uniform(0.005, 0.05, 40)]
    pooled = np.percentile(np.concatenate(reqs), 99) * 1000
    lo, hi = p99_interval(reqs)
    assert lo <= pooled <= hi and p99_interval(reqs) == [lo, hi]
    more = reqs * 8
    lo8, hi8 = p99_interval(more)
    assert hi8 - lo8 < hi - lo
    singles = [[x] for r in reqs for x in r]  # the same values as independent requests
    lo1, hi1 = p99_interval(singles)
    assert hi1 - lo1 < hi - lo
    assert p99_interval([[0.01, 0.02]]) is None and p99_interval([[], [0.01]]) is None
