"""One real driver run (nondet + llm42 at ratio 0.5, windows 8 and 16 switched on one server +
sglang-det refused on CPU, each next server prestarted) on the tiny random Llama, shared by the
tests below.

That run has one workload: each workload costs a `bench_serving` process per server; the
driver's loop over several workloads per server start runs without SGLang in
`test_bench_driver.py`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_factories import read_results

from benchmarks.metrics import REQUIRED_KEYS, schema_problems

SMOKE_PROMPTS = 6


@pytest.fixture(scope="module")
def driver_run(tiny_model, tmp_path_factory) -> Path:
    from benchmarks import driver

    out = tmp_path_factory.mktemp("driver")
    code = driver.main([
        "--model-path", tiny_model, "--out-dir", str(out),
        # each next server prestarted (gated) while the current one runs: llm42's during
        # nondet's run, sglang-det's (refused on CPU when its gate opens) during llm42's
        "--configs", "nondet,llm42,llm42-inject,sglang-det", "--prestart-next",
        "--det-ratios", "0.5",
        "--window-sizes", "8,16", "--verify-batch-size", "4",
        # one llm42 start (W = 16) for both windows and the injected rows, switched at runtime
        "--switch-variants", "--variant-ratios", "1.0", "--inject-mismatch-rate", "1.0",
        # the fixed-shape verifier: the checks below count its passes and injected windows
        "--server-args", "--random-seed 7 --context-length 1024 --llm42-verifier fixed-shape",
        "--workload", ("--dataset-name random --random-input-len 32 --random-output-len 20 "
                       "--random-range-ratio 0.5"),
        "--bench-args", f"--num-prompts {SMOKE_PROMPTS} --seed 3",
        "--startup-timeout", "300"])
    assert code == 0
    return out


@pytest.mark.server
def test_driver_jsonl_schema(driver_run):
    rows = read_results(driver_run)
    by_config = sorted((r["config"], r["dataset"]) for r in rows)
    assert by_config == [("llm42", "random")] * 4 + [("nondet", "random"),
                                                     ("sglang-det", "random")]
    for row in rows:
        assert schema_problems(row) == [], (row["config"], schema_problems(row))
        assert set(REQUIRED_KEYS) <= set(row)
    for row in [r for r in rows if not r["skipped"]]:
        assert row["completed"] == row["num_prompts"] == SMOKE_PROMPTS, row.get("errors")
        assert row["output_throughput"] > 0 and row["ttft_p50_ms"] > 0
        assert row["gpu"] == "cpu" and row["command"].split()[1:3] == [
            "-m", "benchmarks.bench_serving"]
    llm42 = {r["server_label"]: r for r in rows if r["config"] == "llm42"}
    assert sorted(llm42) == ["llm42-w16", "llm42-w16-inject1", "llm42-w8", "llm42-w8-inject1"]
    for label, row in llm42.items():  # one server start, its window switched at runtime
        window = 8 if label.startswith("llm42-w8") else 16
        assert (row["window_size"], row["verify_batch_size"]) == (window, 4), "server's values"
        assert row["llm42_stats"]["max_verify_wait"] == window // 4
        assert "--llm42-window-size 16" in row["server_args"]
        assert "--llm42-benchmark-modes" in row["server_args"]
        assert row["verify_passes"] > 0
        if label != "llm42-w16":  # the server's own mode needs no switch
            assert row["benchmark_mode"]["window_size"] == window
    for label in ("llm42-w8-inject1", "llm42-w16-inject1"):
        injected = llm42[label]
        assert injected["benchmark_mode"] == {"skip_compare": False, "inject_mismatch_rate": 1.0,
                                              "window_size": injected["window_size"]}
        assert injected["inject_mismatch_rate"] == 1.0 and injected["det_ratio"] == 1.0
        stats = injected["llm42_stats"]  # every window of every request forced to mismatch
        assert stats["injected_mismatches"] >= SMOKE_PROMPTS
        assert stats["rollbacks"] >= SMOKE_PROMPTS
    for row in (llm42["llm42-w8"], llm42["llm42-w16"]):
        assert row["det_ratio"] == 0.5 and row["num_det_requests"] == 3
        assert row["det_completed"] == 3 and row["normal_completed"] == 3
        assert row["det_e2e_p50_ms"] > 0 and row["normal_e2e_p50_ms"] > 0
        assert row["skip_compare"] is False and row["inject_mismatch_rate"] == 0.0
        # one decision per verified row; each rollback drops at least its mismatched token
        assert row["rollbacks"] <= row["llm42_stats"]["verify_rows"], row["llm42_stats"]
        assert row["tokens_rolled_back"] >= row["rollbacks"]
    for row in [r for r in rows if r["config"] == "nondet"]:
        assert row["verify_passes"] is None and row["num_det_requests"] == 0


@pytest.mark.server
def test_driver_records_sglang_det_refusal_on_cpu(driver_run):
    skipped = [r for r in read_results(driver_run) if r["config"] == "sglang-det"]
    assert skipped and all(r["skipped"] for r in skipped)
    assert all("deterministic inference" in r["skip_reason"] for r in skipped), skipped[0]
    assert all("--enable-deterministic-inference" in r["command"] for r in skipped)


@pytest.mark.server
def test_driver_table_plots_and_commands(driver_run):
    table = (driver_run / "table.md").read_text()
    results, profile = table.split("\n## Where llm42's time went", 1)
    rows = [ln for ln in results.splitlines() if ln.startswith("| random")]
    assert len(rows) == 6
    # the four llm42 runs (two windows, plain and injected) say where their server's time went
    assert len([ln for ln in profile.splitlines() if ln.startswith("| random")]) == 4
    assert sum("1.000x" in ln for ln in rows) == 1, "nondet normalised to itself"
    assert all(any(c in ln for c in ("x |", "did not start")) for ln in rows)
    for name in ("throughput_vs_ratio.png", "latency.png"):
        data = (driver_run / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name
    commands = (driver_run / "commands.txt").read_text()
    assert commands.count("sglang.launch_server") == 3, "the switched rows need no start"
    assert "# server llm42-w16, prestarted: imports beside nondet's runs" in commands
    assert commands.count("benchmarks.bench_serving") == 5
    llm42_log = (driver_run / "server_llm42-w16.log").read_text()
    assert " at the start gate" in llm42_log, "llm42's scheduler did not wait for nondet's stop"
    # --report-only regenerates the same table from the JSONL
    from benchmarks import driver

    before = table
    (driver_run / "table.md").unlink()
    assert driver.main(["--report-only", "--out-dir", str(driver_run)]) == 0
    assert (driver_run / "table.md").read_text() == before
