"""Results JSONL -> tables and plots (`benchmarks/report.py`), on synthetic rows.
"""

from __future__ import annotations

import json

from bench_factories import result_row

from benchmarks import report


def test_report_normalises_and_keeps_skipped_rows(tmp_path):
    llm42 = {"window_size": 8, "verify_batch_size": 4, "skip_compare": False,
             "inject_mismatch_rate": 0.0, "recompute_pct": 1.5, "rollbacks": 2,
             "verify_passes": 9}
    rows = [result_row("llm42", 1.0, 50.0, **llm42), result_row("nondet", 0.0, 100.0),
            result_row("sglang-det", 0.0, None, skipped=True, skip_reason="refused on CPU"),
            result_row("llm42", 0.5, 80.0, **llm42),
            result_row("llm42", 0.5, 70.0, **llm42, overlap_schedule=False)]
    jsonl = tmp_path / "results.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    written = report.write_report(jsonl, tmp_path)
    table = (tmp_path / "table.md").read_text()
    lines = [ln for ln in table.splitlines() if ln.startswith("| random")]
    assert [ln.split(" | ")[1] for ln in lines] == ["nondet", "sglang-det", "llm42 W8 B4",
                                                    "llm42 W8 B4", "llm42 W8 B4 no-overlap"]
    assert "0.800x" in lines[2] and "0.500x" in lines[3] and "1.000x" in lines[0]
    assert "0.700x" in lines[4]
    assert lines[2].split(" | ")[-2] == "9"  # rows of servers that did not count graphed passes
    assert "refused on CPU" in lines[1]
    for png in written[1:]:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_report_leaves_out_skipped_rows_that_another_call_ran(tmp_path):
    """Results merged from budget-limited calls: a skipped row gives way to a completed run of
    the same server, workload and ratio, and only to that."""
    llm42 = {"window_size": 8, "verify_batch_size": 4, "skip_compare": False,
             "inject_mismatch_rate": 0.0}
    skip = {"skipped": True, "skip_reason": "not run: time budget spent"}
    rows = [result_row("nondet", 0.0, 100.0, server_label="nondet"),
            result_row("llm42", 0.5, None, server_label="llm42-w8", **llm42, **skip),
            result_row("llm42", 0.5, None, server_label="llm42-w8-cap1", **llm42, **skip),
            result_row("llm42", 1.0, None, **llm42, **skip),  # written before rows had a label
            result_row("llm42", 1.0, None, **{**llm42, "skip_compare": True}, **skip),
            result_row("llm42", 0.5, 80.0, server_label="llm42-w8", **llm42),
            result_row("llm42", 1.0, 60.0, server_label="llm42-w8", **llm42)]
    kept, dropped = report.drop_superseded(rows)
    assert dropped == 2
    assert [(r.get("server_label"), r["det_ratio"], bool(r["skipped"])) for r in kept] == [
        ("nondet", 0.0, False), ("llm42-w8-cap1", 0.5, True), (None, 1.0, True),
        ("llm42-w8", 0.5, False), ("llm42-w8", 1.0, False)]
    assert kept[2]["skip_compare"] is True
    jsonl = tmp_path / "results.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report.write_report(jsonl, tmp_path)
    table = (tmp_path / "table.md").read_text()
    assert table.count("time budget spent") == 2
    assert "Skipped rows that another call ran left out: 2." in table


def test_report_labels_tell_scheduling_variants_apart():
    """Servers that differ only in when passes run get their own table rows and plot series."""
    from benchmarks.report import variant_of

    base = {"config": "llm42", "window_size": 64, "verify_batch_size": 8, "batched_prefill": True}
    stats = {"max_verify_wait": 16, "max_passes_per_step": 0, "defer_verify_on_prefill": False}
    labels = [variant_of({**base, "llm42_stats": {**stats, **change}}) for change in (
        {}, {"max_passes_per_step": 1}, {"max_passes_per_step": 1, "defer_verify_on_prefill": True},
        {"max_verify_wait": 48}, {"overlap_verify": True}, {"fold_passes": False},
        {"fold_passes": True})]
    assert labels == ["llm42 W64 B8 batched-prefill", "llm42 W64 B8 batched-prefill cap1",
                      "llm42 W64 B8 batched-prefill cap1 defer-on-prefill",
                      "llm42 W64 B8 batched-prefill wait48",
                      "llm42 W64 B8 batched-prefill overlap-verify",
                      "llm42 W64 B8 batched-prefill",
                      "llm42 W64 B8 batched-prefill fold"]
    assert variant_of({**base, "llm42_stats": None}) == labels[0]  # rows of older runs
    # the verifier and inline verification's pad ratio, where not the defaults (row-invariant's
    # own verify wait is 0); a run that never completed shows the flags it was to run with
    row = {"verifier": "row-invariant", "max_verify_wait": 0, "inline_verify": True}
    assert [variant_of({**base, "llm42_stats": {**row, "inline_pad_ratio": r}})
            for r in (2.0, 0.0)] == ["llm42 W64 B8 batched-prefill row-invariant",
                                     "llm42 W64 B8 batched-prefill row-invariant inline-pad0"]
    assert variant_of({**base, "llm42_stats": {}, "llm42_args": "--llm42-inline-pad-ratio 0"}) \
        == "llm42 W64 B8 batched-prefill --llm42-inline-pad-ratio 0"


def test_online_table_compares_normal_latency_with_nondet_at_the_same_rate(tmp_path):
    """Target 3 reads off this table: normal requests' p99 against nondet's at the same rate."""
    def online(config, rate, itl99, **kw):
        return result_row(config, 0.1 if config == "llm42" else 0.0, 100.0, request_rate=rate,
                          workload=f"sharegpt n=6 rate={rate}", normal_itl_p99_ms=itl99,
                          normal_ttft_p99_ms=2 * itl99, **kw)
    llm42 = {"window_size": 64, "verify_batch_size": 8, "verify_passes": 12,
             "llm42_stats": {"graphed_passes": 12}}
    folded = {**llm42, "llm42_stats": {"graphed_passes": 12, "folded_passes": 9}}
    rows = [online("nondet", 16, 50.0, normal_itl_p99_ci_ms=[45.0, 56.5]),
            online("llm42", 16, 55.0, **llm42),
            online("nondet", 24, 100.0), online("llm42", 24, 250.0, **folded),
            result_row("nondet", 0.0, 100.0)]  # rate inf: not an online run
    jsonl = tmp_path / "results.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    written = report.write_report(jsonl, tmp_path)
    online_part = (tmp_path / "table.md").read_text().split("## Online runs")[1]
    lines = [ln for ln in online_part.splitlines() if ln.startswith("| sharegpt")]
    assert len(lines) == 4
    by_key = {(ln.split(" | ")[0][2:], ln.split(" | ")[1]): ln for ln in lines}
    assert "| 55.0 | 1.100x |" in by_key[("sharegpt n=6 rate=16", "llm42 W64 B8")]
    assert "| 250.0 | 2.500x |" in by_key[("sharegpt n=6 rate=24", "llm42 W64 B8")]
    assert "| 12 (12 graphed) |" in (tmp_path / "table.md").read_text()
    assert "| 12 (12 graphed, 9 folded) |" in (tmp_path / "table.md").read_text()
    assert "| 50.0 [45.0, 56.5] | 1.000x |" in by_key[("sharegpt n=6 rate=16", "nondet")]
    png = tmp_path / "latency_vs_rate.png"
    assert png in written and png.read_bytes()[:4] == b"\x89PNG"
    # one rate only: the table, no load curve
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    png.unlink()
    assert png not in report.write_report(jsonl, tmp_path) and not png.exists()
    assert "## Online runs" in (tmp_path / "table.md").read_text()


def test_report_says_where_an_llm42_servers_time_went(tmp_path):
    """The step profile of each llm42 run as seconds that add up to the run: iterations by
    kind, the next-batch step (passes, drains, SGLang's batch building, llm42's own work), and
    what is outside all of them."""
    llm42 = {"window_size": 8, "verify_batch_size": 4, "skip_compare": False,
             "inject_mismatch_rate": 0.0}
    steps = {"step_time_decode_s": 20.0, "step_time_prefill_s": 30.0,
             "step_time_det_prefill_s": 1.0, "verify_time_s": 7.0}
    rows = [result_row("nondet", 0.0, 100.0, duration=60.0),
            result_row("llm42", 0.5, 50.0, duration=80.0, **llm42,
                       llm42_stats={**steps, "schedule_time_s": 20.0, "drain_time_s": 9.0,
                              "batch_build_time_s": 2.5, "inline_steps": 40,
                              "inline_launch_time_s": 4.0, "inline_sample_time_s": 2.0}),
            # a server older than the schedule timings
            result_row("llm42", 0.1, 90.0, duration=70.0, **llm42, llm42_stats=steps)]
    table = report.step_profile_table(report.sort_rows(rows))
    lines = [ln.split(" | ") for ln in table.splitlines()[2:]]
    assert len(lines) == 2, "nondet has no step profile"
    assert lines[0][2:] == ["0.10", "70.0", "20.0", "30.0", "1.0", "-", "7.0", "-", "-", "-",
                            "12.0", "- |"]
    # llm42's own host work: 20 - 7 passes - 9 drains - 2.5 SGLang batch building; 40 inline
    # steps took 4 s to launch and 2 s to sample
    assert lines[1][2:] == ["0.50", "80.0", "20.0", "30.0", "1.0", "20.0", "7.0", "9.0", "2.5",
                            "1.5", "9.0", "40: 4.0 / 2.0 |"]
    jsonl = tmp_path / "results.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report.write_report(jsonl, tmp_path)
    assert "## Where llm42's time went" in (tmp_path / "table.md").read_text()


def test_window_sweep_plots_throughput_and_recompute_per_window(tmp_path):
    """A window sweep's figure has both halves of choosing W: what each window costs in
    throughput and what a real model's mismatches cost in recomputed tokens."""
    base = {"verify_batch_size": 8, "skip_compare": False, "inject_mismatch_rate": 0.0}
    rows = [result_row("llm42", 1.0, tput, window_size=w, recompute_pct=pct, **base)
            for w, tput, pct in ((16, 3900.0, 4.8), (64, 7300.0, 16.3), (32, 5500.0, 9.0))]
    rows.append(result_row("llm42", 1.0, 9000.0, window_size=16, recompute_pct=50.0,
                           **{**base, "inject_mismatch_rate": 0.5}))  # injected: not a natural rate
    measures = report.window_sweep_series(rows)
    assert set(measures) == {"output tok/s", "recompute %"}
    (label, points), = measures["recompute %"].items()
    assert "r=1" in label and sorted(points) == [(16, 4.8), (32, 9.0), (64, 16.3)]
    assert sorted(measures["output tok/s"][label]) == [(16, 3900.0), (32, 5500.0), (64, 7300.0)]
    assert report.window_sweep_series(rows[:1]) == {}, "one window is not a sweep"
    assert report.plot_window_sweep(rows, tmp_path / "w.png")
    assert (tmp_path / "w.png").stat().st_size


def test_report_compares_speculative_servers_and_shows_their_accept_length(tmp_path):
    """spec-sharegpt's rows: plain SGLang with and without the overlap scheduler and with NGRAM,
    llm42 with and without NGRAM; every row against each baseline run, the accept length
    (deterministic and normal requests apart where both ran) on speculative servers only."""
    llm42 = {"window_size": 16, "verify_batch_size": 32}
    spec = {"speculative_algorithm": "NGRAM"}
    rows = [result_row("nondet", 0.0, 100.0), result_row("nondet-no-overlap", 0.0, 80.0),
            result_row("nondet-spec", 0.0, 160.0, spec_accept_length=2.5, **spec),
            result_row("llm42", 0.1, 90.0, **llm42),
            result_row("llm42", 0.1, 120.0, **llm42, **spec, overlap_schedule=False,
                       spec_accept_length=2.25, det_spec_accept_length=1.5,
                       normal_spec_accept_length=2.4)]
    jsonl = tmp_path / "results.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report.write_report(jsonl, tmp_path)
    table = (tmp_path / "table.md").read_text().splitlines()
    header = next(ln for ln in table if ln.startswith("| workload")).split(" | ")
    assert header[5:10] == ["vs nondet", "vs nondet-no-overlap", "vs nondet-spec",
                            "vs sglang-det", "spec accept length"]
    cells = {c[1]: c for c in (ln.split(" | ") for ln in table if ln.startswith("| random"))}
    assert list(cells) == ["nondet", "nondet-no-overlap", "nondet-spec NGRAM", "llm42 W16 B32",
                           "llm42 W16 B32 spec NGRAM no-overlap"]
    spec_llm42 = cells["llm42 W16 B32 spec NGRAM no-overlap"]
    assert spec_llm42[5:10] == ["1.200x", "1.500x", "0.750x", "-", "2.25 (det 1.50, normal 2.40)"]
    assert cells["nondet-spec NGRAM"][9] == "2.50" and cells["llm42 W16 B32"][9] == "-"
