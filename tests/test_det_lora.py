"""LoRA on deterministic requests (CPU server, SGLang's torch-native LoRA backend).

A verification row runs with its request's adapter: SGLang derives a forward's adapters from the
batch's requests, and each pass row carries its request. If the verifier ran a row without its
adapter (or with another row's), the verifier's token would win every window and the output
would become the base model's: so every adapter's output is checked to differ from the base
model's and from the other adapter's. The server (`batched_server`) forces a mismatch in a fifth
of all windows and perturbs every fast-path prefill, so each output below also went through
rollbacks and prompt passes; prompt KV is verified and shared through the prefix cache, which
must keep adapters apart.
"""

from __future__ import annotations

import json

import pytest
import requests

from helpers import (
    PROMPTS,
    assert_bitwise_everywhere,
    assert_same,
    concurrently,
    generate,
    llm42_stats,
)

pytestmark = pytest.mark.server

ADAPTERS = [None, "a", "b"]
SEEDED = {"temperature": 0.8, "seed": 3}


def _det(url, prompt, lora, max_new_tokens=20, **kw):
    kw = kw or SEEDED
    return generate(url, prompt, det=True, max_new_tokens=max_new_tokens,
                    extra={} if lora is None else {"lora_path": lora}, **kw)


def _normal_traffic(url, n):
    return [lambda i=i: generate(url, PROMPTS[i % len(PROMPTS)], det=None, temperature=0.9,
                                 max_new_tokens=8 + 3 * (i % 5),
                                 extra={} if ADAPTERS[i % 3] is None
                                 else {"lora_path": ADAPTERS[i % 3]})
            for i in range(n)]


def test_adapters_bitwise_alone_loaded_batched_and_through_rollbacks(batched_server):
    url = batched_server.url
    before = llm42_stats(url)["rollbacks"]
    prompts = PROMPTS[:2]
    cases = [(p, lora) for p in prompts for lora in ADAPTERS]
    refs, _ = assert_bitwise_everywhere(
        url, lambda url, case: _det(url, *case), cases,
        normal_traffic=_normal_traffic(url, 12),  # of every adapter
        batched=lambda url: generate(url, [p for p, _ in cases], det=True, max_new_tokens=20,
                                     extra={"lora_path": [lora for _, lora in cases]},
                                     **SEEDED))
    for i in range(0, len(cases), len(ADAPTERS)):  # per prompt: base, a, b
        base, a, b = (r[0] for r in refs[i : i + len(ADAPTERS)])
        assert a != base and b != base and a != b, f"an adapter had no effect on {cases[i][0]!r}"
    assert llm42_stats(url)["rollbacks"] > before, "no rollback was exercised"


def test_greedy_streamed_and_openai(batched_server):
    url = batched_server.url
    prompt = PROMPTS[2]
    for lora in ("a", "b"):
        ref = _det(url, prompt, lora, temperature=0.0)
        streamed = generate(url, prompt, det=True, max_new_tokens=20, temperature=0.0,
                            stream=True, extra={"lora_path": lora})
        assert_same(ref, streamed, f"streamed {lora}")
    body = {"prompt": prompt, "max_tokens": 20, "temperature": 0.8, "seed": 4, "logprobs": 1,
            "is_deterministic": True}

    def completion(model):
        r = requests.post(url + "/v1/completions", json={**body, "model": model}, timeout=300)
        assert r.status_code == 200, r.text
        c = r.json()["choices"][0]
        return c["text"], c["logprobs"]["token_logprobs"]

    ref = {m: completion(m) for m in ("default", "default:a", "default:b")}
    assert len({json.dumps(v) for v in ref.values()}) == 3, "an adapter had no effect"
    loaded = concurrently([lambda m=m: completion(m) for m in ref] + _normal_traffic(url, 8))
    assert loaded[: len(ref)] == list(ref.values())


def test_prefix_cache_keeps_adapters_apart(batched_server):
    """Verified prompt rows are shared through the radix tree under a key that keeps the
    adapter: one adapter's prompt KV must never serve another's request."""
    url = batched_server.url
    prompt = " ".join(PROMPTS[3:6])  # several whole W = 8 rows
    fresh = {}
    for lora in ADAPTERS:
        assert requests.post(url + "/flush_cache", timeout=60).status_code == 200
        fresh[lora] = _det(url, prompt, lora)
    before = llm42_stats(url)["cached_prompt_tokens"]
    for lora in ADAPTERS:  # each after the others published their rows of the same prompt
        assert_same(fresh[lora], _det(url, prompt, lora), f"after other adapters ({lora})")
    assert llm42_stats(url)["cached_prompt_tokens"] > before, "the cache was never hit"
