"""Deterministic requests on speculative-decoding servers (NGRAM, STANDALONE, EAGLE topk 1).

The speculative servers have exactly `inject_server`'s llm42 settings (W 8, B 4, half of all
windows forced to mismatch, the normal event loop) plus speculation, so its deterministic
outputs must equal `inject_server`'s bit for bit: speculation only proposes candidates. All
three run with `LLM42_TEST_CHECK_SPEC_ROOTS`: a verify step whose deterministic draft tree does not
start from the request's last output token (a rollback that left SGLang's speculative state
behind) kills the server. SGLang's idle leak check (`wait_idle_and_healthy`) catches a draft KV
tail that a rollback did not free.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from conftest import _llm42_args, _start, wait_idle_and_healthy
from helpers import (
    PROMPTS,
    assert_bitwise_everywhere,
    assert_same,
    background_requests,
    concurrently,
    generate,
    llm42_stats,
    sampling_cases,
)

from llm42.sglang import speculation

NGRAM_ARGS = ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "4"]
DRAFT_ARGS = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
              "--speculative-num-draft-tokens", "4"]
CHECK_ENV = {speculation.CHECK_ROOTS_ENV: "1"}


def _spec_args(extra: list[str]) -> list[str]:
    return _llm42_args(rate=0.5) + ["--disable-overlap-schedule", *extra]


@pytest.fixture(scope="module")
def spec_servers(tiny_model, tmp_path_factory):
    """The three servers, started side by side (CI time):

    - ngram: drafts from the request's own earlier tokens;
    - standalone: the (random) target model is its own draft, so most drafts are accepted and
      whole windows come from speculative steps; it also retracts the running requests every 10
      decode steps (SGLang's test switch): a retracted deterministic request restarts from its
      prompt, draft state included;
    - eagle: a random one-layer EAGLE draft (`write_random_eagle_draft`): drafts rarely match."""
    from llm42.models import write_random_eagle_draft

    eagle_draft = write_random_eagle_draft(tmp_path_factory.mktemp("eagle-draft"),
                                           base_dir=tiny_model, seed=1)
    retract = {"SGLANG_TEST_RETRACT": "1", "SGLANG_TEST_RETRACT_INTERVAL": "10"}
    plans = {
        "ngram": (NGRAM_ARGS, CHECK_ENV),
        "standalone": (["--speculative-algorithm", "STANDALONE",
                        "--speculative-draft-model-path", tiny_model, *DRAFT_ARGS],
                       {**CHECK_ENV, **retract}),
        "eagle": (["--speculative-algorithm", "EAGLE",
                   "--speculative-draft-model-path", eagle_draft, *DRAFT_ARGS], CHECK_ENV),
    }
    with ThreadPoolExecutor(len(plans)) as pool:
        futures = {name: pool.submit(_start, tiny_model, _spec_args(extra), f"spec-{name}",
                                     tmp_path_factory, env)
                   for name, (extra, env) in plans.items()}
        servers = {name: f.result() for name, f in futures.items()}
    yield servers
    with ThreadPoolExecutor(len(servers)) as pool:
        list(pool.map(lambda server: server.stop(), servers.values()))


@pytest.fixture
def ngram_server(spec_servers):
    return spec_servers["ngram"]


@pytest.fixture
def eagle_server(spec_servers):
    return spec_servers["eagle"]


@pytest.fixture(params=["ngram", "standalone"])
def spec_server(request, spec_servers):
    server = spec_servers[request.param]
    yield server
    wait_idle_and_healthy(server)


SHORT = PROMPTS[:3]  # CI time: three prompts of 32 tokens show every path


def _send(sampling):
    def send(url, prompt):
        return generate(url, prompt, max_new_tokens=32, **sampling)
    return send


@pytest.mark.parametrize("sampling", sampling_cases(seed=11))
def test_outputs_do_not_depend_on_speculation(spec_server, inject_server, sampling):
    """Solo, repeated, among normal traffic and with forced mismatches: the same bits as the
    non-speculative server with the same llm42 settings."""
    send = _send(sampling)
    refs = [send(inject_server.url, p) for p in SHORT]
    before = llm42_stats(spec_server.url)
    spec_refs, _ = assert_bitwise_everywhere(
        spec_server.url, send, SHORT,
        normal_traffic=background_requests(spec_server.url, n=6))
    for p, ref, got in zip(SHORT, refs, spec_refs):
        assert_same(ref, got, f"speculative vs non-speculative {p!r}")
    after = llm42_stats(spec_server.url)
    assert after["rollbacks"] > before["rollbacks"], "no rollback happened under speculation"
    assert all(r[2]["spec_verify_ct"] > 0 for r in spec_refs), "no speculative step ran"


@pytest.mark.parametrize("sampling", sampling_cases(seed=13))
def test_eagle_outputs_equal_the_non_speculative_servers(eagle_server, inject_server, sampling):
    """EAGLE (topk 1, a random draft): alone and among normal traffic, as without speculation."""
    send = _send(sampling)
    refs = [send(inject_server.url, p) for p in SHORT]
    got = concurrently([lambda p=p: send(eagle_server.url, p) for p in SHORT]
                       + background_requests(eagle_server.url, n=4))
    for p, ref, out in zip(SHORT, refs, got):
        assert_same(ref, out, f"EAGLE vs non-speculative {p!r}")
    assert all(r[2]["spec_verify_ct"] > 0 for r in got[: len(SHORT)])
    wait_idle_and_healthy(eagle_server)


def _accepted_drafts(url, sampling) -> int:
    ids, _, meta = generate(url, PROMPTS[0] * 3, max_new_tokens=64, ignore_eos=True, **sampling)
    assert len(ids) == 64
    return meta["spec_num_correct_drafts"]


def test_speculative_steps_give_candidates(spec_server):
    """Speculative steps accept drafts for deterministic requests: their candidates come from
    speculation."""
    assert _accepted_drafts(spec_server.url, {}) > 0


def test_seeded_requests_accept_drafts_along_their_draws(ngram_server):
    """A seeded request accepts the drafts that equal llm42's seeded draw at their node (NGRAM
    proposes tokens the request itself drew before; the tiny model's argmax drafts of the
    STANDALONE server rarely equal a t = 0.8 draw)."""
    assert _accepted_drafts(ngram_server.url, {"temperature": 0.8, "seed": 5}) > 0


def test_batched_and_n_samples(spec_server, inject_server):
    """One /generate with several prompts, and n = 2 seeded samples, as on the plain server."""
    body = {"text": PROMPTS[:4], "return_logprob": True,
            "sampling_params": {"temperature": 0.9, "sampling_seed": 5, "max_new_tokens": 24,
                                "is_deterministic": True, "n": 2}}
    outs = []
    for url in (inject_server.url, spec_server.url):
        r = requests.post(url + "/generate", json=body, timeout=300)
        r.raise_for_status()
        outs.append([(o["output_ids"], [t[0] for t in o["meta_info"]["output_token_logprobs"]])
                     for o in r.json()])
    assert outs[0] == outs[1]


def test_aborts_and_stops_leak_nothing(spec_server, inject_server):
    """A stop token mid-step gives the non-speculative output; requests aborted at spread
    delays among normal traffic leave the server healthy (strict leak check, `spec_server`)."""
    stop = {"stop_token_ids": [generate(inject_server.url, PROMPTS[1])[0][5]]}
    ref = generate(inject_server.url, PROMPTS[1], sampling=stop)
    got = generate(spec_server.url, PROMPTS[1], sampling=stop)
    assert_same(ref, got, "stop token")
    assert len(got[0]) == 6

    def victim(i):
        try:
            generate(spec_server.url, PROMPTS[i % len(PROMPTS)], max_new_tokens=120,
                     ignore_eos=True, extra={"rid": f"spec-victim-{i}"})
        except requests.exceptions.HTTPError:
            pass  # SGLang answers an aborted request with an error status

    def abort(i):
        time.sleep(0.15 * (i + 1))
        requests.post(spec_server.url + "/abort_request", json={"rid": f"spec-victim-{i}"},
                      timeout=60)

    concurrently([lambda i=i: victim(i) for i in range(5)] + [lambda i=i: abort(i)
                                                               for i in range(5)]
                 + background_requests(spec_server.url, 6))


_LAUNCH_SCRIPT = r"""
import contextlib, io, json, sys
from sglang.srt.plugins import load_plugins
import sglang.launch_server as launcher

load_plugins()
results = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            args = launcher.prepare_server_args(argv)
            res = {"code": "accepted", "overlap_off": args.disable_overlap_schedule}
        except SystemExit as exc:
            res = {"code": exc.code}
    results.append({**res, "stderr": err.getvalue()})
print("\nRESULTS " + json.dumps(results))
"""


def test_launch_accepts_the_supported_settings_and_names_the_rest(tiny_model):
    """SGLang's own argument resolution, plugins loaded as the launcher does."""
    import json
    import subprocess
    import sys

    base = ["--model-path", tiny_model, "--device", "cpu", "--attention-backend", "torch_native",
            "--max-total-tokens", "4096", "--enable-llm42"]
    draft = ["--speculative-draft-model-path", tiny_model, "--speculative-num-steps", "2",
             "--speculative-num-draft-tokens", "3"]
    runs = [base + NGRAM_ARGS,
            base + ["--speculative-algorithm", "STANDALONE", *draft,
                    "--speculative-eagle-topk", "1"],
            base + ["--speculative-algorithm", "STANDALONE", *draft,
                    "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "4"],
            base + ["--speculative-algorithm", "EAGLE3", *draft, "--speculative-eagle-topk", "1"]]
    res = subprocess.run([sys.executable, "-c", _LAUNCH_SCRIPT, json.dumps(runs)],
                         capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0 and "\nRESULTS " in res.stdout, res.stderr[-3000:]
    ngram, standalone, topk2, eagle3 = json.loads(res.stdout.rsplit("\nRESULTS ", 1)[1])
    for ok in (ngram, standalone):
        assert ok["code"] == "accepted" and ok["overlap_off"], ok["stderr"][-2000:]
        assert "the overlap scheduler is turned off" in ok["stderr"]
    assert topk2["code"] == 2 and "--speculative-eagle-topk 1 only (got 2)" in topk2["stderr"]
    assert eagle3["code"] == 2 and "(got EAGLE3)" in eagle3["stderr"], eagle3["stderr"][-2000:]


REGEX = r"[a-z]{4}(,[a-z]{4}){4}"


@pytest.mark.parametrize("sampling", sampling_cases(seed=17))
def test_structured_output_under_speculation(spec_server, inject_server, sampling):
    """A regex-constrained deterministic request: SGLang's speculative step advances the grammar
    over the accepted run, llm42 rewinds it with a rollback; the output is the non-speculative
    one and matches the regex."""
    import re

    def send(url, p):
        return generate(url, p, max_new_tokens=40, sampling={"regex": REGEX}, **sampling)

    for p in SHORT[:2]:
        ref = send(inject_server.url, p)
        got = send(spec_server.url, p)
        assert_same(ref, got, f"regex under speculation {p!r}")
        assert re.fullmatch(REGEX, got[2]["text"]), got[2]["text"]
