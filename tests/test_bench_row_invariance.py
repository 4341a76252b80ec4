"""The row-invariance benchmark (issue 34 step 1) on CPU with tiny shapes: the JSONL rows, table
and plot, CUDA-only kernels skipped with their reason, the bitwise checks catching kernels whose
rows depend on the batch, the pass-cost arithmetic, and the row-invariant Triton GEMM in
Triton's interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from itertools import product
from pathlib import Path

import pytest
import torch

from benchmarks import row_invariance as ri
from benchmarks import row_invariance_attention as att
from benchmarks import row_invariance_report as rep

CPU = torch.device("cpu")
TIMING = {"device": CPU, "warmup": 0, "iters": 1, "deadline": None}


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny ops on a shared 2-core host: a second intra-op thread only spins (50x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_tiny_cpu_run_writes_rows_table_and_plot(tmp_path):
    argv = ["--out-dir", str(tmp_path), "--preset", "tiny", "--device", "cpu", "--quick",
            "--m-grid", "1,5", "--max-rows", "64", "--buckets", "32,64",
            "--fill-levels", "low=0.3,full=1.0"]
    assert ri.main(argv) == 0
    rows = [json.loads(ln) for ln in (tmp_path / ri.JSONL).read_text().splitlines()]
    gemm = [r for r in rows if r["kind"] == "gemm"]
    assert [(r["kernel"], r["linear"], r["m"], r["case"]) for r in gemm] == list(
        product(ri.KERNELS, ri.LINEARS, [1, 5, 32, 64], ri.CASES))
    for r in gemm:
        assert r["preset"] == "tiny" and r["git_commit"] and r["max_rows"] == 64
        if r["kernel"] != "cublas":  # Triton kernels: CUDA only
            assert r["skipped"] and "needs CUDA" in r["skip_reason"] and r["ms"] is None
            continue
        assert not r["skipped"] and r["ms"] > 0 and r["graphed"] is False
        if r["case"] == "offset" and r["m"] == 64:  # 64 rows fill the batch: nowhere to move
            assert r["bitwise"] is None and "n/a" in r["note"]
        else:
            assert isinstance(r["bitwise"], bool) and r["rows_differing"] >= 0
    assert {r["kernel_note"] for r in gemm if r["kernel"] == "cublas"} == {
        "fp32 output: upcast"}  # no torch.mm(out_dtype=...) on CPU
    costs = [r for r in rows if r["kind"] == "pass-cost"]
    fixed = {r["fill_level"]: r for r in costs if r["policy"] == "fixed"}
    assert fixed["full"]["real_rows"] == 64 and fixed["low"]["real_rows"] == 19
    assert fixed["full"]["pass_rows"] == 64 and fixed["full"]["vs_today"] == pytest.approx(1.0)
    attention = [r for r in rows if r["kind"] == "attention"]
    assert {r["kernel"] for r in attention} == set(att.KERNELS)
    for r in attention:
        if r["kernel"] == "torch_native-sdpa":  # SGLang's CPU backend runs here
            assert not r["skipped"] and isinstance(r["bitwise"], bool)
            assert r["max_abs_err_vs_fp32"] < 0.05, r  # the harness feeds the right KV
        else:
            assert r["skipped"] and "needs CUDA" in r["skip_reason"]
    [summary] = [r for r in rows if r["kind"] == "summary"]
    assert set(summary["phase_seconds"]) == {"gemm", "attention"}
    table = (tmp_path / "table.md").read_text()
    assert "--max-rows 64" in table and "## Attention" in table and "needs CUDA" in table
    assert "| cublas | qkv |" in table and "| low | 19 | cublas | bucket |" in table
    assert (tmp_path / "row_invariance.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _rowwise(x, w):
    """x @ w.T one output element at a time: each row's bits depend on that row alone on any
    CPU. (F.linear's are not guaranteed: a host's fp32 GEMM gave rows of 3 and 16 that
    differed by 2.4e-7.)"""
    return (x.float().unsqueeze(1) * w.float().unsqueeze(0)).sum(-1)


def _linear(x, w, out_dtype):
    return _rowwise(x, w).to(out_dtype)


def _by_m_size(x, w, out_dtype):
    """Rows that depend on how many rows the GEMM has."""
    out = _rowwise(x, w)
    out[:, 0] += x.shape[0]
    return out.to(out_dtype)


def _by_position(x, w, out_dtype):
    """Rows that depend on where they sit in the batch."""
    out = _rowwise(x, w)
    out[:, 0] += torch.arange(x.shape[0], dtype=out.dtype)
    return out.to(out_dtype)


@pytest.mark.parametrize("fn, expect", [
    (_linear, {"prefix": True, "permuted": True, "offset": True}),
    (_by_m_size, {"prefix": False, "permuted": False, "offset": True}),  # 16 rows as in ref
    (_by_position, {"prefix": True, "permuted": False, "offset": False}),
])
def test_check_linear_reports_rows_that_depend_on_the_batch(fn, expect):
    gen = torch.Generator().manual_seed(0)
    x, mates = (torch.randn(16, 8, generator=gen).to(torch.bfloat16) for _ in range(2))
    w = torch.randn(12, 8, generator=gen).to(torch.bfloat16)
    rows = ri.check_linear(fn, [w, w.clone()], x, mates, [3, 16], torch.float32, TIMING, 0)
    got = {(r["m"], r["case"]): r["bitwise"] for r in rows}
    for case, ok in expect.items():
        assert got[(3, case)] is ok, (case, rows)
    assert got[(16, "prefix")] is True and got[(16, "offset")] is None
    assert all(r["rows_differing"] == 0 for r in rows if r["bitwise"])
    bad = [r for r in rows if r["bitwise"] is False]
    assert all(r["rows_differing"] > 0 and r["max_abs_diff"] > 0 for r in bad)


def test_a_kernel_that_raises_is_skipped_from_then_on():
    calls = []

    def flaky(x, w, out_dtype):
        calls.append(x.shape[0])
        if x.shape[0] == 5:
            raise RuntimeError("no kernel for 5 rows")
        return _linear(x, w, out_dtype)
    x = torch.randn(16, 8).to(torch.bfloat16)
    w = torch.randn(4, 8).to(torch.bfloat16)
    rows = ri.check_linear(flaky, [w], x, x, [1, 5, 16], torch.bfloat16, TIMING, 0)
    reasons = {r["m"]: r["skip_reason"] for r in rows}
    assert reasons[1] is None and "no kernel for 5 rows" in reasons[5]
    assert "no kernel for 5 rows" in reasons[16] and calls[-1] == 5  # not run after


def _reference_attention(b: att.Packed, scale: float) -> torch.Tensor:
    """fp32 attention one query row at a time over its request's KV: row-invariant."""
    out = torch.empty_like(b.q)
    for i in range(len(b.prefix_lens)):
        slots = b.full_indices[b.full_indptr[i]:b.full_indptr[i + 1]]
        first = int(b.prefix_lens[i])
        for j in range(int(b.extend_lens[i])):
            row = int(b.qo_indptr[i]) + j
            kv = slots[:first + j + 1]
            out[row] = att.fp32_attention(b.q[row:row + 1], b.k_buffer[kv], b.v_buffer[kv],
                                          first + j, scale)[0]
    return out


def _split_dependent(b: att.Packed, scale: float) -> torch.Tensor:
    """Rows that depend on where their request's extend starts."""
    out = _reference_attention(b, scale).float()
    out += torch.repeat_interleave(b.prefix_lens, b.extend_lens)[:, None, None] * 1e-2
    return out.to(b.q.dtype)


def test_attention_cases_tell_batch_mates_from_split_dependence():
    shape = ri.PRESETS["tiny"]
    heads = (shape["heads"], shape["kv_heads"], shape["head_dim"])
    case_list = att.cases(40, 64)
    seqs = {n: att.make_seq(n, length, heads, CPU, seed=i)
            for i, (n, length) in enumerate(sorted(att.seq_lengths(case_list).items()))}
    scale = shape["head_dim"] ** -0.5
    honest = {r["case"]: r for r in att.check_cases(_reference_attention, case_list, seqs,
                                                    scale, CPU)}
    assert all(r["bitwise"] for r in honest.values()), honest
    assert max(r["max_abs_err_vs_fp32"] for r in honest.values()) < 1e-2
    split = {r["case"]: r["bitwise"] for r in att.check_cases(_split_dependent, case_list, seqs,
                                                               scale, CPU)}
    for case, ok in split.items():
        assert ok is case.startswith("batched"), (case, split)


def test_pass_costs_use_only_the_buckets_every_linear_holds():
    """cuBLAS rows equal the 512 rows at 256 and 512 but not 192; the row-invariant kernel
    everywhere. 31 % of 512 rows = 159: cuBLAS pads to 256, the row-invariant kernel to 192."""
    def gemm(kernel, linear, m, ms, ok=True):
        return {"kind": "gemm", "kernel": kernel, "linear": linear, "m": m, "case": "prefix",
                "ms": ms, "bitwise": ok, "skipped": False}
    rows = []
    for m in (160, 192, 256, 512):
        for linear in (*rep.PER_LAYER, rep.HEAD):
            rows.append(gemm("cublas", linear, m, m / 512, ok=m != 192))
            rows.append(gemm("row-invariant", linear, m, 2 * m / 512))
    costs = rep.pass_costs(rows, layers=2, buckets=[192, 256, 512], max_rows=512,
                           fills={"s": 0.31})
    got = {(r["kernel"], r["policy"]): r for r in costs}
    today = 2 * 4 + 1  # two layers of four GEMMs + the head, 1 ms each at 512 rows
    assert got[("cublas", "fixed")]["pass_ms"] == pytest.approx(today)
    assert got[("cublas", "bucket")]["pass_rows"] == 256
    assert got[("cublas", "bucket")]["vs_today"] == pytest.approx(0.5)
    assert ("cublas", "exact") not in got  # not invariant at 192
    assert got[("row-invariant", "bucket")]["pass_rows"] == 192
    assert got[("row-invariant", "exact")]["pass_rows"] == 160
    assert got[("row-invariant", "exact")]["vs_today"] == pytest.approx(2 * 160 / 512)
    mixed = got[("mixed", "bucket-mixed")]
    assert set(mixed["kernels_per_linear"].values()) == {"row-invariant"}  # cuBLAS fails 192


def test_grid_and_ranges():
    assert ri.parse_grid("1-4,8-16/4,20") == [1, 2, 3, 4, 8, 12, 16, 20]
    grid = ri.parse_grid(ri.DEFAULT_GRID)
    assert len(grid) == 120 and grid[63:66] == [64, 72, 80] and grid[-1] == 512
    assert rep.ranges(grid, set(grid[31:])) == "32-512"
    assert rep.ranges([1, 2, 3, 6, 7, 8], {1, 2, 7}) == "1-2, 7"
    assert ri.weight_copies(4096, 6144, 32, 256) == 6 and ri.weight_copies(4096, 128256, 32,
                                                                           256) == 1


def test_row_invariant_gemm_in_the_triton_interpreter():
    """The kernel's indexing (edges of M, N and K tiles) on CPU: Triton's interpreter runs it
    with fp16 operands (it computes bf16 wrongly); rows equal whatever M."""
    code = """
import torch
from benchmarks.row_invariant_mm import row_invariant_linear
gen = torch.Generator().manual_seed(0)
x = torch.randn(70, 96, generator=gen).half()
w = torch.randn(200, 96, generator=gen).half()
out = row_invariant_linear(x, w, torch.float32)
err = (out - torch.nn.functional.linear(x.float(), w.float())).abs().max().item()
assert err < 1e-3, err
assert torch.equal(row_invariant_linear(x[:5], w, torch.float32), out[:5])
assert torch.equal(row_invariant_linear(x[3:68], w, torch.float32), out[3:68])
assert row_invariant_linear(x, w).dtype == torch.float16
print("ok")
"""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120, cwd=root, check=False)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]
