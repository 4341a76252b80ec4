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

`tp_row_server`: TP = 2 under the row-invariant verifier, where most tokens are verified on
arrival by inline steps; the ledgers must hold those too.

`dp_server`: DP = 2 replicas of TP = 1 behind SGLang's round-robin DP controller, with
`inject_server`'s flags: each deterministic output equals inject_server's, a separate process,
whichever replica served it; both replicas must have decided.
"""

from __future__ import annotations

import pytest
import requests
from conftest import CONTEXT, _llm42_args, _start, wait_idle_and_healthy
from helpers import (
    PROMPTS,
    assert_prefix,
    assert_same,
    background_requests,
    concurrently,
    det_request,
    generate,
    llm42_stats,
    sampling_cases,
)
from test_aborts import disconnect_after, stream_then_abort

from llm42.sglang.rank_faults import SKEW_ENV

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
def tp_row_server(tiny_model, tmp_path_factory):
    """TP = 2 under the row-invariant verifier: every decode step of at most R rows inline and
    prompts' rows inline with their prefill (tokens verified on arrival, on each rank), half of
    the windows that go to passes forced to mismatch, rank 1's samples skewed."""
    args = ["--enable-llm42", "--llm42-verifier", "row-invariant", "--llm42-window-size", "8",
            "--llm42-verify-batch-size", "4", "--llm42-inject-mismatch-rate", "0.5",
            "--llm42-inline-pad-ratio", "16", "--llm42-benchmark-modes", "--random-seed", "7",
            "--context-length", str(CONTEXT), "--tp-size", "2"]
    server = _start(tiny_model, args, "tp2-row", tmp_path_factory, env={SKEW_ENV: "1"})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def dp_server(tiny_model, tmp_path_factory):
    args = _llm42_args(rate=0.5) + ["--disable-overlap-schedule", "--dp-size", "2"]
    server = _start(tiny_model, args, "dp2", tmp_path_factory)
    yield server
    server.stop(grace_s=4)  # its launcher leaves the DP schedulers to the group SIGTERM


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
    if "tp_row_server" in request.fixturenames:
        server = request.getfixturevalue("tp_row_server")
        wait_idle_and_healthy(server)
        assert_ranks_agree(server.url)
    if "dp_server" in request.fixturenames:
        wait_idle_and_healthy(request.getfixturevalue("dp_server"))


def _jobs():
    """(prompt, sampling case) pairs: two prompts, greedy and seeded t = 0.8."""
    return [(p, c.id, c.values[0]) for c in CASES for p in PROMPTS[:2]]


_SOLO: dict = {}  # (prompt, case id) -> tp_server's solo output, before and after its restart


def _tp_solo(url, prompt, case_id, case):
    if (prompt, case_id) not in _SOLO:
        _SOLO[prompt, case_id] = det_request(url, prompt, NEW_TOKENS, **case)
    return _SOLO[prompt, case_id]


def _batched(url, jobs):
    """One batched /generate call per sampling case (`_jobs` groups them), in `jobs` order."""
    out = []
    for case_id in dict.fromkeys(c_id for _, c_id, _ in jobs):
        group = [(p, c) for p, c_id, c in jobs if c_id == case_id]
        out += generate(url, [p for p, _ in group], max_new_tokens=NEW_TOKENS, **group[0][1])
    return out



def _assert_loaded_and_batched(url: str, jobs, refs, what: str) -> None:
    """Each job among normal traffic, then in one batched call: bitwise its solo output."""
    loaded = concurrently([lambda p=p, c=c: det_request(url, p, NEW_TOKENS, **c)
                           for p, _, c in jobs] + background_requests(url, 4))
    for job, ref, got, got_batched in zip(jobs, refs, loaded, _batched(url, jobs)):
        assert_same(ref, got, f"{what}among normal traffic {job[:2]}")
        assert_same(ref, got_batched, f"{what}batched {job[:2]}")

def test_tp2_deterministic_requests_are_bitwise_identical(tp_server):
    """Alone, among concurrent normal traffic (retracted now and then) and in a batched call,
    greedy and seeded, through forced rollbacks, while rank 1's own samples differ from rank
    0's: every output equals the request's solo output, and both ranks decided alike."""
    url, jobs = tp_server.url, _jobs()
    before = llm42_stats(url)
    refs = [_tp_solo(url, *job) for job in jobs]
    _assert_loaded_and_batched(url, jobs, refs, "")
    stats = assert_ranks_agree(url)
    assert stats["rollbacks"] > before["rollbacks"], "no rollback happened"
    assert [e["tp_rank"] for e in stats["rank_ledgers"]] == [0, 1]
    assert all(entry["decisions"] > 0 for entry in stats["rank_ledgers"]), stats["rank_ledgers"]


def test_tp2_retraction_and_aborts_leak_nothing_on_any_rank(tp_server):
    """Retracted deterministic requests restart and give their solo output; aborted ones (by
    rid after a streamed chunk, by a client disconnect) publish a prefix of theirs. Then the
    server must go idle with every rank's strict leak check passing (the after-test check)."""
    url, jobs = tp_server.url, _jobs()[:3]
    refs = [_tp_solo(url, *job) for job in jobs]
    victim_case = {"temperature": 0.0}
    victim_ref = det_request(url, PROMPTS[3], 24, ignore_eos=True)
    restarts = llm42_stats(url)["retraction_restarts"]
    out = concurrently(
        [lambda p=p, c=c: det_request(url, p, NEW_TOKENS, **c) for p, _, c in jobs]
        + [lambda: stream_then_abort(url, PROMPTS[3], victim_case, "tp2-victim", after_chunks=3),
           lambda: disconnect_after(url, PROMPTS[3], victim_case, 2)]
        + background_requests(url, 3))
    for job, ref, got in zip(jobs, refs, out):
        assert_same(ref, got, f"retracted or not {job[:2]}")
    assert_prefix(victim_ref, out[len(jobs)], "aborted by rid")
    assert llm42_stats(url)["retraction_restarts"] > restarts, "nothing was retracted"


def test_tp2_restart_reproduces_outputs(tp_server):
    """The TP = 2 server stopped and started again: bitwise the outputs it gave before, and
    both ranks' ledgers start from zero."""
    jobs = _jobs()[1:3]  # greedy and seeded
    refs = [_tp_solo(tp_server.url, *job) for job in jobs]
    tp_server.stop()
    tp_server.start()
    fresh = assert_ranks_agree(tp_server.url)
    assert all(e["decisions"] == 0 for e in fresh["rank_ledgers"]), fresh["rank_ledgers"]
    for (p, c_id, c), ref in zip(jobs, refs):
        assert_same(ref, det_request(tp_server.url, p, NEW_TOKENS, **c), f"restart {p!r} {c_id}")


def test_tp2_row_invariant_outputs_depend_on_the_request_alone(tp_row_server):
    """Under the row-invariant verifier at TP = 2, with rank 1's samples skewed: each output is
    bitwise its solo output among normal traffic and batched, and again after W and B change
    and with inline steps off (passes verify every token). Both ranks' ledgers hold the tokens
    verified on arrival, not only the pass decisions, and agree."""
    url, jobs = tp_row_server.url, _jobs()
    refs = [det_request(url, p, NEW_TOKENS, **c) for p, _, c in jobs]
    _assert_loaded_and_batched(url, jobs, refs, "")
    stats = assert_ranks_agree(url)
    assert stats["inline_verified_tokens"] > 0 and stats["inline_prefill_prompts"] > 0, stats
    ledgers = stats["rank_ledgers"]
    assert all(e["committed_tokens"] >= stats["inline_verified_tokens"] for e in ledgers), (
        ledgers, stats["inline_verified_tokens"])
    for mode in ({"window_size": 16, "verify_batch_size": 1, "inline_pad_ratio": 0.0},
                 {"window_size": 8, "verify_batch_size": 4, "inline_pad_ratio": 16.0}):
        r = requests.post(url + "/llm42_benchmark_mode", json=mode, timeout=30)
        assert r.status_code == 200, r.text
        for (p, c_id, c), ref in list(zip(jobs, refs))[:2]:
            assert_same(ref, det_request(url, p, NEW_TOKENS, **c), f"{mode} {p!r} {c_id}")
    assert llm42_stats(url)["rollbacks"] > stats["rollbacks"], "no pass rolled back"


def test_dp2_replicas_give_the_single_server_outputs(dp_server, inject_server):
    """A router may send a deterministic request to either replica: sent to both (SGLang's round
    robin), among normal traffic and batched, every output is bitwise the one `inject_server`
    (same flags, one TP = 1 process) gives."""
    url, jobs = dp_server.url, _jobs()
    refs = concurrently([lambda p=p, c=c: det_request(inject_server.url, p, NEW_TOKENS, **c)
                         for p, _, c in jobs])  # its own outputs do not depend on the load
    for (p, c_id, c), ref in list(zip(jobs, refs))[1:3]:  # a greedy and a seeded request
        # two copies at once, nothing else in flight: round robin gives one to each replica
        pair = concurrently([lambda p=p, c=c: det_request(url, p, NEW_TOKENS, **c)] * 2)
        for replica, got in enumerate(pair):
            assert_same(ref, got, f"{p!r} {c_id} #{replica}")
    ledgers = llm42_stats(url)["rank_ledgers"]
    assert sorted(e["dp_rank"] for e in ledgers) == [0, 1], ledgers
    assert all(e["decisions"] > 0 for e in ledgers), f"a replica served nothing: {ledgers}"
    _assert_loaded_and_batched(url, jobs, refs, "replica ")
    stats = llm42_stats(url)
    assert stats["dp_ranks"] == 2 and stats["rollbacks"] > 0, stats
