"""Pricing a GPU call before it runs (`benchmarks/gpu/estimate.py`), from recorded rows.
"""

from __future__ import annotations

import json

from bench_factories import result_row


def test_estimate_prices_a_planned_call_from_recorded_runs(tmp_path, capsys):
    """A GPU call is priced before it runs: starts, plus each run scaled from the recorded run
    of the same workload and config (interpolated between ratios, by prompt count), unknown
    runs flagged; exit 1 when it does not fit."""
    from benchmarks.gpu import estimate

    model = "/x/Llama-3.1-8B-Instruct-dummy"
    n1024, n512 = dict(model=model, workload="sharegpt n=1024"), dict(model=model,
                                                                       workload="sharegpt n=512")
    recorded = [result_row("nondet", 0.0, 1.0, **n1024, duration=30.0),
                result_row("llm42", 0.1, 1.0, **n1024, duration=40.0),
                result_row("llm42", 1.0, 1.0, **n512, duration=35.0, timestamp="2"),
                result_row("llm42", 1.0, 1.0, **n512, duration=99.0,
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
    plan.write_text(json.dumps(argv[:6] + ["--configs", "nondet", "--repeats", "3", "--workload",
                                           "--dataset-name sharegpt --num-prompts 1024"]))
    assert estimate.main([str(plan), "--budget-s", "1000", *base]) == 0  # one start, 3 runs
    lines = capsys.readouterr().out.splitlines()
    assert [float(ln.split()[2]) for ln in lines[:-1]] == [5, 50, 30, 30, 30]
    assert "ratio 0 repeat 2" in lines[-2]
    # --prestart-next: every start after the first has its imports done
    plan.write_text(json.dumps(argv + ["--prestart-next"]))
    assert estimate.main([str(plan), "--budget-s", "1000", *base,
                          "--prestarted-start-s", "20"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [float(ln.split()[2]) for ln in lines[:-1]][:5] == [5, 50, 60, 20, 80]
    assert "start llm42-w64 (prestarted)" in lines[3]


def test_estimate_prices_each_window_of_a_sweep_from_its_own_rows(tmp_path):
    """A window sweep's runs differ by window (W = 16 pays passes, W = 128 re-decoded tails):
    each is priced from the rows of its window, any window's rows standing in for one never
    recorded."""
    from benchmarks.gpu import estimate

    rows = [{**result_row("llm42", 1.0, 1.0, workload="sharegpt n=512", duration=d,
                          window_size=w, timestamp=t), "_file": "f"}
            for w, d, t in ((16, 37.0, "2"), (64, 22.0, "1"))]
    assert [estimate.price_run(rows, "m", "sharegpt n=512", "llm42", 1.0,
                               {"window_size": w}, 77.0)[0] for w in (16, 64)] == [37.0, 22.0]
    # W = 32 never ran: the newest row of any window (W = 16's), scaled to the prompt count
    assert estimate.price_run(rows, "m", "sharegpt n=1024", "llm42", 1.0,
                              {"window_size": 32}, 77.0)[0] == 74.0


def test_estimate_prices_a_proof_from_the_recorded_proof_of_its_model(tmp_path):
    """A determinism proof: its start, then each mode's trials from the newest recorded proof
    of the same model (the mean trial at the nearest background level, scaled by requests x
    tokens); a speculative server priced as one without, flagged, until one is recorded."""
    from benchmarks.gpu import estimate

    def proof(timestamp, seconds, server_args="--enable-llm42"):
        trials = [{"repeat": 0, "background": b, "seconds": s}
                  for b, s in ((0, seconds), (16, 2.0), (0, seconds + 2.0))]
        return {"timestamp": timestamp, "model": "/t/smollm2-135m-real", "num_requests": 8,
                "max_new_tokens": 256, "server_args": server_args,
                "runs": [{"mode": "llm42", "trials": trials},
                         {"mode": "control", "trials": trials[:1]}]}

    for name, recorded in (("old", proof("1", 99.0)), ("new", proof("2", 10.0))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "proof.json").write_text(json.dumps(recorded))
    proofs = estimate.recorded_proofs(tmp_path)
    argv = ["--launch", "--model-path", "/r/smollm2-135m-real", "--mode", "both",
            "--background", "0,64", "--repeats", "1", "--num-prompts", "4",
            "--max-new-tokens", "128", "--out-dir", "run/proof-spec/ngram",
            "--server-args", "--enable-llm42 --speculative-algorithm NGRAM"]
    start, llm42, control = estimate.price_proof(argv, proofs, 60.0, 30.0)
    assert (start.what, start.seconds) == ("start proof ngram", 60.0)
    # 12 requests x 128 tokens = 0.75 x the recorded 8 x 256; background 0: the mean of 10 and
    # 12 s, 64: the nearest recorded level (16)
    assert llm42.seconds == 0.75 * (11.0 + 2.0) and control.seconds == 0.75 * (10.0 + 10.0)
    assert "new/proof.json x 0.75" in llm42.source and "without NGRAM: a guess" in llm42.source
    other = estimate.price_proof([*argv[:2], "/r/llama", *argv[3:]], proofs, 60.0, 30.0)
    assert other[1].seconds == 2 * 30.0 and "a guess" in other[1].source
