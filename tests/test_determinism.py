"""Decode-verify-rollback on a real SGLang CPU server: bitwise-identical deterministic outputs.

The test model is a bf16 random Llama on which the decode fast path and the verifier's extend pass
disagree now and then (natural rollbacks); injected mismatches force the rollback path on demand.
No retries anywhere: a retry would hide exactly the flake that matters.
"""

from __future__ import annotations

import pytest
import requests

from helpers import (
    PROMPTS,
    assert_same,
    background_requests,
    concurrently,
    det_request,
    generate,
    llm42_stats,
    sampling_cases,
    stream_chunks,
)

pytestmark = pytest.mark.server

CASES = sampling_cases(seed=1234)


NEW_TOKENS = 28




@pytest.mark.parametrize("case", CASES)
def test_alone_vs_concurrent_vs_batched(llm42_server, case):
    url = llm42_server.url
    refs = [det_request(url, p, NEW_TOKENS, **case) for p in PROMPTS]
    again = [det_request(url, p, NEW_TOKENS, **case) for p in PROMPTS]
    for p, r, a in zip(PROMPTS, refs, again):
        assert_same(r, a, f"repeat {p!r}")
    # the same requests among 30 normal requests of mixed lengths
    before = llm42_stats(url)
    loaded = concurrently(
        [lambda p=p: det_request(url, p, NEW_TOKENS, **case) for p in PROMPTS]
        + background_requests(url, 30)
    )[: len(PROMPTS)]
    for p, r, got in zip(PROMPTS, refs, loaded):
        assert_same(r, got, f"concurrent {p!r}")
    after = llm42_stats(url)
    # ... verified in SGLang's overlap loop, results in flight processed before each pass
    assert after["overlap_schedule"] is True, after
    assert after["verify_passes"] > before["verify_passes"], after
    assert after["early_results"] > before["early_results"], after
    # all in one batched /generate call
    batched = generate(url, PROMPTS, det=True, max_new_tokens=28,
                       temperature=case["temperature"], seed=case.get("seed"))
    for p, r, got in zip(PROMPTS, refs, batched):
        assert_same(r, got, f"batched {p!r}")


@pytest.mark.parametrize("case", CASES)
def test_streaming_matches_non_streaming(llm42_server, case):
    url = llm42_server.url
    for p in PROMPTS[:3]:
        ref = det_request(url, p, NEW_TOKENS, **case)
        got = concurrently(
            [lambda: det_request(url, p, NEW_TOKENS, stream=True, **case)]
            + background_requests(url, 12)
        )[0]
        assert_same(ref, got, f"streamed {p!r}")


def test_native_top_level_flag_is_a_deterministic_request(llm42_server, plain_server):
    """`"is_deterministic": true` at the top level of /generate (where the OpenAI routes take
    it) is verified like the field inside sampling_params, bitwise the same output, for each
    prompt of a batch; a bad or contradicting value is a 400 naming the field."""
    url = llm42_server.url
    sp = {"temperature": 0.8, "sampling_seed": 77, "max_new_tokens": 20}
    inside = generate(url, PROMPTS[:2], det=True, temperature=0.8, seed=77, max_new_tokens=20)
    body = {"text": PROMPTS[:2], "sampling_params": sp, "return_logprob": True,
            "is_deterministic": True}
    before = llm42_stats(url)["det_requests_finished"]
    out = requests.post(url + "/generate", json=body, timeout=300)
    assert out.status_code == 200, out.text
    top = [(o["output_ids"], [t[0] for t in o["meta_info"]["output_token_logprobs"]])
           for o in out.json()]
    assert top == [(ids, lps) for ids, lps, _ in inside]
    assert all("llm42_verify_passes" in o["meta_info"] for o in out.json())
    assert llm42_stats(url)["det_requests_finished"] == before + 2
    for value, sampling, where in ((True, {**sp, "is_deterministic": False}, "twice"),
                                   ("yes", sp, "must be a boolean")):
        bad = requests.post(url + "/generate", timeout=60, json={
            "text": PROMPTS[0], "sampling_params": sampling, "is_deterministic": value})
        assert bad.status_code == 400 and "is_deterministic" in bad.text and where in bad.text
    off = requests.post(plain_server.url + "/generate", timeout=60, json={
        "text": PROMPTS[0], "sampling_params": sp, "is_deterministic": True})
    assert off.status_code == 400 and "--enable-llm42" in off.text, off.text


def test_openai_endpoints_reproducible(llm42_server):
    url = llm42_server.url
    comp = {"model": "default", "prompt": PROMPTS[0], "max_tokens": 24, "temperature": 0.8,
            "seed": 99, "logprobs": 2, "is_deterministic": True}
    chat = {"model": "default", "messages": [{"role": "user", "content": PROMPTS[3]}],
            "max_tokens": 24, "temperature": 0.8, "seed": 5, "logprobs": True,
            "top_logprobs": 2, "is_deterministic": True}

    def run_completion():
        out = requests.post(url + "/v1/completions", json=comp, timeout=300).json()
        c = out["choices"][0]
        return c["text"], c["logprobs"], out["usage"]["completion_tokens"]

    def run_chat():
        out = requests.post(url + "/v1/chat/completions", json=chat, timeout=300).json()
        c = out["choices"][0]
        return c["message"]["content"], c["logprobs"], out["usage"]["completion_tokens"]

    ref_c, ref_chat = run_completion(), run_chat()
    loaded = concurrently([run_completion, run_chat] + background_requests(url, 20))
    assert loaded[0] == ref_c and loaded[1] == ref_chat
    # streamed chat: the concatenated deltas are the non-streamed text
    chunks = stream_chunks(url, "/v1/chat/completions", chat)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == ref_chat[0]


def test_injected_mismatches_roll_back_without_changing_output(llm42_server, inject_server):
    """Rate 0.5 forces rollbacks in about half of all windows; output is that of rate 0.

    inject_server also runs SGLang's normal event loop, llm42_server the overlap loop."""
    requests.post(inject_server.url + "/reset_llm42_stats", timeout=30)
    jobs = [(p, case) for case in (dict(temperature=0.0), dict(temperature=0.8, seed=77))
            for p in PROMPTS]

    def run_all(url):  # together: their outputs do not depend on it (the tests above)
        return concurrently([lambda p=p, c=c: det_request(url, p, NEW_TOKENS, **c)
                             for p, c in jobs])

    clean, faulty = run_all(llm42_server.url), run_all(inject_server.url)
    for (p, case), a, b in zip(jobs, clean, faulty):
        assert_same(a, b, f"injected {p!r} {case}")
    stats = llm42_stats(inject_server.url)
    assert stats["rollbacks"] > 0 and stats["injected_mismatches"] > 0, stats
    assert stats["overlap_schedule"] is False and stats["early_results"] == 0, stats
    assert stats["tokens_rolled_back"] > 0 and stats["recompute_pct"] > 0


def test_finish_inside_a_window(llm42_server):
    """max_new_tokens that is not a multiple of W, and stop strings, cut the last window short."""
    url = llm42_server.url
    for n in (1, 2, 9, 13):
        ids, lps, meta = det_request(url, PROMPTS[1], n)
        assert len(ids) == n == meta["completion_tokens"] and len(lps) == n
    ref = det_request(url, PROMPTS[2], 30)
    with_stop = generate(url, PROMPTS[2], det=True, max_new_tokens=30,
                         extra={"sampling_params": {"max_new_tokens": 30, "temperature": 0,
                                                    "is_deterministic": True,
                                                    "stop_token_ids": [ref[0][10]]}})
    assert with_stop[0] == ref[0][: ref[0].index(ref[0][10]) + 1]
