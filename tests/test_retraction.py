"""Memory pressure: deterministic requests retracted by SGLang and resumed keep their exact output.

SGLang's decode retraction (`ScheduleBatch.retract_decode`) evicts the running requests with the
fewest output tokens when the KV cache runs out. On a 2-core CPU a cache small enough to run out
takes minutes to fill, so the server also sets SGLang's own test switch `SGLANG_TEST_RETRACT`,
which runs the same retraction every N decode steps. A retracted deterministic request restarts
from its prompt (`reset_for_retract_hook`); its tokens, logprobs and stream must come out exactly
as when it ran alone on an empty server.
"""

from __future__ import annotations

import pytest
import requests

from conftest import _llm42_args, wait_idle_and_healthy
from helpers import PROMPTS, concurrently, det_request, generate

pytestmark = pytest.mark.server

KV_TOKENS = 1024
NEW_TOKENS = 96
RETRACT_EVERY = 10  # decode steps
DIGITS = "[0-9]{500}"  # a grammar still open after NEW_TOKENS tokens (digits are single tokens)
CASES = [dict(temperature=0.0, ignore_eos=True),
         dict(temperature=0.8, seed=321, ignore_eos=True),
         # a restart rewinds the request's grammar matcher to the prompt
         dict(temperature=0.8, seed=5, ignore_eos=True, sampling={"regex": DIGITS})]


@pytest.fixture(scope="module", params=["solo-prefill", "batched-prefill"])
def pressure_server(request, tiny_model, tmp_path_factory):
    """Solo deterministic prefills, or batched ones whose prompt passes are redone after a
    restart (`--llm42-batched-prefill`), over prompt rows shared through the radix cache
    (`--llm42-prefix-cache`: a restarted request matches rows it published itself)."""
    from llm42.server_process import SGLangServer

    extra = (["--llm42-batched-prefill", "--llm42-prefix-cache"]
             if request.param == "batched-prefill" else [])
    server = SGLangServer(
        tiny_model, _llm42_args(rate=0.2) + ["--max-total-tokens", str(KV_TOKENS)] + extra,
        env={"SGLANG_TEST_RETRACT": "1", "SGLANG_TEST_RETRACT_INTERVAL": str(RETRACT_EVERY)},
        log_path=tmp_path_factory.mktemp("pressure") / "server.log", startup_timeout=300,
    )
    server.start()
    yield server
    server.stop()


def _normal(url, i):
    return generate(url, PROMPTS[i % len(PROMPTS)] * (1 + i % 3), det=None,
                    max_new_tokens=NEW_TOKENS - 7 * (i % 5), ignore_eos=True)


def test_retracted_deterministic_requests_reproduce(pressure_server):
    url = pressure_server.url
    jobs = [(p, c) for p in PROMPTS[:2] for c in CASES[:2]] + [(PROMPTS[0], CASES[2])]
    # references: one at a time on the empty server (a single request always fits)
    refs = [det_request(url, p, NEW_TOKENS, **c) for p, c in jobs]
    requests.post(url + "/reset_llm42_stats", timeout=30)

    fns = [lambda p=p, c=c: det_request(url, p, NEW_TOKENS, **c) for p, c in jobs]
    fns += [lambda p=p, c=c: det_request(url, p, NEW_TOKENS, stream=True, **c) for p, c in jobs[:2]]
    fns += [lambda i=i: _normal(url, i) for i in range(6)]
    out = concurrently(fns)

    stats = requests.get(url + "/llm42_stats", timeout=30).json()
    assert stats["retraction_restarts"] > 0, f"no deterministic request was retracted: {stats}"
    for k, ((p, c), ref) in enumerate(zip(jobs + jobs[:2], refs + refs[:2])):
        got = out[k]
        assert got[0] == ref[0], f"{p!r} {c}: tokens differ after retraction (job {k})"
        assert got[1] == ref[1], f"{p!r} {c}: logprobs differ after retraction (job {k})"
        assert got[2]["completion_tokens"] == NEW_TOKENS
        if "sampling" in c:
            assert got[2]["text"].isdigit(), got[2]["text"]
    assert sum(o[2].get("llm42_restarts", 0) for o in out[: len(jobs) + 2]) > 0
    for normal in out[len(jobs) + 2 :]:
        assert len(normal[0]) == normal[2]["completion_tokens"] > 0
    wait_idle_and_healthy(pressure_server)
