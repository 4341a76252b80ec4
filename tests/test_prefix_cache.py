"""`--llm42-prefix-cache` (on batched_server): deterministic requests share verified prompt KV
through SGLang's radix tree, in whole rows of W tokens; a hit gives bitwise the output of a miss.

Fast-path prefills are perturbed on this server (random KV noise on what they write), so a hit
that reused unverified KV, or a prompt pass that rewrote shared rows, would show in the outputs.
"""

from __future__ import annotations

import pytest
import requests

from conftest import WINDOW, wait_idle_and_healthy
from helpers import (
    assert_same,
    background_requests,
    concurrently,
    det_request,
    llm42_stats,
    sampling_cases,
)
from helpers import random_ids as _ids

pytestmark = pytest.mark.server

CASES = sampling_cases(seed=5)


def _flush(server) -> None:
    wait_idle_and_healthy(server)
    r = requests.post(server.url + "/flush_cache", timeout=30)
    assert r.status_code == 200, r.text


def _cached(url) -> int:
    stats = llm42_stats(url)
    assert stats["prefix_cache"] is True and stats["batched_prefill"] is True
    return stats["cached_prompt_tokens"]


@pytest.mark.parametrize("case", CASES)
def test_hit_gives_the_output_of_a_miss(batched_server, case):
    url = batched_server.url
    shared = _ids(1, 3 * WINDOW + 3)  # 3 whole rows, then 3 tokens of the 4th
    a = shared + _ids(2, 10)  # P = 37: publishes rows [0, 32)
    b = shared + _ids(3, 6)  # P = 33: shares 27 tokens with a, i.e. 3 whole rows
    _flush(batched_server)
    before = _cached(url)
    miss = det_request(url, b, 20, **case)
    assert _cached(url) == before, "nothing was published before b"
    _flush(batched_server)
    det_request(url, a, 20, **case)

    before = _cached(url)
    # matches 27 tokens of a's rows: cut to the row boundary
    partial = det_request(url, b, 20, **case)
    assert _cached(url) - before == 3 * WINDOW
    assert_same(miss, partial, "hit of a's first 3 rows")

    before = _cached(url)
    full = concurrently([lambda: det_request(url, b, 20, **case)] + background_requests(url, 8))[0]
    assert _cached(url) - before == 4 * WINDOW, "b's own 4 rows (P - 1 = 32 may match)"
    assert_same(miss, full, "hit of b's own rows, under load")


def test_concurrent_requests_with_one_prompt(batched_server):
    """Requests of one prompt that race to publish the same rows: duplicates are freed, every
    output is the miss's, and nothing leaks (the autouse check)."""
    url = batched_server.url
    prompt = _ids(4, 5 * WINDOW + 1)
    _flush(batched_server)
    miss = det_request(url, prompt, 20)
    _flush(batched_server)
    outs = concurrently([lambda: det_request(url, prompt, 20) for _ in range(6)]
                        + background_requests(url, 6))
    for i, got in enumerate(outs[:6]):
        assert_same(miss, got, f"concurrent copy {i}")


def test_flag_needs_batched_prefill_and_the_radix_cache():
    from llm42.core import Llm42Config

    with pytest.raises(ValueError, match="--no-llm42-batched-prefill"):
        Llm42Config(prefix_cache=True, batched_prefill=False,
                    verifier="fixed-shape").validate()
    Llm42Config(prefix_cache=True, verifier="fixed-shape").validate()  # batched by default
    # row-invariant prompt rows verify a solo prefill too: nothing to refuse
    Llm42Config(prefix_cache=True, batched_prefill=False, verifier="row-invariant").validate()


def test_rows_are_shared_only_under_one_cache_salt(batched_server):
    """SGLang's `extra_key` (cache salt; LoRA adds its adapter id, tests/test_det_lora.py)
    stays part of the namespace: another salt misses, the same salt hits."""
    url = batched_server.url
    prompt = _ids(6, 4 * WINDOW + 1)
    _flush(batched_server)
    ref = det_request(url, prompt, 12, extra={"extra_key": "tenant-a"})
    before = _cached(url)
    other = det_request(url, prompt, 12, extra={"extra_key": "tenant-b"})
    assert _cached(url) == before, "tenant-b was served tenant-a's verified rows"
    same = det_request(url, prompt, 12, extra={"extra_key": "tenant-a"})
    assert _cached(url) - before == 4 * WINDOW
    assert_same(ref, other, "another salt")
    assert_same(ref, same, "a hit under the same salt")
