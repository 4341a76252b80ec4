"""A seeded deterministic request must not roll back because of the *kind* of its batch mates.

SGLang's sampler picks its code path from batch-wide flags: one greedy (top_k=1) or top-p row
sends the whole decode batch through the sorted top-k/top-p sampler, where seeded noise is drawn
by rank instead of by vocabulary index. The verifier samples each row as in a batch of its own
kind, so without llm42's per-kind sampling a seeded temperature > 0 request next to such rows
rolled back at almost every token (outputs stayed exact; the recompute was the cost).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from helpers import PROMPTS, det_request, generate, llm42_stats

pytestmark = pytest.mark.server

PROMPT = PROMPTS[3]
DET_TOKENS = 32  # 4 windows of W = 8
MATE_TOKENS = 900  # the mates outlive the deterministic request's decode; aborted after it



def _num_reqs(url) -> int:
    load = requests.get(url + "/get_load", timeout=10).json()
    return sum(int(x.get("num_reqs", 0)) for x in (load if isinstance(load, list) else [load]))


DET_CASE = dict(ignore_eos=True, temperature=0.8, seed=1234)


def _mate(url, i: int, **sampling):
    return generate(url, PROMPTS[i], det=None, extra={"rid": f"mate-{i}", "sampling_params": {
        "max_new_tokens": MATE_TOKENS, "ignore_eos": True, **sampling}})


def _det_among(url, mates: list[dict]):
    """The deterministic request decoded next to `mates` (started first); its rollbacks."""
    before = llm42_stats(url)
    with ThreadPoolExecutor(len(mates)) as pool:
        futures = [pool.submit(_mate, url, i, **m) for i, m in enumerate(mates)]
        deadline = time.time() + 60
        while _num_reqs(url) < len(mates):  # the mates are in before the det request
            assert time.time() < deadline, "mates never reached the scheduler"
            time.sleep(0.01)
        out = det_request(url, PROMPT, DET_TOKENS, **DET_CASE)
        assert not any(f.done() for f in futures), "mates finished first: not co-batched"
        for i, f in enumerate(futures):
            requests.post(url + "/abort_request", json={"rid": f"mate-{i}"}, timeout=60)
            f.result()
    rollbacks = llm42_stats(url)["rollbacks"] - before["rollbacks"]
    assert rollbacks == out[2]["llm42_rollbacks"]  # only deterministic rows are verified
    return out, rollbacks


def test_seeded_request_next_to_greedy_and_top_p_rows(llm42_server):
    url = llm42_server.url
    solo = det_request(url, PROMPT, DET_TOKENS, **DET_CASE)
    # baseline: same batch size, mates of the deterministic request's own kind (plain t=0.8)
    plain = [{"temperature": 0.8, "sampling_seed": 5}, {"temperature": 0.8, "sampling_seed": 6}]
    base, base_rollbacks = _det_among(url, plain)
    # greedy (top_k=1) and top_p < 1 mates switch SGLang's whole batch to the sorted sampler
    mixed = [{"temperature": 0.0}, {"temperature": 0.8, "top_p": 0.9}]
    got, mixed_rollbacks = _det_among(url, mixed)
    for what, out in (("plain mates", base), ("greedy + top-p mates", got)):
        assert out[0] == solo[0], f"{what}: token ids differ from the solo run"
        assert out[1] == solo[1], f"{what}: logprobs differ (bitwise) from the solo run"
    # bf16 decode and verifier numerics may still disagree now and then: allow one rollback
    # more than the plain baseline (without per-kind sampling: about one per token, 31 of 32)
    assert mixed_rollbacks <= base_rollbacks + 1, (
        f"{mixed_rollbacks} rollbacks next to greedy/top-p rows vs {base_rollbacks} next to "
        f"plain t=0.8 rows: the decode batch's sampler path depends on its batch mates"
    )
