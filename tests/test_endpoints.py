"""`/llm42_stats` over data-parallel ranks: counters summed, settings kept, ratios recomputed,
the TP ranks' decision ledgers listed and compared per replica; the pass-path warning behind its
`graphed_passes`."""

from __future__ import annotations

import pytest

from llm42.core import Llm42Stats
from llm42.sglang.endpoints import merge_snapshots

from core_factories import accept, rollback

ROLLBACK = rollback(4, accepted=1, rejected=3, corrected=3, verified=3, mismatch=2)
ACCEPT = accept(4, verified=5, outputs=5)


def _settings() -> dict:
    """Every setting a rank's snapshot carries (Llm42Runtime.snapshot minus the counters), with
    values that summing over two ranks would change."""
    from types import SimpleNamespace

    from llm42.core import Llm42Config
    from llm42.sglang.runtime import Llm42Runtime

    scheduler = SimpleNamespace(model_config=SimpleNamespace(vocab_size=100), enable_overlap=True)
    config = Llm42Config(window_size=16, verify_batch_size=4, max_passes_per_step=1,
                         defer_verify_on_prefill=True)
    snap = Llm42Runtime(scheduler, config).snapshot()
    listed = {"rank_ledgers"}  # per scheduler, concatenated: test_ledgers_listed_per_rank...
    return {k: v for k, v in snap.items() if k not in Llm42Stats().snapshot() and k not in listed}


SETTINGS = _settings()


def _rank(decision, steps: int, restarts: int) -> dict:
    stats = Llm42Stats()
    stats.observe_pass(2, 2, 0.5)
    stats.observe_decision(decision, "top_p")
    for _ in range(steps):
        stats.observe_step("decode", 0.25)
    for _ in range(restarts):
        stats.observe_restart()
    stats.observe_early_result()
    return {**SETTINGS, **stats.snapshot()}


def test_counters_summed_settings_kept_recompute_recomputed():
    merged = merge_snapshots([_rank(ROLLBACK, 3, 1), _rank(ACCEPT, 1, 0), {"enabled": False}])
    assert merged["dp_ranks"] == 2
    assert {k: merged[k] for k in SETTINGS} == SETTINGS  # not multiplied by the rank count
    assert SETTINGS["max_passes_per_step"] == 1 and SETTINGS["defer_verify_on_prefill"] is True
    assert SETTINGS["solo_prefill_min_tokens"] == 1024
    assert (merged["verify_passes"], merged["rollbacks"], merged["tokens_rolled_back"]) == (2, 1, 3)
    assert (merged["steps_decode"], merged["retraction_restarts"], merged["early_results"]) == \
        (4, 1, 2)
    assert merged["step_time_decode_s"] == pytest.approx(1.0)
    # 3 rolled back of (2 + 4 committed + 3 rolled back), not the mean of the ranks' percentages
    assert merged["recompute_pct"] == pytest.approx(100 * 3 / 9)
    assert merged["by_sampling_kind"] == {"top_p": {
        "decisions": 2, "rollbacks": 1, "verified_tokens": 6, "tokens_rolled_back": 3,
        "recompute_pct": pytest.approx(100 * 3 / 9)}}


def test_no_rank_with_llm42_reports_disabled():
    assert merge_snapshots([{"enabled": False}, {}]) == {"enabled": False}
    # a baseline server recording step timelines (one file per scheduler process)
    assert merge_snapshots([{"enabled": False, "timeline": "/t/a.jsonl"},
                            {"enabled": False, "timeline": None}]) == {
        "enabled": False, "timelines": ["/t/a.jsonl"]}


def test_a_server_mixing_graphed_and_eager_passes_warns_once(caplog):
    """Graphed and eager passes may compute a token differently: the operator hears of it."""
    from types import SimpleNamespace

    from llm42.sglang.verify_passes import observe_pass_path

    rt = SimpleNamespace(pass_paths=set())
    with caplog.at_level("WARNING", logger="llm42.sglang.verify_passes"):
        for graphed in (True, True, True):
            observe_pass_path(rt, graphed)
        assert not caplog.records  # one path only: nothing to say
        for graphed in (False, True, False):
            observe_pass_path(rt, graphed)
    assert len(caplog.records) == 1 and "both through CUDA graphs and eagerly" in caplog.text


def test_scheduler_switches_benchmark_modes_only_when_started_with_the_flag():
    """The scheduler side of POST /llm42_benchmark_mode checks the gate again: SGLang's own
    /set_internal_state reaches the same hook."""
    from types import SimpleNamespace

    from llm42.core import Llm42Config
    from llm42.sglang.runtime import Llm42Runtime

    scheduler = SimpleNamespace(model_config=SimpleNamespace(vocab_size=100))
    off = Llm42Runtime(scheduler, Llm42Config())
    assert not off.switch_benchmark_mode({"skip_compare": True}) and not off.config.skip_compare
    on = Llm42Runtime(scheduler, Llm42Config(benchmark_modes=True, seed=3))
    assert not on.switch_benchmark_mode({"inject_mismatch_rate": 7})
    assert on.switch_benchmark_mode({"inject_mismatch_rate": 1.0})
    assert on.snapshot()["inject_mismatch_rate"] == 1.0 and on.injector.rate == 1.0


def test_scheduler_switches_the_window_only_with_no_deterministic_request_in_flight():
    """A window switch with deterministic requests anywhere in the scheduler is refused and the
    reason kept for the endpoint (409); once they are gone it switches, the snapshot reports the
    new W and its default max verify wait, and the pass-path warning starts over (a B x W pass
    may replay a CUDA graph for one W and not for another)."""
    from types import SimpleNamespace

    from llm42.core import DetRequestState, Llm42Config
    from llm42.sglang.runtime import Llm42Runtime
    from llm42.sglang.hooks_internal_state import num_det_in_flight
    from llm42.sglang.request_state import attach

    def req(det: bool, finished: bool = False):
        r = SimpleNamespace(finished=lambda: finished)
        if det:
            attach(r, DetRequestState(rid="r", window_size=8, num_prompt_tokens=4))
        return r

    waiting, running, done = req(True), req(True), req(True, finished=True)
    scheduler = SimpleNamespace(
        model_config=SimpleNamespace(vocab_size=100, context_len=64), waiting_queue=[waiting],
        chunked_req=None, running_batch=SimpleNamespace(reqs=[running, req(False), done]),
        last_batch=SimpleNamespace(reqs=[running]),  # the same request counts once
        grammar_manager=SimpleNamespace(grammar_queue=[]))
    assert num_det_in_flight(scheduler) == 2
    scheduler.result_queue = [(SimpleNamespace(reqs=[req(True)]), None)]  # overlap: in flight
    assert num_det_in_flight(scheduler) == 3

    rt = Llm42Runtime(scheduler, Llm42Config(window_size=8, benchmark_modes=True))
    rt.pass_paths.add(True)
    assert not rt.switch_benchmark_mode({"window_size": 16}, num_det_in_flight=3)
    assert rt.config.window_size == 8 and rt.snapshot()["benchmark_mode_refusal"]["busy"]
    assert "needs an idle server" in rt.mode_refusal["message"]
    assert rt.switch_benchmark_mode({"inject_mismatch_rate": 0.5}, num_det_in_flight=3)
    assert rt.mode_refusal is None and rt.pass_paths == {True}, "same W: nothing to start over"
    assert not rt.switch_benchmark_mode({"window_size": 128})  # over the context length (64)
    assert not rt.mode_refusal["busy"] and "context length" in rt.mode_refusal["message"]
    assert rt.switch_benchmark_mode({"window_size": 16})
    snap = rt.snapshot()
    assert (snap["window_size"], snap["max_verify_wait"], snap["inject_mismatch_rate"]) == (
        16, 4, 0.5)
    assert snap["benchmark_mode_refusal"] is None and rt.pass_paths == set()


def test_ledgers_listed_per_rank_and_tp_agreement_checked_per_replica():
    """Two DP replicas of TP = 2: their ledgers differ (they served other requests), which is
    fine; within a replica one rank with another decision makes `tp_ranks_agree` false."""
    from llm42.core import DecisionLedger

    def ledger(decisions):
        led = DecisionLedger()
        for rid, first in decisions:
            led.observe(rid, first, [7, 8], 1, first + 1)
        return led.snapshot()

    def replica(dp_rank, per_tp_rank):
        return {**_rank(ACCEPT, 1, 0), "rank_ledgers": [
            {"dp_rank": dp_rank, "tp_rank": tp, **ledger(d)} for tp, d in enumerate(per_tp_rank)]}

    served = [("a", 1), ("a", 3)]
    agreeing = merge_snapshots([replica(0, [served] * 2), replica(1, [served[:1]] * 2)])
    assert agreeing["tp_ranks_agree"]
    assert [(e["dp_rank"], e["tp_rank"], e["decisions"]) for e in agreeing["rank_ledgers"]] == [
        (0, 0, 2), (0, 1, 2), (1, 0, 1), (1, 1, 1)]
    split = merge_snapshots([replica(0, [served] * 2), replica(1, [served[:1], served])])
    assert not split["tp_ranks_agree"]
