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


def test_accept_length_weighs_requests_by_their_tokens_per_group():
    """Tokens per speculative step, over each group's tokens (SGLang's spec_accept_length of a
    request is its tokens / its steps); null without speculative decoding."""
    from benchmarks.metrics import summarize
    from benchmarks.request_funcs import RequestOutput

    def out(tokens, steps=None):
        meta = {"spec_verify_ct": steps} if steps else {}
        return RequestOutput(success=True, output_len=tokens, latency=1.0, ttft=0.1,
                             itl=[0.1] * (tokens - 1), meta=meta)

    rec = summarize([out(30, 10), out(10, 10), out(8, 2)], [True, True, False],
                    prompt_lens=[5, 5, 5], duration_s=1.0)
    assert rec["spec_accept_length"] == 48 / 22
    assert rec["det_spec_accept_length"] == 2.0 and rec["normal_spec_accept_length"] == 4.0
    plain = summarize([out(30)], [False], prompt_lens=[5], duration_s=1.0)
    assert plain["spec_accept_length"] is None and plain["det_spec_accept_length"] is None
