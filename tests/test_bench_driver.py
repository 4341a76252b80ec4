"""The driver's loop (`benchmarks/driver.py`) without SGLang: fake servers and benchmarks log
starts, stops, runs and mode switches; skipped rows say why.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from bench_factories import read_results, result_row

from benchmarks.metrics import schema_problems


class _FakeServer:
    """Stands in for llm42.server_process.SGLangServer: remembers its flags, starts nothing."""

    def __init__(self, model_path, flags, **kwargs):
        self.flags, self.url = list(flags), "http://fake"
        self.args = [sys.executable, "-m", "sglang.launch_server", *self.flags]


class _Reply:
    """A requests.Response stand-in for POST /llm42_benchmark_mode."""

    def __init__(self, body, status=200):
        self.body, self.status_code = body, status

    def json(self):
        return self.body


def _switching_driver(monkeypatch, events: list, answer):
    """The driver with fake servers and benchmarks that log starts, stops, benchmarks and mode
    switches into `events`; `answer(mode)` is the server's reply to a switch."""
    import requests

    from benchmarks import driver
    from benchmarks.env_info import append_jsonl
    from llm42 import server_process

    class FakeServer(_FakeServer):
        def start(self):
            events.append(("start", " ".join(self.flags)))

        def stop(self):
            events.append(("stop",))

    def fake_post(url, json=None, timeout=None):
        events.append(("mode", json))
        return answer(json)

    def fake_bench(self, cfg, url, wl, ratio, repeat=0):
        events.append(("bench", cfg.label, ratio))
        append_jsonl(self.results, result_row(cfg.config, ratio, 10.0, server_label=cfg.label,
                                              **{k: v for k, v in cfg.meta.items()
                                           if k != "benchmark_mode"}))

    monkeypatch.setattr(server_process, "SGLangServer", FakeServer)
    monkeypatch.setattr(driver.Driver, "bench", fake_bench)
    monkeypatch.setattr(requests, "post", fake_post)
    return driver


def test_driver_says_which_deadline_stopped_an_unfinished_benchmark(tmp_path, monkeypatch):
    """A client killed at the call's deadline was not a failing client: the row says it ran
    out of time, and whose."""
    import subprocess

    from benchmarks import driver
    from llm42 import server_process

    class FakeServer(_FakeServer):
        def start(self):
            pass

        def stop(self):
            pass

    timeouts, run = [], subprocess.run

    def killed_client(argv, timeout=None, **kwargs):
        if "benchmarks.bench_serving" not in argv:  # git, for the rows' commit
            return run(argv, timeout=timeout, **kwargs)
        timeouts.append(timeout)
        raise subprocess.TimeoutExpired(argv, timeout)

    monkeypatch.setattr(server_process, "SGLangServer", FakeServer)
    monkeypatch.setattr(driver.subprocess, "run", killed_client)
    base = ["--model-path", "m", "--configs", "llm42", "--det-ratios", "1.0",
            "--window-sizes", "8", "--min-config-s", "0"]
    assert driver.main(base + ["--out-dir", str(tmp_path / "a"), "--budget-s", "300"]) == 0
    assert driver.main(base + ["--out-dir", str(tmp_path / "b"), "--budget-s", "300",
                               "--bench-timeout", "5"]) == 0
    [budget_row], [bench_row] = read_results(tmp_path / "a"), read_results(tmp_path / "b")
    assert 290 < timeouts[0] <= 300 and timeouts[1] == 5
    assert budget_row["skip_reason"].startswith("not finished: stopped after 30")
    assert budget_row["skip_reason"].endswith("when the time budget (--budget-s 300) ran out")
    assert bench_row["skip_reason"] == (
        "not finished: stopped after 5 s, when --bench-timeout ran out")
    assert budget_row["server_label"] == "llm42-w8" and schema_problems(budget_row) == []


def test_driver_runs_every_workload_on_each_server_start(tmp_path, monkeypatch):
    """One server start per config, every workload benchmarked on it, one skipped row per
    workload for a config whose server does not start, and a table normalised per workload."""
    from benchmarks import driver
    from benchmarks.env_info import append_jsonl
    from llm42 import server_process

    events = []

    class FakeServer(_FakeServer):
        def start(self):
            events.append(("start", " ".join(self.flags)))
            if "--enable-deterministic-inference" in self.flags:
                raise server_process.SGLangServerError("exited with code 1")

        def stop(self):
            events.append(("stop",))

        def log_text(self):
            return "ValueError: 'torch_native' is not supported for deterministic inference"

    def fake_bench(self, cfg, url, wl, ratio, repeat=0):
        dataset = wl[1]
        events.append(("bench", cfg.label, dataset, ratio))
        tps = {"nondet": 100.0, "llm42": 80.0}[cfg.config] * (2 if dataset == "sharegpt" else 1)
        append_jsonl(self.results, result_row(cfg.config, ratio, tps, dataset=dataset,
                                              workload=driver.workload_label(wl, self.bench_args),
                                              **cfg.meta))

    monkeypatch.setattr(server_process, "SGLangServer", FakeServer)
    monkeypatch.setattr(driver.Driver, "bench", fake_bench)
    assert driver.main([
        "--model-path", "m", "--out-dir", str(tmp_path), "--configs", "nondet,sglang-det,llm42",
        "--det-ratios", "0.5", "--window-sizes", "8", "--verify-batch-size", "4",
        "--workload", "--dataset-name random --random-input-len 8 --random-output-len 4",
        "--workload", "--dataset-name sharegpt", "--bench-args", "--num-prompts 6"]) == 0
    assert events == [
        ("start", ""), ("bench", "nondet", "random", 0.0), ("bench", "nondet", "sharegpt", 0.0),
        ("stop",), ("start", "--enable-deterministic-inference"),
        ("start", "--enable-llm42 --llm42-window-size 8 --llm42-verify-batch-size 4"),
        ("bench", "llm42-w8", "random", 0.5), ("bench", "llm42-w8", "sharegpt", 0.5), ("stop",)]
    skipped = [r for r in read_results(tmp_path) if r["skipped"]]
    assert sorted(r["dataset"] for r in skipped) == ["random", "sharegpt"]
    assert all(r["config"] == "sglang-det" and "deterministic inference" in r["skip_reason"]
               and schema_problems(r) == [] for r in skipped)
    table = (tmp_path / "table.md").read_text()
    for dataset in ("random", "sharegpt"):
        rows = [ln for ln in table.splitlines() if ln.startswith(f"| {dataset}")]
        assert len(rows) == 3 and sum("1.000x" in ln for ln in rows) == 1, rows
        assert sum("0.800x" in ln for ln in rows) == 1, "llm42 normalised to its workload's nondet"


def test_driver_prestarts_each_next_server_and_opens_it_after_the_current_stops(tmp_path,
                                                                                monkeypatch):
    """--prestart-next: the next config's server is launched gated once the current one is up,
    opened only after the current one has stopped, and stopped unopened when the time budget
    skips its config."""
    from benchmarks import driver
    from benchmarks.env_info import append_jsonl
    from llm42 import server_process

    events, ports = [], []
    names = iter("ABCD")

    class FakeServer(_FakeServer):
        def __init__(self, model_path, flags, **kwargs):
            super().__init__(model_path, flags, **kwargs)
            self.name = next(names)
            ports.append(kwargs.get("port"))

        def prestart(self):
            events.append(("prestart", self.name))

        def start(self):
            events.append(("start", self.name))

        def stop(self):
            events.append(("stop", self.name))

    def fake_bench(self, cfg, url, wl, ratio, repeat=0):
        events.append(("bench", cfg.label))
        append_jsonl(self.results, result_row(cfg.config, ratio, 10.0, **cfg.meta))

    monkeypatch.setattr(server_process, "SGLangServer", FakeServer)
    monkeypatch.setattr(driver.Driver, "bench", fake_bench)
    assert driver.main([
        "--model-path", "m", "--out-dir", str(tmp_path), "--configs", "nondet,sglang-det,llm42",
        "--det-ratios", "0.5", "--window-sizes", "8", "--prestart-next", "--port", "30000",
        "--bench-args", "--num-prompts 6"]) == 0
    assert events == [
        ("start", "A"), ("prestart", "B"), ("bench", "nondet"), ("stop", "A"),
        ("start", "B"), ("prestart", "C"), ("bench", "sglang-det"), ("stop", "B"),
        ("start", "C"), ("bench", "llm42-w8"), ("stop", "C")]
    assert ports == [30000, None, None], "a prestarted server takes a free port of its own"

    events.clear()
    names = iter("ABCD")
    monkeypatch.setattr(driver.Driver, "expected_run_s",  # llm42's run cannot fit the budget
                        lambda self, cfg, wl, ratio: 1e9 if cfg.config == "llm42" else 1.0)
    assert driver.main([
        "--model-path", "m", "--out-dir", str(tmp_path / "budget"), "--configs", "nondet,llm42",
        "--det-ratios", "0.5", "--window-sizes", "8", "--prestart-next", "--budget-s", "600",
        "--min-config-s", "1", "--bench-args", "--num-prompts 6"]) == 0
    assert events[:3] == [("start", "A"), ("prestart", "B"), ("bench", "nondet")], events
    assert events[3:] == [("stop", "A"), ("stop", "B")], "skipped: stopped, never opened"
    skipped = [r for r in read_results(tmp_path / "budget") if r["skipped"]]
    assert [r["config"] for r in skipped] == ["llm42"], skipped


def test_driver_switches_variants_on_the_llm42_server(tmp_path, monkeypatch):
    """--switch-variants: the comparison-skipped and injected rows run on the plain llm42
    server (one start, with --llm42-benchmark-modes), each after a switch the server confirmed;
    a variant whose switch the server refuses becomes skipped rows, and the server is switched
    back at the end."""
    events = []

    def answer(mode):
        if mode["inject_mismatch_rate"] == 0.5:
            return _Reply({"error": {"message": "refused"}}, 403)
        return _Reply({"success": True, **mode})

    driver = _switching_driver(monkeypatch, events, answer)
    argv = ["--model-path", "m", "--configs", "nondet,llm42,llm42-skip-compare,llm42-inject",
            "--det-ratios", "0.1,1.0", "--variant-ratios", "1.0", "--window-sizes", "8",
            "--verify-batch-size", "4", "--inject-mismatch-rate", "0.25", "--switch-variants"]
    assert driver.main(argv + ["--out-dir", str(tmp_path / "a")]) == 0
    llm42 = "--enable-llm42 --llm42-window-size 8 --llm42-verify-batch-size 4"
    assert events == [
        ("start", ""), ("bench", "nondet", 0.0), ("stop",),
        ("start", llm42 + " --llm42-benchmark-modes"),
        ("bench", "llm42-w8", 0.1), ("bench", "llm42-w8", 1.0),
        ("mode", {"skip_compare": True, "inject_mismatch_rate": 0.0}),
        ("bench", "llm42-w8-skip", 1.0),
        ("mode", {"skip_compare": False, "inject_mismatch_rate": 0.25}),
        ("bench", "llm42-w8-inject0.25", 1.0),
        ("mode", {"skip_compare": False, "inject_mismatch_rate": 0.0}), ("stop",)]
    rows = read_results(tmp_path / "a")
    assert [(r["server_label"], r["skip_compare"], r["inject_mismatch_rate"]) for r in rows[-2:]
            ] == [("llm42-w8-skip", True, 0.0), ("llm42-w8-inject0.25", False, 0.25)]

    events.clear()
    argv[argv.index("0.25")] = "0.5"  # refused by the fake server
    assert driver.main(argv + ["--out-dir", str(tmp_path / "b")]) == 0
    assert [e for e in events if e[0] == "start"][1:] == [
        ("start", llm42 + " --llm42-benchmark-modes")]
    [refused] = [r for r in read_results(tmp_path / "b") if r["skipped"]]
    assert refused["server_label"] == "llm42-w8-inject0.5" and schema_problems(refused) == []
    assert refused["skip_reason"].startswith("benchmark mode not switched: HTTP 403")
    assert refused["benchmark_mode"] == {"skip_compare": False, "inject_mismatch_rate": 0.5}


def test_driver_sweeps_windows_on_one_server(tmp_path, monkeypatch):
    """--switch-variants with several windows: one start with the largest, each other window
    switched in before its rows (a 409 from a server still busy is retried), rows labelled
    and sized by their own window; a switch refused for good becomes skipped rows saying why,
    and the server returns to its own window at the end."""
    events, busy = [], {"left": 1}

    def answer(mode):
        if mode["window_size"] == 16 and busy["left"]:
            busy["left"] -= 1
            return _Reply({"error": {"message": "window_size cannot switch from 64 to 16 while "
                                                "1 deterministic request(s) are in flight: a "
                                                "window switch needs an idle server"}}, 409)
        return _Reply({"success": True, **mode, "max_verify_wait": mode["window_size"] // 4})

    driver = _switching_driver(monkeypatch, events, answer)
    monkeypatch.setattr(driver.time, "sleep", lambda s: events.append(("wait",)))
    argv = ["--model-path", "m", "--configs", "llm42,llm42-inject", "--det-ratios", "1.0",
            "--variant-ratios", "1.0", "--window-sizes", "16,64", "--verify-batch-size", "4",
            "--inject-mismatch-rate", "0.5", "--switch-variants"]
    assert driver.main(argv + ["--out-dir", str(tmp_path / "a")]) == 0
    plain, inject = ({"skip_compare": False, "inject_mismatch_rate": rate} for rate in (0.0, 0.5))
    assert events == [
        ("start", "--enable-llm42 --llm42-window-size 64 --llm42-verify-batch-size 4 "
                  "--llm42-benchmark-modes"),
        ("bench", "llm42-w64", 1.0),
        ("mode", {**plain, "window_size": 16}), ("wait",),  # busy once: asked again
        ("mode", {**plain, "window_size": 16}), ("bench", "llm42-w16", 1.0),
        ("mode", {**inject, "window_size": 16}), ("bench", "llm42-w16-inject0.5", 1.0),
        ("mode", {**inject, "window_size": 64}), ("bench", "llm42-w64-inject0.5", 1.0),
        ("mode", {**plain, "window_size": 64}), ("stop",)]
    rows = read_results(tmp_path / "a")
    assert [(r["server_label"], r["window_size"], r["inject_mismatch_rate"]) for r in rows] == [
        ("llm42-w64", 64, 0.0), ("llm42-w16", 16, 0.0), ("llm42-w16-inject0.5", 16, 0.5),
        ("llm42-w64-inject0.5", 64, 0.5)]

    events.clear()
    busy["left"] = 10**6  # busy for good: given up after SWITCH_BUSY_WAIT_S
    monkeypatch.setattr(driver, "SWITCH_BUSY_WAIT_S", 0.0)
    assert driver.main(argv + ["--out-dir", str(tmp_path / "b")]) == 0
    assert [e[1] for e in events if e[0] == "bench"] == ["llm42-w64", "llm42-w64-inject0.5"]
    skipped = [r for r in read_results(tmp_path / "b") if r["skipped"]]
    assert [(r["server_label"], r["window_size"]) for r in skipped] == [
        ("llm42-w16", 16), ("llm42-w16-inject0.5", 16)]
    for row in skipped:
        assert row["skip_reason"].startswith("benchmark mode not switched: HTTP 409"), row
        assert "needs an idle server" in row["skip_reason"] and schema_problems(row) == []


def test_driver_timeline_records_every_server_and_summarizes_it(tmp_path, monkeypatch):
    """--timeline: every server gets --llm42-timeline-dir OUT/timeline_LABEL, and what it wrote
    there is summarized (timeline.md) once the server stopped."""
    from benchmarks import driver
    from llm42 import server_process

    started = []

    class FakeServer(_FakeServer):
        def start(self):
            started.append(self.flags)
            if "--llm42-timeline-dir" in self.flags:  # what the scheduler process would write
                folder = Path(self.flags[self.flags.index("--llm42-timeline-dir") + 1])
                folder.mkdir(parents=True)
                (folder / "timeline-1.jsonl").write_text("\n".join(json.dumps(r) for r in [
                    {"t": 0.0, "dt": 0.01, "kind": "decode", "passes": 0, "verify_s": 0.0},
                    {"t": 0.01, "dt": 0.02, "kind": "decode", "passes": 1, "verify_s": 0.015},
                ]) + "\n")

        def stop(self):
            assert not (tmp_path / "timeline_llm42-w8" / "timeline.md").exists(), "too early"

    monkeypatch.setattr(server_process, "SGLangServer", FakeServer)
    monkeypatch.setattr(driver.Driver, "bench", lambda *a: None)
    monkeypatch.setattr(driver.report, "write_report", lambda *a: [])
    (tmp_path / "results.jsonl").write_text("")
    (tmp_path / "table.md").write_text("")
    assert driver.main(["--model-path", "m", "--out-dir", str(tmp_path), "--timeline",
                        "--configs", "nondet,llm42", "--det-ratios", "0.1",
                        "--window-sizes", "8"]) == 0
    # the baseline records one too: its decode gaps are what llm42's are compared with
    assert started[0][-2:] == ["--llm42-timeline-dir", str(tmp_path / "timeline_nondet")]
    assert started[1][-2:] == ["--llm42-timeline-dir", str(tmp_path / "timeline_llm42-w8")]
    for label in ("nondet", "llm42-w8"):
        summary = (tmp_path / f"timeline_{label}" / "timeline.md").read_text()
        assert "1 decode gaps" in summary and "| verify | 1 |" in summary, summary


def test_driver_names_a_startup_timeout_not_a_log_line(tmp_path, monkeypatch):
    """A server still starting when its time ran out: the row says so, instead of quoting an
    'error' line that SGLang logs at every start."""
    from benchmarks import driver
    from llm42 import server_process

    class SlowServer:
        def __init__(self, model_path, flags, **kwargs):
            self.args = [sys.executable, "-m", "sglang.launch_server", *flags]

        def start(self):
            raise server_process.SGLangServerTimeout(
                "sglang.launch_server not healthy after 40 s (http://x/health); log y:\ntail")

        def stop(self):
            pass

        def log_text(self):
            return "Ignore import error when loading sglang.srt.models.inkling: No module named x"

    monkeypatch.setattr(server_process, "SGLangServer", SlowServer)
    assert driver.main(["--model-path", "m", "--out-dir", str(tmp_path), "--configs", "llm42",
                        "--det-ratios", "1.0", "--window-sizes", "16"]) == 0
    [row] = read_results(tmp_path)
    assert row["skipped"] and row["skip_reason"] == (
        "server did not start: sglang.launch_server not healthy after 40 s (http://x/health); "
        "log y:"), row["skip_reason"]
    assert driver.failure_reason(SlowServer("m", []).log_text(), "fallback") == "fallback"


def test_gpu_suite_nondet_defaults_runs_plain_sglang_as_a_user_starts_it(tmp_path,
                                                                         monkeypatch):
    """nondet-defaults next to the like-for-like nondet: the same suite flags less the pytorch
    sampler, --disable-radix-cache and disabled prefill graphs (SGLang's defaults), triton
    attention and capacity kept; its rows record those flags and the table gets its column."""
    from benchmarks.env_info import append_jsonl

    suite = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "run_gpu_suite.sh"
    env = {**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable, "OUT": str(tmp_path / "out"),
           "RUN_DIR": str(tmp_path / "run"), "JIT_CACHE": str(tmp_path / "none.tar.gz"),
           "BENCH_CONFIGS": "nondet,nondet-defaults,llm42", "DET_RATIOS": "0.1"}
    subprocess.run(["bash", str(suite), "bench-sharegpt", "bench-random1k-all"], env=env,
                   check=True, capture_output=True, timeout=120)
    plan = (tmp_path / "out" / "dry_run.jsonl").read_text().splitlines()
    [argv, every] = [json.loads(ln)[2:] for ln in plan
                     if json.loads(ln)[:2] == ["-m", "benchmarks.driver"]]
    assert "nondet-defaults" in every[every.index("--configs") + 1].split(",")
    events = []

    class FakeServer(_FakeServer):
        def start(self):
            events.append(self.flags)

        def stop(self):
            pass

    def fake_bench(self, cfg, url, wl, ratio, repeat=0):
        tps = {"nondet": 100.0, "nondet-defaults": 125.0, "llm42": 90.0}[cfg.config]
        append_jsonl(self.results, result_row(cfg.config, ratio, tps, **cfg.meta))

    driver = _switching_driver(monkeypatch, [], lambda mode: _Reply({}))
    monkeypatch.setattr("llm42.server_process.SGLangServer", FakeServer)
    monkeypatch.setattr(driver.Driver, "bench", fake_bench)
    out = tmp_path / "drive"
    assert driver.main([*argv, "--out-dir", str(out)]) == 0
    nondet, defaults, llm42 = events
    like_for_like = ["--sampling-backend", "pytorch", "--disable-radix-cache",
                     "--cuda-graph-backend-prefill=disabled"]
    for flags in (nondet, llm42):
        assert all(flag in flags for flag in like_for_like), flags
    assert not [f for f in defaults if f.split("=")[0] in (
        "--sampling-backend", "--disable-radix-cache", "--cuda-graph-backend-prefill")], defaults
    assert [f for f in nondet if f not in like_for_like] == defaults
    assert {"--attention-backend", "triton", "--max-running-requests", "--load-format",
            "dummy", "--random-seed"} <= set(defaults)
    # driver-level: the `--flag value` form is dropped with its value
    assert driver.without_like_for_like(
        ["--sampling-backend", "pytorch", "--tp", "1", "--disable-radix-cache"]) == ["--tp", "1"]
    table = (out / "table.md").read_text().splitlines()
    assert "| vs nondet | vs nondet-defaults | vs sglang-det |" in table[2]
    [row] = [ln for ln in table if "| llm42 W64" in ln]
    assert "| 0.900x | 0.720x | - |" in row, row


def test_driver_repeats_each_run_on_its_server_and_skips_a_start_it_cannot_use(tmp_path,
                                                                            monkeypatch):
    """--repeats 2: every ratio runs twice in a row on one server start, the clients share one
    rows cache and their rows are numbered; the table compares each run with the mean of
    nondet's two. A config whose start (priced at the longest start so far) and one run no
    longer fit the budget is skipped before its server starts."""
    from benchmarks import driver
    from benchmarks.env_info import append_jsonl
    from llm42 import server_process

    clock, events, clients = [1000.0], [], []
    monkeypatch.setattr(driver.time, "monotonic", lambda: clock[0])

    class FakeServer(_FakeServer):
        def start(self):
            clock[0] += 80.0  # a server start
            events.append(("start", " ".join(self.flags)))

        def stop(self):
            events.append(("stop",))

    run = subprocess.run

    def client(argv, timeout=None, **kwargs):
        if "benchmarks.bench_serving" not in argv:  # git, for the rows' commit
            return run(argv, timeout=timeout, **kwargs)
        clock[0] += 10.0
        opt = dict(itertools.pairwise(argv))
        meta = json.loads(opt["--extra-metadata"])
        clients.append((opt["--config-label"], opt["--deterministic-ratio"], opt["--rows-cache"],
                        meta.get("repeat")))
        tps = {"nondet": [100.0, 80.0], "llm42": [72.0, 90.0]}[opt["--config-label"]]
        append_jsonl(opt["--output-file"], result_row(
            opt["--config-label"], float(opt["--deterministic-ratio"]), tps[meta["repeat"]],
            **meta))
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(server_process, "SGLangServer", FakeServer)
    monkeypatch.setattr(driver.subprocess, "run", client)
    assert driver.main([
        "--model-path", "m", "--out-dir", str(tmp_path), "--configs", "nondet,llm42,sglang-det",
        "--det-ratios", "0.1", "--window-sizes", "8", "--repeats", "2", "--budget-s", "260",
        "--min-config-s", "40", "--min-run-s", "5"]) == 0
    assert [e[0] for e in events] == ["start", "stop", "start", "stop"]  # no sglang-det start
    assert [(c[0], c[1], c[3]) for c in clients] == [
        ("nondet", "0", 0), ("nondet", "0", 1), ("llm42", "0.1", 0), ("llm42", "0.1", 1)]
    assert len({c[2] for c in clients}) == 1 and not Path(clients[0][2]).exists()
    rows = read_results(tmp_path)
    [skipped] = [r for r in rows if r["skipped"]]
    assert skipped["config"] == "sglang-det" and "needed to start a server and run once" in (
        skipped["skip_reason"]) and "(60 s left, 85 s needed" in skipped["skip_reason"]
    table = (tmp_path / "table.md").read_text()
    first = [ln for ln in table.splitlines() if "llm42" in ln and "(run 1)" in ln]
    second = [ln for ln in table.splitlines() if "llm42" in ln and "(run 2)" in ln]
    assert len(first) == len(second) == 1
    assert "| 0.800x |" in first[0] and "| 1.000x |" in second[0], table  # nondet's mean: 90
    with pytest.raises(SystemExit, match="--repeats must be at least 1"):
        driver.main(["--model-path", "m", "--out-dir", str(tmp_path / "x"), "--repeats", "0"])


def test_driver_prices_each_run_from_recorded_runs_before_starting_it(tmp_path, monkeypatch):
    """A run whose recorded duration (benchmarks/results/, via benchmarks.gpu.estimate) does not
    fit the time left is not started, nor is the server it would need: sglang-det's ~100 s run
    after a start of 80 s with 150 s left."""
    from benchmarks import driver
    from benchmarks.env_info import append_jsonl
    from benchmarks.gpu import estimate
    from llm42 import server_process

    clock, started, ran = [0.0], [], []
    monkeypatch.setattr(driver.time, "monotonic", lambda: clock[0])
    recorded = [{**result_row(c, 0.0, 1.0, model="/x/m", workload="sharegpt n=500",
                              duration=d), "_file": "f"}
                for c, d in (("nondet", 10.0), ("sglang-det", 50.0))]
    monkeypatch.setattr(estimate, "recorded_rows", lambda root=None: recorded)

    class FakeServer(_FakeServer):
        def start(self):
            clock[0] += 80.0
            started.append(self.flags)

        def stop(self):
            pass

    def fake_bench(self, cfg, url, wl, ratio, repeat=0):
        clock[0] += 20.0
        ran.append(cfg.config)
        append_jsonl(self.results, result_row(cfg.config, ratio, 1.0))

    monkeypatch.setattr(server_process, "SGLangServer", FakeServer)
    monkeypatch.setattr(driver.Driver, "bench", fake_bench)
    base = ["--model-path", "/y/m", "--configs", "nondet,sglang-det", "--min-config-s", "10",
            "--min-run-s", "5", "--workload", "--dataset-name sharegpt --num-prompts 1000"]
    assert driver.main(base + ["--out-dir", str(tmp_path / "a"), "--budget-s", "250"]) == 0
    # nondet: 80 s start + 20 s run; sglang-det needs 80 + 0.9 x 100 (its 500-prompt run x 2)
    assert ran == ["nondet"] and len(started) == 1
    [skipped] = [r for r in read_results(tmp_path / "a") if r["skipped"]]
    assert "(150 s left, 170 s needed" in skipped["skip_reason"], skipped["skip_reason"]
    clock[0], ran[:] = 0.0, []
    assert driver.main(base + ["--out-dir", str(tmp_path / "b"), "--budget-s", "270"]) == 0
    assert ran == ["nondet", "sglang-det"]
