"""Custom logit processors on deterministic requests (CPU server, SGLang's own no-repeat n-gram
processor, which reads the request's prompt and output ids).

The verifier replays the processor at each position with the output ids before it
(`llm42.sglang.custom_processors`). Were it handed the live request (all candidates of the
window), it would ban the very tokens it verifies: every window would roll back and the output
would change, which the natural-rollback bound and the bitwise comparisons below catch.
"""

from __future__ import annotations

import pytest

from helpers import (
    PROMPTS,
    assert_bitwise_everywhere,
    generate,
    natural_rollbacks_are_rare,
)

pytestmark = pytest.mark.server

PROMPTS4 = PROMPTS[:4]
CASES = [pytest.param(dict(temperature=0.0), id="greedy"),
         pytest.param(dict(temperature=0.8, seed=21), id="t0.8-seeded")]


def _processor() -> str:
    from sglang.srt.sampling.custom_logit_processor import (
        DeepseekOCRNoRepeatNGramLogitProcessor,
    )

    return DeepseekOCRNoRepeatNGramLogitProcessor.to_str()


def _send(url, prompt, case, processor=True, det=True):
    extra = ({"custom_logit_processor": _processor()} if processor else {})
    sampling = {"custom_params": {"ngram_size": 1, "window_size": 4096}} if processor else {}
    return generate(url, prompt, det=det, max_new_tokens=24, extra=extra, sampling=sampling,
                    **case)


def _normal_traffic(url, n):
    return [lambda i=i: _send(url, PROMPTS[i % len(PROMPTS)], dict(temperature=0.9),
                              processor=i % 2 == 0, det=None) for i in range(n)]


@pytest.mark.parametrize("case", CASES)
def test_processor_bitwise_alone_loaded_batched_and_injected(llm42_server, inject_server, case):
    url = llm42_server.url
    refs, loaded = assert_bitwise_everywhere(
        url, lambda url, p: _send(url, p, case), PROMPTS4,
        normal_traffic=_normal_traffic(url, 10),
        batched=lambda url: _send(url, PROMPTS4, case),
        inject_url=inject_server.url)
    for p, r in zip(PROMPTS4, refs):  # ngram_size 1: no output token repeats
        assert len(set(r[0])) == len(r[0]), f"{p!r}: a banned token was emitted {r[0]}"
    if case["temperature"] == 0:  # the tiny model repeats itself greedily, rarely when sampling
        plain = [_send(url, p, case, processor=False) for p in PROMPTS4]
        assert any(a[0] != b[0] for a, b in zip(refs, plain)), "the processor had no effect"
    natural_rollbacks_are_rare(loaded)


def test_openai_completion_with_a_processor_and_its_params(llm42_server):
    """`custom_params` of an OpenAI request keep their keys next to llm42's flag."""
    import requests

    from helpers import concurrently

    url = llm42_server.url
    body = {"model": "default", "prompt": PROMPTS[4], "max_tokens": 24, "temperature": 0.8,
            "seed": 3, "logprobs": 1, "is_deterministic": True,
            "custom_logit_processor": _processor(),
            "custom_params": {"ngram_size": 1, "window_size": 4096}}

    def complete(processor=True):
        r = requests.post(url + "/v1/completions", timeout=300,
                          json=body if processor else {**body, "custom_params": None,
                                                       "custom_logit_processor": None})
        assert r.status_code == 200, r.text
        lp = r.json()["choices"][0]["logprobs"]
        return lp["tokens"], lp["token_logprobs"]

    ref = complete()
    assert len(set(ref[0])) == len(ref[0]), ref[0]
    assert ref != complete(processor=False), "the processor had no effect"
    loaded = concurrently([complete] + _normal_traffic(url, 8))
    assert loaded[0] == ref
