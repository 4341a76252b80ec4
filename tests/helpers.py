"""Small HTTP helpers for the real-server tests (token ids + logprobs, compared bitwise)."""

from __future__ import annotations

import json
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from benchmarks.soak.plan import DET_PROMPTS

PROMPTS = DET_PROMPTS[:6]  # the soak's deterministic prompts


def sampling_cases(seed: int) -> list:
    """The two ways a deterministic request samples: greedy, and t = 0.8 with `seed`."""
    return [pytest.param(dict(temperature=0.0), id="greedy"),
            pytest.param(dict(temperature=0.8, seed=seed), id="t0.8-seeded")]


def generate(url: str, text, *, det: bool | None = True, max_new_tokens: int = 24,
             temperature: float = 0.0, seed: int | None = None, stream: bool = False,
             ignore_eos: bool = False, extra: dict | None = None, sampling: dict | None = None,
             timeout: float = 300):
    """Native /generate; returns (token_ids, logprobs, meta_info) per prompt. `sampling` adds
    sampling_params (top_p, top_k, min_p, ...)."""
    sp = {"temperature": temperature, "max_new_tokens": max_new_tokens, **(sampling or {})}
    if ignore_eos:
        sp["ignore_eos"] = True
    if det is not None:
        sp["is_deterministic"] = det
    if seed is not None:
        sp["sampling_seed"] = seed
    body = {"text": text, "sampling_params": sp, "return_logprob": True, "stream": stream,
            **(extra or {})}
    r = requests.post(url + "/generate", json=body, timeout=timeout, stream=stream)
    r.raise_for_status()
    if stream:
        last, ids = None, []
        for line in r.iter_lines():
            if not line or not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            last = json.loads(line[6:])
            assert "error" not in last, last
            ids = last["output_ids"]
        return _unpack(last, ids)
    out = r.json()
    if isinstance(out, list):
        return [_unpack(o, o["output_ids"]) for o in out]
    return _unpack(out, out["output_ids"])


def stream_chunks(url: str, path: str, body: dict, timeout: float = 300) -> list[dict]:
    """Every `data:` chunk of a streamed request to `path`, in order."""
    r = requests.post(url + path, json={**body, "stream": True}, stream=True, timeout=timeout)
    assert r.status_code == 200, r.text
    return [json.loads(line[6:]) for line in r.iter_lines()
            if line.startswith(b"data: ") and line != b"data: [DONE]"]


def det_request(url: str, prompt: str | list[int], max_new_tokens: int, **kw):
    """One deterministic request of `max_new_tokens`; `prompt` is a text or token ids; the other
    keywords as `generate`'s."""
    if isinstance(prompt, list):
        kw["extra"] = {"input_ids": prompt, **kw.get("extra", {})}
        prompt = None
    return generate(url, prompt, det=True, max_new_tokens=max_new_tokens, **kw)


def _unpack(out: dict, ids):
    meta = out["meta_info"]
    meta.setdefault("text", out.get("text"))  # the output text, for constraint checks
    lps = [t[0] for t in meta.get("output_token_logprobs", [])]
    return list(ids), lps, meta


def random_ids(seed: int, n: int) -> list[int]:
    """A prompt of n token ids (seeded), for lengths that text prompts cannot hit exactly."""
    rng = random.Random(seed)
    return [rng.randrange(100, 40_000) for _ in range(n)]


def llm42_stats(url: str) -> dict:
    return requests.get(url + "/llm42_stats", timeout=60).json()


def assert_same(ref, got, what: str) -> None:
    """Bitwise: token ids and logprobs of two (ids, logprobs, meta) results."""
    assert got[0] == ref[0], f"{what}: token ids differ\n{ref[0]}\n{got[0]}"
    assert got[1] == ref[1], f"{what}: logprobs differ (bitwise)"


def assert_prefix(ref, got, what: str) -> None:
    """An aborted request published a bitwise prefix of the solo output, logprobs included."""
    n = len(got[0])
    assert got[0] == ref[0][:n], f"{what}: published tokens are not a prefix of the solo output"
    assert got[1] == ref[1][:n], f"{what}: published logprobs are not the solo ones (bitwise)"


def assert_bitwise_everywhere(url, send, prompts, *, normal_traffic=(), batched=None,
                              inject_url=None):
    """The standard determinism check of a request kind: `send(url, prompt)` repeated, among
    `normal_traffic` (callables sent concurrently with it), `batched(url)` (one call giving a
    result per prompt), and on `inject_url` (a server forcing mismatches: rollbacks must happen),
    each bitwise equal to the prompt's first result. Returns (references, loaded results)."""
    refs = [send(url, p) for p in prompts]
    for p, r in zip(prompts, refs):
        assert_same(r, send(url, p), f"repeat {p!r}")
    loaded = concurrently([lambda p=p: send(url, p) for p in prompts]
                          + list(normal_traffic))[: len(prompts)]
    for p, r, got in zip(prompts, refs, loaded):
        assert_same(r, got, f"among normal traffic {p!r}")
    for p, r, got in zip(prompts, refs, batched(url) if batched else []):
        assert_same(r, got, f"batched {p!r}")
    if inject_url is not None:
        before = llm42_stats(inject_url)["rollbacks"]
        injected = concurrently([lambda p=p: send(inject_url, p) for p in prompts])
        for p, r, got in zip(prompts, refs, injected):
            assert_same(r, got, f"injected mismatches {p!r}")
        assert llm42_stats(inject_url)["rollbacks"] > before, "no rollback was forced"
    return refs, loaded


def natural_rollbacks_are_rare(results) -> None:
    """Fast path and verifier compute alike: at most one pass in three rolls back."""
    rollbacks = sum(r[2]["llm42_rollbacks"] for r in results)
    passes = sum(r[2]["llm42_verify_passes"] for r in results)
    assert 3 * rollbacks <= passes, (rollbacks, passes)


def concurrently(fns):
    with ThreadPoolExecutor(max_workers=len(fns)) as pool:
        futures = [pool.submit(f) for f in fns]
        return [f.result() for f in futures]


def background_requests(url: str, n: int = 30):
    """Normal (non-deterministic) requests of mixed prompt and output lengths."""
    fns = []
    for i in range(n):
        text = " ".join(PROMPTS[(i + j) % len(PROMPTS)] for j in range(1 + i % 4))
        fns.append(lambda t=text, k=i: generate(url, t, det=None, max_new_tokens=8 + 5 * (k % 7)))
    return fns


def is_gone(pid: int) -> bool:
    """Dead or a zombie (an orphaned child waits for init to reap it; it runs nothing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X")
