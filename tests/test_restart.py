"""Restart safety: a new server process with the same model and flags reproduces every
deterministic output bitwise, and its llm42 statistics start at zero.

The session `llm42_server` (which has served other tests before) stands for the server before
the restart; one more server is started with the very same flags for after it (the only extra
server start of this file). That start is also the suite's real-server check of
`llm42.server_process.SGLangServer`'s lifecycle (tests/test_server_process.py has the rest):
the launcher and its children come up, serve, and `stop()` leaves none of them alive.
"""

from __future__ import annotations

import pytest
import requests

from conftest import _llm42_args, _start
from helpers import PROMPTS, generate, is_gone, llm42_stats

pytestmark = pytest.mark.server

CASES = [dict(temperature=0.0), dict(temperature=0.8, seed=1234)]
COUNTERS = ("verify_passes", "verify_rows", "padded_rows", "verified_tokens", "rollbacks",
            "tokens_rolled_back", "injected_mismatches", "inconsistent_tokens",
            "det_requests_finished", "verify_time_s", "recompute_pct")


def _record(url):
    """Token ids + logprobs (top-2 too) of native and OpenAI deterministic requests."""
    out = {}
    for p in PROMPTS[:3]:
        for i, case in enumerate(CASES):
            ids, lps, meta = generate(url, p, det=True, max_new_tokens=20, extra={
                "top_logprobs_num": 2}, **case)
            out[("generate", p, i)] = (ids, lps, meta["output_top_logprobs"])
    chat = {"model": "default", "messages": [{"role": "user", "content": PROMPTS[3]}],
            "max_tokens": 16, "temperature": 0.8, "logprobs": True, "top_logprobs": 2,
            "is_deterministic": True}  # no seed: the default seed must be the same after it
    r = requests.post(url + "/v1/chat/completions", json=chat, timeout=300)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    out["chat"] = (choice["message"]["content"], choice["logprobs"])
    return out



def test_restarted_server_reproduces_outputs_and_starts_with_zero_stats(
        llm42_server, tiny_model, tmp_path_factory):
    before = _record(llm42_server.url)
    old_stats = llm42_stats(llm42_server.url)
    assert old_stats["verify_passes"] > 0 and old_stats["verified_tokens"] > 0, old_stats

    server = _start(tiny_model, _llm42_args(), "restarted", tmp_path_factory)
    pids: set[int] = set()
    try:
        # launcher (HTTP + tokenizer manager), scheduler, detokenizer
        pids = server.process_ids()
        assert len(pids) >= 3, f"expected the launcher and its children, saw {pids}"
        fresh = llm42_stats(server.url)
        for key in COUNTERS:
            assert fresh[key] == 0, f"{key} = {fresh[key]} on a freshly started server"
        assert {k: fresh[k] for k in ("window_size", "verify_batch_size",
                                      "inject_mismatch_rate")} == \
            {k: old_stats[k] for k in ("window_size", "verify_batch_size",
                                       "inject_mismatch_rate")}
        after = _record(server.url)
        for key, ref in before.items():
            assert after[key] == ref, f"{key}: output differs after a restart"
        stats = llm42_stats(server.url)
        assert stats["det_requests_finished"] == len(before)  # exactly this test's requests
    finally:
        pids |= server.process_ids()
        server.stop()
    alive = [pid for pid in pids if not is_gone(pid)]
    assert alive == [], f"processes left after stop(): {alive}\n{server.log_text()[-2000:]}"
    assert "Uvicorn running" in server.log_text() or "fired up" in server.log_text()
