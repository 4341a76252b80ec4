"""Aborted and disconnected deterministic requests on a real SGLang CPU server.

Whatever state a deterministic request is in when it is aborted (waiting queue, before its first
window is verified, mid-window, right around a verification pass, after a rollback) it must free
everything (the autouse fixture: SGLang's strict idle leak check kills the scheduler on a leaked
KV slot), publish only verified tokens (a prefix of its solo output), leave /llm42_stats
consistent, and leave the deterministic requests running next to it bitwise unchanged.
Abort points are spread over streamed chunk counts and /abort_request delays; the delays come
from a seeded RNG, so the schedule is fixed while the timing on a loaded CPU still varies.
"""

from __future__ import annotations

import http.client
import json
import random
import socket
import threading
import time
from urllib.parse import urlparse

import pytest
import requests

from conftest import VERIFY_BATCH
from helpers import (
    PROMPTS,
    assert_prefix,
    assert_same,
    background_requests,
    concurrently,
    generate,
    llm42_stats,
)

pytestmark = pytest.mark.server

VICTIM_TOKENS = 24  # 3 windows (ignore_eos)



def _sp(case, max_new_tokens, **extra):
    sp = {"max_new_tokens": max_new_tokens, "temperature": case.get("temperature", 0.0),
          "is_deterministic": True, "ignore_eos": True, **extra}
    if case.get("seed") is not None:
        sp["sampling_seed"] = case["seed"]
    return sp


def _reference(url, prompt, case, max_new_tokens):
    return generate(url, prompt, det=True, max_new_tokens=max_new_tokens,
                    temperature=case.get("temperature", 0.0), seed=case.get("seed"),
                    extra={"sampling_params": _sp(case, max_new_tokens)})


def _unpack(out):
    meta = out["meta_info"]
    return list(out["output_ids"]), [t[0] for t in meta.get("output_token_logprobs", [])], meta


def _abort(url, rid):
    requests.post(url + "/abort_request", json={"rid": rid}, timeout=60)


# ------------------------------------------------------------------ victims


def stream_then_abort(url, prompt, case, rid, after_chunks=None, after_tokens=None,
                      max_new_tokens=VICTIM_TOKENS):
    """Stream; abort by rid after `after_chunks` chunks (SGLang sends one per decode step, the
    same verified tokens until the next pass) or once `after_tokens` tokens are published
    (right after a verification pass), then read the stream to its end."""
    body = {"text": prompt, "rid": rid, "stream": True, "return_logprob": True,
            "sampling_params": _sp(case, max_new_tokens)}
    last, seen, aborted = None, 0, False
    with requests.post(url + "/generate", json=body, stream=True, timeout=300) as r:
        assert r.status_code == 200, r.text
        for line in r.iter_lines():
            if not line.startswith(b"data: {"):
                continue
            last = json.loads(line[6:])
            assert "error" not in last, last
            seen += 1
            due = (after_chunks is not None and seen >= after_chunks) or (
                after_tokens is not None and len(last["output_ids"]) >= after_tokens)
            if due and not aborted:
                _abort(url, rid)
                aborted = True
    assert last is not None
    return _unpack(last)


def abort_after_delay(url, prompt, case, rid, delay):
    """Non-streaming request; /abort_request by rid after `delay` seconds."""
    timer = threading.Timer(delay, _abort, (url, rid))
    timer.start()
    try:
        r = requests.post(url + "/generate", json={
            "text": prompt, "rid": rid, "return_logprob": True,
            "sampling_params": _sp(case, VICTIM_TOKENS)}, timeout=300)
    finally:
        timer.join()
    assert r.status_code == 200, r.text
    return _unpack(r.json())


def disconnect_after(url, prompt, case, after_chunks, stream=True,
                     max_new_tokens=VICTIM_TOKENS):
    """Close the TCP connection after `after_chunks` streamed chunks (or, not streaming, after
    `after_chunks` tenths of a second): SGLang aborts the request on the disconnect."""
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
    body = json.dumps({"text": prompt, "stream": stream, "return_logprob": True,
                       "sampling_params": _sp(case, max_new_tokens)})
    conn.request("POST", "/generate", body=body, headers={"Content-Type": "application/json"})
    if stream:
        resp = conn.getresponse()
        assert resp.status == 200
        seen = 0
        while seen < after_chunks:
            line = resp.fp.readline()
            if not line:
                break
            seen += line.startswith(b"data: {")
    else:
        time.sleep(after_chunks / 10)
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()


# ------------------------------------------------------------------ checks



def _wait_idle(url, timeout=600):
    """Every aborted request must leave the scheduler (a disconnect that was not turned into an
    abort would keep decoding until VICTIM_TOKENS; the finished count below catches that)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        load = requests.get(url + "/get_load", timeout=30).json()
        loads = load if isinstance(load, list) else [load]
        if all(int(x.get("num_reqs", 0)) == 0 for x in loads):
            return
        time.sleep(0.2)
    pytest.fail(f"server not idle {timeout} s after the aborts")


def _check_stats(stats, num_finished, completed):
    """Counters of a server that only ran this test's requests since its last reset."""
    B = VERIFY_BATCH
    assert stats["verify_rows"] + stats["padded_rows"] == stats["verify_passes"] * B, stats
    assert stats["rollbacks"] <= stats["verify_rows"], stats
    assert stats["injected_mismatches"] <= stats["rollbacks"], stats
    assert stats["tokens_rolled_back"] >= stats["rollbacks"], stats
    assert stats["verified_tokens"] >= stats["verify_rows"], stats  # a pass commits >= 1 token
    assert stats["inconsistent_tokens"] == 0, f"verifier not reproducible: {stats}"
    done = stats["verified_tokens"] + stats["tokens_rolled_back"]
    assert stats["recompute_pct"] == pytest.approx(100.0 * stats["tokens_rolled_back"]
                                                   / max(1, done)), stats
    # Aborted requests never finish through verification; every completed one does.
    lo, hi = num_finished if isinstance(num_finished, tuple) else (num_finished, num_finished)
    assert lo <= stats["det_requests_finished"] <= hi, stats
    passes = sum(meta["llm42_verify_passes"] for _, _, meta in completed)
    rollbacks = sum(meta["llm42_rollbacks"] for _, _, meta in completed)
    assert passes <= stats["verify_rows"] and rollbacks <= stats["rollbacks"], stats


CASES = [dict(temperature=0.0), dict(temperature=0.8, seed=4242)]


def test_abort_storm_leaves_concurrent_deterministic_requests_bitwise_unchanged(
        inject_server):
    """Aborts in every state next to deterministic witnesses and normal traffic, on the server
    where half of all windows get a forced mismatch: rollbacks are frequent, so aborts also land
    right after rollbacks and between a rollback and the next verification."""
    url = inject_server.url
    rng = random.Random(42)
    keys = [(PROMPTS[2], 0), (PROMPTS[3], 1)]  # greedy, seeded t = 0.8
    refs = {(p, i): _reference(url, p, CASES[i], VICTIM_TOKENS) for p, i in keys}
    assert requests.post(url + "/reset_llm42_stats", timeout=60).json()["success"]

    def job(kind, key, arg=None, n=0):
        (p, i), rid = key, f"llm42-storm-{kind}-{n}"
        if kind == "witness":
            return lambda: (kind, key, _reference(url, p, CASES[i], VICTIM_TOKENS))
        if kind == "chunks":
            return lambda: (kind, key, stream_then_abort(url, p, CASES[i], rid, after_chunks=arg))
        if kind == "tokens":
            return lambda: (kind, key, stream_then_abort(url, p, CASES[i], rid, after_tokens=arg))
        if kind == "delay":
            return lambda: (kind, key, abort_after_delay(url, p, CASES[i], rid, arg))
        stream = kind == "disconnect"  # else "disconnect-unstreamed"
        return lambda: (kind, key, disconnect_after(url, p, CASES[i], arg, stream=stream))

    jobs = [job("witness", keys[0]), job("witness", keys[1])]
    # (a)/(b)/(c) abort after k streamed chunks (decode steps): k = 1 sees o_0 only, before the
    # first window is verified; then at varied points inside windows
    jobs += [job("chunks", keys[n % 2], k, n) for n, k in enumerate((1, 4, 9))]
    # (c) abort right after a verification pass published t tokens: t = 1 (o_0, the prefill),
    # 9 (first window); the abort lands in the next window or its pass
    jobs += [job("tokens", keys[n % 2], t, n) for n, t in enumerate((1, 9), start=1)]
    # (a)/(c) abort by rid after random small delays: queued, prefilled, mid-window, in a pass
    delays = [0.0, 0.02] + [rng.uniform(0.0, 1.0) for _ in range(3)]
    jobs += [job("delay", keys[n % 2], d, n) for n, d in enumerate(delays)]
    # (d) client disconnects: streaming after k chunks, not streaming after k tenths of a second
    jobs += [job("disconnect", keys[0], 1), job("disconnect", keys[1], 4),
             job("disconnect-unstreamed", keys[1], 2)]
    jobs += [lambda f=f: ("normal", None, f()) for f in background_requests(url, 3)]
    rng.shuffle(jobs)
    results = concurrently(jobs)
    _wait_idle(url)

    completed, num_aborted = [], 0
    for kind, key, out in results:
        if kind == "witness":
            assert_same(refs[key], out, f"witness {key} next to aborts")
            completed.append(out)
        elif kind in ("chunks", "tokens", "delay"):
            ids, lps, meta = out
            assert_prefix(refs[key], out, f"{kind} victim {key}")
            assert len(lps) == len(ids) == meta["completion_tokens"]
            if meta["finish_reason"]["type"] == "abort":
                num_aborted += 1
            else:  # the abort came too late: the request completed, verified, as when alone
                assert_same(refs[key], out, f"{kind} victim {key} not aborted")
                completed.append(out)
    assert num_aborted >= 1, "no request was aborted at all"
    # a disconnect noticed only after the last window completes the request (strict check:
    # test_client_disconnect_aborts)
    _check_stats(llm42_stats(url), (len(completed), len(completed) + 3), completed)

    # the server still serves deterministic requests exactly as before
    p, i = keys[1]
    assert_same(refs[keys[1]], _reference(url, p, CASES[i], VICTIM_TOKENS), "after the aborts")


def test_abort_mid_window_frees_everything(llm42_server):
    """(b) One deterministic request aborted mid-window: no KV left behind (autouse fixture),
    what it published is exactly the solo output of that length, and the server serves
    reproducibly after it."""
    url = llm42_server.url
    got = stream_then_abort(url, PROMPTS[0], CASES[0], "llm42-abort-me", after_tokens=10,
                            max_new_tokens=400)  # published o_0 + window 1: inside window 2
    assert got[2]["finish_reason"]["type"] == "abort"
    assert 0 < len(got[0]) < 400
    _wait_idle(url)
    ref = _reference(url, PROMPTS[0], CASES[0], len(got[0]))
    assert_same(ref, got, "aborted mid-window vs solo of that length")
    assert_same(ref, _reference(url, PROMPTS[0], CASES[0], len(got[0])), "after abort")


def test_client_disconnect_aborts(llm42_server):
    """(d) Closing a stream's connection aborts the deterministic request behind it (SGLang
    turns the disconnect into an abort); only the request that kept its connection finishes,
    bitwise as when alone. (Non-streaming requests notice a disconnect only every few seconds;
    the storm above has one.)"""
    url = llm42_server.url
    ref = _reference(url, PROMPTS[1], CASES[1], VICTIM_TOKENS)
    assert requests.post(url + "/reset_llm42_stats", timeout=60).json()["success"]
    out = concurrently([
        lambda: _reference(url, PROMPTS[1], CASES[1], VICTIM_TOKENS),
        lambda: disconnect_after(url, PROMPTS[4], CASES[0], 1, max_new_tokens=400),
        lambda: disconnect_after(url, PROMPTS[5], CASES[1], 5, max_new_tokens=400),
    ])[0]
    _wait_idle(url)
    assert_same(ref, out, "next to disconnects")
    _check_stats(llm42_stats(url), 1, [out])  # a disconnected request that ran on would count


def test_abort_every_queued_deterministic_request(llm42_server):
    """(a) A burst of deterministic requests (their prefills run one at a time, so most of them
    wait in the queue) aborted at once with abort_all; then the same requests run normally."""
    url = llm42_server.url
    ref = _reference(url, PROMPTS[5], CASES[1], 24)

    def one(i):
        r = requests.post(url + "/generate", json={
            "text": PROMPTS[5], "rid": f"llm42-queued-{i}", "return_logprob": True,
            "sampling_params": _sp(CASES[1], 24)}, timeout=300)
        assert r.status_code == 200, r.text
        return _unpack(r.json())

    def abort_all():
        time.sleep(0.05)
        requests.post(url + "/abort_request", json={"rid": "", "abort_all": True}, timeout=60)
        return None

    outs = concurrently([lambda i=i: one(i) for i in range(8)] + [abort_all])[:-1]
    assert any(o[2]["finish_reason"]["type"] == "abort" for o in outs), "nothing was aborted"
    for o in outs:
        assert_prefix(ref, o, "queued victim")
    _wait_idle(url)
    again = concurrently([lambda i=i: one(100 + i) for i in range(4)])
    for o in again:
        assert_same(ref, o, "after abort_all")
