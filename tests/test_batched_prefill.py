"""`--llm42-batched-prefill`: deterministic prefills run on the fast path next to other requests
and their prompts are verified afterwards in fixed-shape passes (`planner.build_prompt_rows`).

The server also injects mismatches into a fifth of all windows, prompt passes included, so o_0
itself is rolled back now and then; every output must still be bitwise that of the request alone.
"""

from __future__ import annotations

import pytest
import requests

from benchmarks.timeline import load_segments
from conftest import CHUNK, SOLO_MIN, VERIFY_BATCH, WINDOW, wait_idle_and_healthy
from helpers import (
    PROMPTS,
    assert_prefix,
    assert_same,
    background_requests,
    concurrently,
    det_request,
    generate,
    llm42_stats,
    random_ids,
    sampling_cases,
)

pytestmark = pytest.mark.server

CASES = sampling_cases(seed=99)
# Longer than one B x W pass: the prompt's rows span several passes.
LONG_PROMPT = " ".join(PROMPTS) * 2


@pytest.mark.parametrize("case", CASES)
def test_alone_concurrent_batched_identical(batched_server, case):
    url = batched_server.url
    prompts = PROMPTS + [LONG_PROMPT]
    before = llm42_stats(url)
    refs = [det_request(url, p, 20, **case) for p in prompts]
    loaded = concurrently(
        [lambda p=p: det_request(url, p, 20, **case) for p in prompts]
        + background_requests(url, 24)
    )[: len(prompts)]
    batched = generate(url, prompts, det=True, max_new_tokens=20, **case)
    streamed = concurrently(  # streams must never carry o_0 before its prompt pass
        [lambda p=p: det_request(url, p, 20, stream=True, **case) for p in prompts[:3]]
        + background_requests(url, 8))[:3]
    for p, ref, got, bat in zip(prompts, refs, loaded, batched):
        assert_same(ref, got, f"concurrent {p[:30]!r}")
        assert_same(ref, bat, f"batched {p[:30]!r}")
    for p, ref, got in zip(prompts, refs, streamed):
        assert_same(ref, got, f"streamed {p[:30]!r}")
    after = llm42_stats(url)
    # No deterministic prefill ran alone; prompt passes did, and rolled back now and then.
    assert after["steps_det_prefill"] == before["steps_det_prefill"], after
    assert after["verify_passes"] > before["verify_passes"]
    assert after["prompt_rows"] >= before["prompt_rows"] + 3 * len(prompts), after
    assert after["injected_mismatches"] > before["injected_mismatches"], after
    # Passes were queued behind the decode step in flight, its result processed while they ran
    # (--llm42-overlap-verify), and the outputs above are still the request's own.
    assert after["overlapped_passes"] > before["overlapped_passes"], after
    wait_idle_and_healthy(batched_server)  # idle: the step timeline is flushed
    stats = llm42_stats(url)  # the timeline's last segment runs from the last stats reset
    segment = load_segments(stats["timeline"])[-1]
    assert sum(r["passes"] for r in segment) == stats["verify_passes"]
    assert sum(r["overlapped"] for r in segment) == stats["overlapped_passes"]


def test_prompt_spans_passes_and_short_outputs(batched_server):
    """A prompt of more than B x W tokens; outputs of 1 and 2 tokens finish on o_0 / o_1, which
    wait for the prompt pass."""
    url = batched_server.url
    assert len(LONG_PROMPT.split()) > VERIFY_BATCH * WINDOW
    for n in (1, 2, 9):
        ref = det_request(url, LONG_PROMPT, n)
        assert len(ref[0]) == n == len(ref[1])
        got = concurrently([lambda: det_request(url, LONG_PROMPT, n)]
                           + background_requests(url, 8))[0]
        assert_same(ref, got, f"{n} tokens")


def test_prompt_logprob_requests_still_prefill_alone(batched_server):
    """Prompt logprobs come from the prefill, which the prompt pass does not replace."""
    url = batched_server.url
    extra = {"logprob_start_len": 0}
    before = llm42_stats(url)["steps_det_prefill"]
    ref = generate(url, PROMPTS[1], det=True, max_new_tokens=12, extra=extra)
    got = concurrently([lambda: generate(url, PROMPTS[1], det=True, max_new_tokens=12,
                                         extra=extra)] + background_requests(url, 8))[0]
    assert_same(ref, got, "with prompt logprobs")
    assert ref[2]["input_token_logprobs"] == got[2]["input_token_logprobs"]
    assert llm42_stats(url)["steps_det_prefill"] >= before + 2


def test_prompts_longer_than_a_prefill_chunk(batched_server):
    """A prompt of several --chunked-prefill-size chunks, prefilled in batches (prompt pass
    after) or alone (it asks for prompt logprobs). Each chunk must start where the last one
    ended although deterministic KV never enters the prefix cache: the first chunk once ran
    again and again until the KV pool was full."""
    url = batched_server.url
    tokens = requests.post(url + "/generate", json={
        "text": LONG_PROMPT, "sampling_params": {"max_new_tokens": 1}}, timeout=60,
    ).json()["meta_info"]["prompt_tokens"]
    assert tokens > 2 * CHUNK, tokens
    for extra in (None, {"logprob_start_len": 0}):
        ref = generate(url, LONG_PROMPT, det=True, max_new_tokens=12, extra=extra)
        got = concurrently([lambda e=extra: generate(url, LONG_PROMPT, det=True,
                                                     max_new_tokens=12, extra=e)]
                           + background_requests(url, 8))[0]
        assert_same(ref, got, f"chunked prompt, extra={extra}")
        if extra:
            assert len(ref[2]["input_token_logprobs"]) == tokens
            assert ref[2]["input_token_logprobs"] == got[2]["input_token_logprobs"]


def test_long_prompts_prefill_alone_short_ones_share_batches(batched_server):
    """A prompt of SOLO_MIN tokens or more (`--llm42-solo-prefill-min-tokens`) prefills alone,
    chunk by chunk, and no prompt pass recomputes it; a short prompt of the same burst is still
    prefilled in a shared batch and verified by a prompt pass. Each path is a function of the
    request alone: both give bitwise their output alone, under load and mixed together."""
    url = batched_server.url
    long_ids = random_ids(11, SOLO_MIN + 20)
    below_ids = random_ids(12, SOLO_MIN - 1)

    def run(ids):
        return generate(url, None, det=True, max_new_tokens=12, extra={"input_ids": ids})

    before = llm42_stats(url)
    ref_long = run(long_ids)
    mid = llm42_stats(url)
    assert mid["prompt_rows"] == before["prompt_rows"], "a long prompt got prompt rows"
    assert mid["steps_det_prefill"] >= before["steps_det_prefill"] + -(-len(long_ids) // CHUNK)
    ref_below = run(below_ids)
    after = llm42_stats(url)
    assert after["steps_det_prefill"] == mid["steps_det_prefill"], "one token short: batched"
    assert after["prompt_rows"] >= mid["prompt_rows"] + -(-len(below_ids) // WINDOW), after
    ref_short = det_request(url, PROMPTS[0], 12)
    outs = concurrently([lambda: run(long_ids), lambda: run(below_ids),
                         lambda: det_request(url, PROMPTS[0], 12)] + background_requests(url, 8))
    for ref, got, what in zip((ref_long, ref_below, ref_short), outs, ("long", "below", "short")):
        assert_same(ref, got, f"{what} prompt under load")


def test_abort_all_mid_prompt_pass_leaks_nothing(batched_server):
    """Aborts land before, during and after the prompt passes of a burst of requests."""
    import time

    url = batched_server.url
    ref = det_request(url, PROMPTS[3], 16)

    def one(i):
        return det_request(url, PROMPTS[3], 16)

    def abort_all():
        time.sleep(0.3)
        requests.post(url + "/abort_request", json={"rid": "", "abort_all": True}, timeout=60)

    outs = concurrently([lambda i=i: one(i) for i in range(6)] + [abort_all])[:-1]
    assert any(o[2]["finish_reason"]["type"] == "abort" for o in outs), "nothing was aborted"
    for out in outs:  # an aborted request publishes a verified prefix
        assert_prefix(ref, out, "aborted")
    wait_idle_and_healthy(batched_server)
    assert_same(ref, det_request(url, PROMPTS[3], 16), "after abort_all")
