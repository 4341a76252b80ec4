"""The verify-ceiling microbenchmark (issue 24) end to end on CPU with tiny shapes: every (N,
variant) row, CUDA-only variants skipped with their reason, the bitwise flag, table and plot."""

from __future__ import annotations

import json

from benchmarks import verify_ceiling

CUDA_ONLY = {"fused-batch-invariant", "two-streams"}


def test_tiny_cpu_run_writes_every_row_table_and_plot(tmp_path):
    argv = ["--out-dir", str(tmp_path), "--preset", "tiny", "--device", "cpu",
            "--decode-rows", "2,4", "--pass-rows", "8", "--iters", "2", "--warmup", "1"]
    assert verify_ceiling.main(argv) == 0
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [(r["decode_rows"], r["variant"]) for r in rows] == [
        (n, v) for n in (2, 4) for v in verify_ceiling.VARIANTS]
    for r in rows:
        assert r["pass_rows"] == 8 and r["layers"] == 2 and r["git_commit"] is not None
        if r["variant"] in CUDA_ONLY:
            assert r["skipped"] and r["skip_reason"] and r["ms"] is None
            continue
        assert not r["skipped"] and r["ms"] > 0 and r["graphed"] is False
        assert r["ratio_vs_decode"] > 0 and r["ratio_vs_decode_plus_pass"] > 0
    by = {(r["decode_rows"], r["variant"]): r for r in rows}
    assert by[(2, "decode")]["ratio_vs_decode"] == 1.0
    assert by[(4, "decode+pass")]["ratio_vs_decode_plus_pass"] == 1.0
    for n in (2, 4):
        assert isinstance(by[(n, "fused-cublas")]["pass_rows_bitwise_vs_alone"], bool)
        assert by[(n, "two-gemms")]["pass_rows_bitwise_vs_alone"] is None
    table = (tmp_path / "table.md").read_text()
    assert "attention" in table and "--preset tiny" in table
    assert table.count("| fused-batch-invariant |") == 2 and "needs CUDA" in table
    assert (tmp_path / "ceiling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_stack_runs_every_gemm_once_per_row_group():
    """Two row groups are two launches per weight (two-gemms), one group is one."""
    import torch

    shape = verify_ceiling.PRESETS["tiny"]
    model = verify_ceiling.make_model(shape, torch.device("cpu"), seed=0)
    parts = [verify_ceiling.make_inputs(shape, rows, torch.device("cpu"), seed=rows)
             for rows in (2, 8)]
    calls = []

    def linear(x, w):
        calls.append((x.shape[0], tuple(w.shape)))
        return torch.nn.functional.linear(x, w)

    verify_ceiling.stack(parts, *model, linear)
    per_group = 4 * shape["layers"] + 1
    assert len(calls) == 2 * per_group
    assert [rows for rows, _ in calls[:2]] == [2, 8] and calls[0][1] == calls[1][1]
    assert calls[-1][1] == (shape["vocab"], shape["hidden"])
