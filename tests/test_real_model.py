"""End to end on the embedded real model (SmolLM2-135M-Instruct): sensible and reproducible."""

from __future__ import annotations

import pytest
import requests

from helpers import concurrently

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def smollm2_server(tmp_path_factory):
    from llm42.models import default_model_path
    from llm42.server_process import SGLangServer

    log = tmp_path_factory.mktemp("smollm2") / "server.log"
    args = ["--enable-llm42", "--llm42-window-size", "16", "--llm42-verify-batch-size", "2",
            "--context-length", "2048"]
    with SGLangServer(default_model_path(), args, log_path=str(log), startup_timeout=600) as s:
        yield s


def _chat(url, question, det, seed=None, temperature=0.0):
    body = {"model": "default", "messages": [{"role": "user", "content": question}],
            "max_tokens": 24, "temperature": temperature, "logprobs": True}
    if det:
        body["is_deterministic"] = True
    if seed is not None:
        body["seed"] = seed
    out = requests.post(url + "/v1/chat/completions", json=body, timeout=600).json()
    choice = out["choices"][0]
    lps = [t["logprob"] for t in choice["logprobs"]["content"]]
    return choice["message"]["content"], lps


def test_real_model_answers_and_is_reproducible(smollm2_server):
    url = smollm2_server.url
    text, lps = _chat(url, "What is the capital of France?", det=True)
    assert "Paris" in text, text
    alone = _chat(url, "Name a primary color.", det=True, seed=3, temperature=0.8)
    loaded = concurrently(
        [lambda: _chat(url, "Name a primary color.", det=True, seed=3, temperature=0.8)]
        + [lambda q=q: _chat(url, q, det=False) for q in
           ("Count to five.", "Say hello in French.", "What is 2+2?")]
    )[0]
    assert loaded == alone, "deterministic answer changed with concurrent traffic"
    stats = requests.get(url + "/llm42_stats", timeout=30).json()
    assert stats["verify_passes"] >= 2 and stats["verified_tokens"] > 0
