"""n > 1 on deterministic requests: sample i is the request with seed + i (`parallel_samples`).

Each sample must equal, bitwise, the same request sent alone with n = 1 and the derived seed
(42 + i without a seed): that pins the documented rule, and shows the samples differ from each
other and are reproducible. Compared alone, among normal traffic, in a batched call and on the
server that forces a mismatch in half of all windows.
"""

from __future__ import annotations

import pytest
import requests

from helpers import PROMPTS, assert_same, background_requests, concurrently, generate, llm42_stats
from llm42.sglang.parallel_samples import sample_seed

N = 3
PROMPTS2 = PROMPTS[:2]


def _samples(url, prompt, seed, n=N, **kw):
    return generate(url, prompt, det=True, max_new_tokens=16, temperature=0.8, seed=seed,
                    sampling={"n": n}, **kw)


def _alone(url, prompt, seed):
    return generate(url, prompt, det=True, max_new_tokens=16, temperature=0.8, seed=seed)


def test_sample_seed_rule():
    assert [sample_seed(5, i) for i in range(3)] == [5, 6, 7]
    assert sample_seed(None, 1) == 43  # SGLang's default seed 42
    assert sample_seed(2**63 - 1, 1) == -(2**63)  # wraps inside int64


@pytest.mark.server
def test_n_samples_are_seed_plus_i_bitwise_alone_loaded_batched_and_injected(llm42_server,
                                                                            inject_server):
    url = llm42_server.url
    refs = {p: [_alone(url, p, 5 + i) for i in range(N)] for p in PROMPTS2}
    for p in PROMPTS2:
        assert len({tuple(r[0]) for r in refs[p]}) == N, "the samples must differ"
        for i, got in enumerate(_samples(url, p, 5)):
            assert_same(refs[p][i], got, f"{p!r} sample {i} vs seed {5 + i} alone")
    no_seed = _samples(url, PROMPTS2[0], None, n=2)
    for i, got in enumerate(no_seed):
        assert_same(_alone(url, PROMPTS2[0], 42 + i), got, f"unseeded sample {i} vs seed 42+{i}")

    loaded = concurrently([lambda p=p: _samples(url, p, 5) for p in PROMPTS2]
                          + background_requests(url, 12))[: len(PROMPTS2)]
    batched = generate(url, PROMPTS2, det=True, max_new_tokens=16, temperature=0.8, seed=5,
                       sampling={"n": N})  # prompt-major: p0 s0..s2, p1 s0..s2
    before = llm42_stats(inject_server.url)["rollbacks"]
    injected = concurrently([lambda p=p: _samples(inject_server.url, p, 5) for p in PROMPTS2])
    for k, p in enumerate(PROMPTS2):
        for i in range(N):
            assert_same(refs[p][i], loaded[k][i], f"among normal traffic {p!r} sample {i}")
            assert_same(refs[p][i], batched[k * N + i], f"batched {p!r} sample {i}")
            assert_same(refs[p][i], injected[k][i], f"injected mismatches {p!r} sample {i}")
    assert llm42_stats(inject_server.url)["rollbacks"] > before


@pytest.mark.server
def test_openai_n_choices_differ_and_reproduce(llm42_server):
    body = {"model": "default", "prompt": PROMPTS[0], "max_tokens": 12, "temperature": 0.8,
            "seed": 9, "n": 2, "is_deterministic": True}
    runs = []
    for _ in range(2):
        r = requests.post(llm42_server.url + "/v1/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
        runs.append([c["text"] for c in sorted(r.json()["choices"], key=lambda c: c["index"])])
    assert runs[0] == runs[1], "every choice reproduces"
    assert runs[0][0] != runs[0][1], "the choices are different samples"
