"""Deterministic requests under tensor (TP = 2) and data (DP = 2) parallelism, on CPU over gloo.

`tp_server`: TP = 2 on two cores, half of all windows forced to mismatch, and SGLang's test
switch `SGLANG_TEST_RETRACT` retracting a request of every batch of two or more every
RETRACT_EVERY decode steps. Under TP every rank decides every commit and rollback itself, over
its shard of the KV cache; llm42 makes the decisions' inputs the same by sharing TP rank 0's
sampled tokens (`llm42.sglang.tp_share`). On a CPU the ranks would agree without it, so the
server also runs `LLM42_TEST_SKEW_RANK_TOKENS` (`llm42.sglang.rank_faults`): rank 1 samples other
tokens than rank 0 until the share replaces them. After every test the ranks' decision ledgers
must be equal (`tp_ranks_agree` in /llm42_stats): without the share, or with a rank that decides
otherwise (`LLM42_TEST_SPLIT_RANK_DECISION=1` in the environment of this file's run), they are
not, and the test fails. SGLang's strict idle leak check runs in every rank's scheduler, and a
leak on any rank takes the server down (the after-test check).

`dp_server`: DP = 2 replicas of TP = 1 behind SGLang's round-robin DP controller, with
`inject_server`'s flags: each deterministic output equals inject_server's, a separate process,
whichever replica served it; both replicas must have decided.
"""

from __future__ import annotations

import pytest

from conftest import _llm42_args, _start, wait_idle_and_healthy
from helpers import (
    PROMPTS,
    assert_bitwise_everywhere,
    assert_prefix,
    assert_same,
    background_requests,
    concurrently,
    det_request,
    generate,
    llm42_stats,
    sampling_cases,
)
from llm42.sglang.rank_faults import SKEW_ENV
from test_aborts import disconnect_after, stream_then_abort

pytestmark = pytest.mark.server

NEW_TOKENS = 16  # two windows of W = 8: TP = 2 on two cores decodes ~3x slower than TP = 1
RETRACT_EVERY = 8  # decode steps
CASES = sampling_cases(seed=77)


@pytest.fixture(scope="module")
def tp_server(tiny_model, tmp_path_factory):
    env = {SKEW_ENV: "1", "SGLANG_TEST_RETRACT": "1",
           "SGLANG_TEST_RETRACT_INTERVAL": str(RETRACT_EVERY)}
    server = _start(tiny_model, _llm42_args(rate=0.5) + ["--tp-size", "2"], "tp2",
                    tmp_path_factory, env=env)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def dp_server(tiny_model, tmp_path_factory):
    args = _llm42_args(rate=0.5) + ["--disable-overlap-schedule", "--dp-size", "2"]
    server = _start(tiny_model, args, "dp2", tmp_path_factory)
    yield server
    server.stop()


def assert_ranks_agree(url: str, num_ranks: int = 2) -> dict:
    """Every scheduler's decision ledger is listed, and a replica's TP ranks recorded the same
    decisions (counts and digest of every committed token)."""
    stats = llm42_stats(url)
    ledgers = stats["rank_ledgers"]
    assert len(ledgers) == num_ranks, ledgers
    assert stats["tp_ranks_agree"], f"TP ranks decided differently: {ledgers}"
    return stats


@pytest.fixture(autouse=True)
def _ranks_stay_clean_and_agree(request):
    yield
    if "tp_server" in request.fixturenames:
        server = request.getfixturevalue("tp_server")
        wait_idle_and_healthy(server)
        assert_ranks_agree(server.url)
    if "dp_server" in request.fixturenames:
        wait_idle_and_healthy(request.getfixturevalue("dp_server"))


def _batched(url, prompts, case):
    return lambda u: generate(u, list(prompts), max_new_tokens=NEW_TOKENS, **case)


@pytest.mark.parametrize("case", CASES)
def test_tp2_deterministic_requests_are_bitwise_identical(tp_server, case):
    """Solo, repeated, among concurrent normal traffic (retracted now and then) and in a batched
    call, through forced rollbacks, while rank 1's own samples differ from rank 0's."""
    url, prompts = tp_server.url, PROMPTS[:2]
    before = llm42_stats(url)
    assert_bitwise_everywhere(
        url, lambda u, p: det_request(u, p, NEW_TOKENS, **case), prompts,
        normal_traffic=background_requests(url, 4), batched=_batched(url, prompts, case))
    stats = assert_ranks_agree(url)
    assert stats["rollbacks"] > before["rollbacks"], "no rollback happened"
    assert all(entry["decisions"] > 0 for entry in stats["rank_ledgers"]), stats["rank_ledgers"]
    assert [e["tp_rank"] for e in stats["rank_ledgers"]] == [0, 1]


def test_tp2_retraction_and_aborts_leak_nothing_on_any_rank(tp_server):
    """Retracted deterministic requests restart and give their solo output; aborted ones (by
    rid after a streamed chunk, by a client disconnect) publish a prefix of it. Then the server
    must go idle with every rank's strict leak check passing (`_ranks_stay_clean_and_agree`)."""
    url = tp_server.url
    jobs = [(PROMPTS[i % 2], CASES[i % 2].values[0]) for i in range(3)]
    refs = [det_request(url, p, NEW_TOKENS, ignore_eos=True, **c) for p, c in jobs]
    victim_case = {"temperature": 0.0}
    victim_ref = det_request(url, PROMPTS[3], 24, ignore_eos=True)
    restarts = llm42_stats(url)["retraction_restarts"]

    out = concurrently(
        [lambda p=p, c=c: det_request(url, p, NEW_TOKENS, ignore_eos=True, **c) for p, c in jobs]
        + [lambda: stream_then_abort(url, PROMPTS[3], victim_case, "tp2-victim", after_chunks=3),
           lambda: disconnect_after(url, PROMPTS[3], victim_case, 2)]
        + background_requests(url, 3))
    for (p, c), ref, got in zip(jobs, refs, out):
        assert_same(ref, got, f"retracted or not {p!r} {c}")
    assert_prefix(victim_ref, out[len(jobs)], "aborted by rid")
    assert llm42_stats(url)["retraction_restarts"] > restarts, "nothing was retracted"


def test_tp2_restart_reproduces_outputs(tp_server):
    """The same TP = 2 server stopped and started again: bitwise the same outputs, and the
    ledgers start from zero on both ranks."""
    url = tp_server.url
    before = [det_request(url, PROMPTS[4], NEW_TOKENS, **c.values[0]) for c in CASES]
    tp_server.stop()
    tp_server.start()
    fresh = assert_ranks_agree(tp_server.url)
    assert all(e["decisions"] == 0 for e in fresh["rank_ledgers"]), fresh["rank_ledgers"]
    after = [det_request(tp_server.url, PROMPTS[4], NEW_TOKENS, **c.values[0]) for c in CASES]
    for c, ref, got in zip(CASES, before, after):
        assert_same(ref, got, f"after a restart {c.id}")


@pytest.mark.parametrize("case", CASES)
def test_dp2_replicas_give_the_single_server_outputs(dp_server, inject_server, case):
    """A router may send a deterministic request to either replica: repeated (round robin
    alternates the replicas), among normal traffic and batched, each output is bitwise the one
    `inject_server` (same flags, one process of TP = 1) gives."""
    prompts = PROMPTS[:2]
    refs = [det_request(inject_server.url, p, NEW_TOKENS, **case) for p in prompts]
    url = dp_server.url
    for _ in range(2):
        for p, ref in zip(prompts, refs):
            assert_same(ref, det_request(url, p, NEW_TOKENS, **case), f"replica {p!r}")
    loaded = concurrently([lambda p=p: det_request(url, p, NEW_TOKENS, **case) for p in prompts]
                          + background_requests(url, 4))
    batched = _batched(url, prompts, case)(url)
    for p, ref, got, got_batched in zip(prompts, refs, loaded, batched):
        assert_same(ref, got, f"replica among normal traffic {p!r}")
        assert_same(ref, got_batched, f"replica batched {p!r}")
    stats = llm42_stats(url)
    assert stats["dp_ranks"] == 2 and stats["rollbacks"] > 0, stats
    ledgers = stats["rank_ledgers"]
    assert sorted(e["dp_rank"] for e in ledgers) == [0, 1], ledgers
    assert all(e["decisions"] > 0 for e in ledgers), f"a replica served nothing: {ledgers}"
