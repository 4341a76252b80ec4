"""The step timeline (`--llm42-timeline-dir`): what the recorder writes and what the summary
makes of it, on synthetic iterations and on a real CPU server's."""

from __future__ import annotations

import gzip
import json
import shutil

import pytest
import requests

from benchmarks.timeline import decode_gaps, load_segments, main, markdown, summarize, tail
from llm42.core.timeline import StepTimeline


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _iteration(tl, clock, at, kind, passes=(), reqs=4):
    clock.now = 100.0 + at
    tl.begin(clock.now)
    for rows, prompt_rows, seconds in passes:
        clock.now += seconds
        tl.observe_pass(rows, prompt_rows, seconds)
    tl.launched(kind, reqs=reqs if kind else 0, tokens=reqs, running=reqs, queued=0)


def test_recorder_writes_one_line_per_busy_iteration(tmp_path):
    clock = Clock()
    tl = StepTimeline(tmp_path / "t.jsonl", clock=clock)
    _iteration(tl, clock, 0.000, "decode")
    _iteration(tl, clock, 0.010, None)  # idle poll: no line, closes the decode at 10 ms
    _iteration(tl, clock, 0.050, "prefill", reqs=2)
    tl.event("reset")
    _iteration(tl, clock, 0.070, "decode", passes=[(3, 1, 0.02), (1, 0, 0.01)])
    tl.observe_drain()
    tl.observe_overlap(2)
    _iteration(tl, clock, 0.100, "decode")
    tl.close()
    lines = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert [x.get("kind", x.get("event")) for x in lines] == [
        "decode", "prefill", "reset", "decode", "decode"]
    assert lines[0]["dt"] == pytest.approx(0.010) and lines[1]["dt"] == pytest.approx(0.0)
    third = lines[3]
    assert (third["passes"], third["rows"], third["prompt_rows"]) == (2, 4, 1)
    assert third["verify_s"] == pytest.approx(0.03) and third["drained"] is True
    assert third["dt"] == pytest.approx(0.03) and lines[4]["drained"] is False
    assert (third["overlapped"], lines[4]["overlapped"]) == (2, 0)
    assert third["launch"] == pytest.approx(0.03) and lines[4]["launch"] == 0  # after its passes
    assert [len(s) for s in load_segments(tmp_path / "t.jsonl")] == [2, 2]

    # recorded results are committed gzipped: the same segments, and a folder of them summarizes
    kept = tmp_path / "kept"
    kept.mkdir()
    with open(tmp_path / "t.jsonl", "rb") as src, \
            gzip.open(kept / "timeline-7.jsonl.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    assert load_segments(kept / "timeline-7.jsonl.gz") == load_segments(tmp_path / "t.jsonl")
    assert main([str(kept), "--out-dir", str(kept)]) == 0
    assert "timeline-7 segment 1" in (kept / "timeline.md").read_text()


def _rec(t, kind, verify_s=0.0, passes=0, dt=0.0, launch=0.0):
    return {"t": t, "dt": dt, "kind": kind, "verify_s": verify_s, "passes": passes,
            "launch": launch}


def test_gaps_are_classed_by_what_ran_between_two_decodes():
    records = [
        _rec(0.00, "decode"),
        _rec(0.01, "decode"),                      # decode only: 10 ms
        _rec(0.02, "prefill"),
        _rec(0.05, "decode"),                      # prefill inside: 40 ms
        # its pass ran before it launched (at 0.08): verify, 30 ms, the pass's 20 inside
        _rec(0.06, "decode", verify_s=0.02, passes=1, launch=0.02),
        _rec(0.09, "det_prefill"),
        _rec(0.12, "decode", verify_s=0.01, passes=1, launch=0.01),  # prefill + verify: 50 ms
        _rec(0.13, "prefill", verify_s=0.005, passes=1),  # a pass at a prefill's top
        _rec(0.20, "decode", dt=0.01),             # prefill + verify: 70 ms
    ]
    gaps = decode_gaps(records)
    assert [(g["class"], round(g["gap_s"], 3), g["passes"]) for g in gaps] == [
        ("decode", 0.01, 0), ("prefill", 0.04, 0), ("verify", 0.03, 1),
        ("prefill+verify", 0.05, 1), ("prefill+verify", 0.07, 1)]
    assert all(g["gap_s"] >= g["verify_s"] for g in gaps)  # a gap holds its passes' time
    s = summarize(records)
    assert s["decode_gaps"] == 5 and s["verify_passes"] == 3
    assert s["classes"]["prefill+verify"]["gaps"] == 2
    assert s["classes"]["prefill+verify"]["time_share"] == pytest.approx(0.12 / 0.20)
    assert s["classes"]["verify"]["p50_ms"] == pytest.approx(30.0)
    # timelines written before `launch` existed: launched right after the passes
    old = [{k: v for k, v in r.items() if k != "launch"} for r in records]
    assert [round(g["gap_s"], 3) for g in decode_gaps(old)] == [0.01, 0.04, 0.03, 0.05, 0.07]
    assert s["iterations"]["decode"]["iterations"] == 6
    assert s["span_s"] == pytest.approx(0.21)


def test_plain_decode_steps_are_compared_by_batch_size_with_their_launch_time():
    """Two servers under the same arrivals run different batch sizes; a step's cost is read
    per batch size, apart from steps that carried a pass or a folded round."""
    def dec(reqs, dt, launch, **extra):
        return {"t": 0.0, "kind": "decode", "reqs": reqs, "dt": dt, "launch": launch, **extra}

    records = [dec(8, 0.006, 0.001), dec(20, 0.008, 0.003), dec(40, 0.010, 0.002),
               dec(40, 0.030, 0.002, passes=1), dec(40, 0.020, 0.004, folded_rows=64),
               dec(256, 0.012, 0.001),
               {"t": 0.0, "kind": "prefill", "reqs": 1, "dt": 0.015, "launch": 0.003}]
    s = summarize(records)
    assert s["decode_by_batch"] == {
        "1-31": {"iterations": 2, "mean_ms": 7.0, "launch_mean_ms": 2.0},
        "32-63": {"iterations": 1, "mean_ms": 10.0, "launch_mean_ms": 2.0},
        "128-256": {"iterations": 1, "mean_ms": 12.0, "launch_mean_ms": 1.0}}
    assert s["iterations"]["prefill"]["launch_mean_ms"] == 3.0
    assert s["iterations"]["decode"]["launch_mean_ms"] == pytest.approx(13 / 6, abs=0.01)
    md = markdown({"x": s})
    assert "| 32-63 | 1 | 10.0 | 2.0 |" in md and "| prefill | 1 | 0.015 | 15.0 | 3.0 |" in md


def test_results_split_an_iteration_into_gpu_wait_and_host_processing(tmp_path):
    """An iteration's `dt` mixes the host's work with its wait for the GPU; each processed
    result records both, and the summary sets them out by the kind of batch they came from."""
    clock = Clock()
    tl = StepTimeline(tmp_path / "t.jsonl", clock=clock)
    _iteration(tl, clock, 0.000, "prefill", reqs=1)
    tl.observe_result("decode", 0.004, 0.001)
    _iteration(tl, clock, 0.020, "prefill", reqs=1)
    tl.observe_result("prefill", 0.010, 0.002)  # an early drain and the loop's own result
    tl.observe_result("prefill", 0.006, 0.002)
    _iteration(tl, clock, 0.040, "decode")
    tl.close()
    lines = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert [(x["result_kind"], x["result_wait"], x["result_s"]) for x in lines] == [
        ("decode", 0.004, 0.001), ("prefill", 0.016, 0.004), (None, 0.0, 0.0)]
    s = summarize(lines)
    assert s["results"] == {"decode": {"results": 1, "wait_mean_ms": 4.0, "process_mean_ms": 1.0},
                            "prefill": {"results": 1, "wait_mean_ms": 16.0,
                                        "process_mean_ms": 4.0}}
    assert "| prefill | 1 | 16.0 | 4.0 |" in markdown({"x": s})
    assert summarize([{k: v for k, v in x.items() if not k.startswith("result")}
                      for x in lines])["results"] == {}  # older recorders: no table


def test_prefill_iterations_are_split_by_prompt_size_into_host_and_gpu_parts():
    """Where a prefill iteration's time goes, by the tokens it launched: the batch build, the
    wait for the GPU, the result's processing, the forward's launch and the rest; iterations
    with a pass are left out (their time is the pass's)."""
    def prefill(t, tokens, dt, forward, passes=0):
        return {**_rec(t, "prefill", passes=passes, dt=dt, launch=0.001), "tokens": tokens,
                "result_wait": 0.0005, "result_s": 0.0015, "forward_s": forward}
    records = [prefill(0.0, 10, 0.010, 0.006), prefill(0.1, 30, 0.012, 0.008),
               prefill(0.2, 2000, 0.020, 0.015), prefill(0.3, 2000, 0.050, 0.015, passes=1)]
    split = summarize(records)["prefill_split"]
    assert set(split) == {"0-63", "1024+"}
    small = split["0-63"]
    assert (small["iterations"], small["dt_ms"], small["forward_ms"]) == (2, 11.0, 7.0)
    assert (small["launch_ms"], small["wait_ms"], small["process_ms"]) == (1.0, 0.5, 1.5)
    assert small["other_ms"] == 1.0 and split["1024+"]["other_ms"] == 2.0
    assert "| 0-63 | 2 | 11.0 | 1.0 | 0.5 | 1.5 | 7.0 | 1.0 |" in markdown(
        {"x": summarize(records)})


def test_tail_says_what_the_slow_gaps_held():
    records = [
        _rec(0.00, "decode"),
        _rec(0.01, "decode"),                                        # 10 ms, decode
        _rec(0.04, "decode", verify_s=0.02, passes=2, launch=0.02),  # 50 ms, two passes
        _rec(0.08, "decode", verify_s=0.01, passes=1, launch=0.01),  # 30 ms, one pass alone
        _rec(0.10, "prefill"),
        _rec(0.13, "decode"),                                        # 40 ms, prefill
    ]
    t = tail(decode_gaps(records), 0.030)
    assert t["threshold_ms"] == 30.0 and t["gaps"] == 3
    assert t["by_class"] == {"decode": 0, "prefill": 1, "verify": 2, "prefill+verify": 0,
                             "folded": 0}
    assert (t["several_passes"], t["one_pass_alone"]) == (1, 1)
    assert tail(decode_gaps(records))["gaps"] == 1  # default: the gaps' own p99, the 50 ms one
    s = summarize(records, 0.045)
    assert s["several_pass_gaps"] == 1 and s["tail"]["by_class"]["verify"] == 1
    assert t["waited_on"] == {"nothing": 3}, "no result timing recorded: no wait named"


def test_a_slow_gap_names_the_batch_it_waited_on_even_if_launched_before_it():
    """A deterministic prefill launched just before a decode: the decode's iteration waits for
    the prefill's GPU work, inside the gap after it, which launched nothing but decode (the
    H100 online timeline of 2026-12-07: its slowest gaps looked like decode-only ones)."""
    def waited(t, kind, result_kind, wait):
        return {**_rec(t, kind), "result_kind": result_kind, "result_wait": wait}
    records = [
        _rec(0.00, "decode"),
        waited(0.008, "det_prefill", "decode", 0.004),
        waited(0.010, "decode", "det_prefill", 0.080),   # 90 ms: waits on the prefill
        waited(0.100, "decode", "decode", 0.005),        # 8 ms
        waited(0.108, "decode", "decode", 0.0004),
    ]
    gaps = decode_gaps(records)
    assert [g["class"] for g in gaps] == ["prefill", "decode", "decode"]
    assert [g["waited_on"] for g in gaps] == ["decode", "det_prefill", "decode"]
    t = tail(gaps, 0.05)
    assert t["gaps"] == 1 and t["waited_on"] == {"det_prefill": 1}
    assert "the longest wait for the GPU: 1 on a det_prefill result" in markdown(
        {"x": summarize(records, 0.05)})


def test_a_folded_pass_is_recorded_apart_and_classes_its_gap(tmp_path):
    """A decode step launched with a folded pass's rows, then the decision at the next
    iteration's top: the gap after that step holds the decision (class folded), whose sampling
    time is kept apart from the passes' (`folded_s`), and no pass forward is counted."""
    clock = Clock()
    tl = StepTimeline(tmp_path / "t.jsonl", clock=clock)
    _iteration(tl, clock, 0.000, "decode")
    clock.now = 100.010
    tl.begin(clock.now)
    tl.observe_fold(65)
    tl.launched("decode", reqs=4, tokens=4, running=4, queued=0)
    clock.now = 100.025
    tl.begin(clock.now)
    clock.now += 0.001
    tl.observe_pass(1, 0, 0.001, folded=True)
    tl.launched("decode", reqs=4, tokens=4, running=4, queued=0)
    _iteration(tl, clock, 0.035, "decode")
    tl.close()
    records = load_segments(tmp_path / "t.jsonl")[0]
    assert records[1]["folded_rows"] == 65 and records[2]["folded"] == 1
    assert records[2]["passes"] == 0 and records[2]["verify_s"] == 0.0
    assert records[2]["folded_s"] == pytest.approx(0.001)
    gaps = decode_gaps(records)
    assert [g["class"] for g in gaps] == ["decode", "folded", "decode"]
    s = summarize(records)
    assert (s["verify_passes"], s["folded_passes"], s["folded_rows"]) == (0, 1, 65)
    assert "0 verification passes and 1 folded into decode steps (65 rows)" in markdown({"x": s})


def test_lone_pass_gaps_split_by_when_the_in_flight_result_was_processed():
    def rec(t, overlapped, launch):
        return {**_rec(t, "decode", verify_s=0.01, passes=1, launch=launch),
                "overlapped": overlapped}
    records = [_rec(0.00, "decode"),
               rec(0.01, 1, 0.012),   # 22 ms, overlapped
               rec(0.03, 0, 0.020),   # 28 ms, drained first
               rec(0.06, 1, 0.014),   # 24 ms, overlapped
               _rec(0.08, "decode")]  # 6 ms, decode only
    lone = summarize(records)["lone_pass_gaps"]
    assert lone["overlapped"]["gaps"] == 2 and lone["overlapped"]["p50_ms"] == pytest.approx(23.0)
    assert lone["drained_first"] == {"gaps": 1, "p50_ms": pytest.approx(28.0),
                                     "p90_ms": pytest.approx(28.0)}
    text = markdown({"x": summarize(records)})
    assert "overlapped 2, p50 / p90 23" in text and "processed first 1, p50 / p90 28" in text


@pytest.mark.server
def test_server_timeline_matches_its_stats(llm42_server, tmp_path):
    from conftest import wait_idle_and_healthy
    from helpers import PROMPTS, background_requests, concurrently, generate, llm42_stats

    url = llm42_server.url
    assert requests.post(url + "/reset_llm42_stats", timeout=30).status_code == 200
    concurrently([lambda p=p: generate(url, p, det=True, max_new_tokens=20) for p in PROMPTS]
                 + background_requests(url, 6))
    wait_idle_and_healthy(llm42_server)  # idle: the recorder flushes
    stats = llm42_stats(url)
    assert stats["verify_passes"] > 0
    assert stats["graphed_passes"] == 0  # SGLang on CPU has no CUDA graphs: every pass eager
    segment = load_segments(stats["timeline"])[-1]
    assert sum(r["passes"] for r in segment) == stats["verify_passes"]
    assert sum(r["rows"] for r in segment) == stats["verify_rows"]
    kinds = {r["kind"] for r in segment}
    assert {"decode", "det_prefill", "prefill"} <= kinds, kinds
    assert main([str(stats["timeline"]), "--out-dir", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "timeline.json").read_text())
    last = list(summary.values())[-1]  # the segment after the reset above
    assert last["verify_passes"] == stats["verify_passes"]
    assert (tmp_path / "timeline.png").stat().st_size > 0


@pytest.mark.server
def test_baseline_server_records_a_timeline_and_nothing_else(plain_server):
    """Without --enable-llm42 the flag still gives a step timeline (decode and prefill launches,
    reset markers), so a baseline's decode gaps can be set against llm42's; llm42 stays off."""
    from conftest import wait_idle_and_healthy
    from helpers import PROMPTS, background_requests, concurrently, generate, llm42_stats

    url = plain_server.url
    stats = llm42_stats(url)
    assert stats["enabled"] is False and len(stats["timelines"]) == 1
    assert requests.post(url + "/reset_llm42_stats", timeout=30).json()["success"] is True
    concurrently([lambda p=p: generate(url, p, det=None, max_new_tokens=12) for p in PROMPTS]
                 + background_requests(url, 4))
    wait_idle_and_healthy(plain_server)
    segment = load_segments(stats["timelines"][0])[-1]  # the one after the reset
    kinds = {r["kind"] for r in segment}
    assert {"decode", "prefill"} <= kinds, kinds
    assert sum(r["passes"] for r in segment) == 0
    assert all(r["launch"] >= 0 and r["dt"] >= 0 for r in segment)
    # every result the loop processed is recorded, with its host processing time
    assert {"decode", "prefill"} <= {r["result_kind"] for r in segment}
    assert all(r["result_s"] > 0 for r in segment if r["result_kind"] is not None)
    # and the host time inside the model's forward, for the batch each iteration launched
    assert all(r["forward_s"] > 0 for r in segment if r["kind"] in ("decode", "prefill"))
    assert all(r["forward_s"] < r["dt"] for r in segment if r["kind"] is not None)
    assert "host time in the model forward (ms)" in markdown({"x": summarize(segment)})
    assert len(decode_gaps(segment)) >= 11  # 12 tokens per request: 11 gaps at least
