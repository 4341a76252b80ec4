"""benchmarks.lm_head_cost on CPU: a row per (N, variant), the table and the plot, and variants
that compute what llm42's LM head computes."""

from __future__ import annotations

import json

import torch

from benchmarks import lm_head_cost
from llm42.sglang.fp32_logits import fp32_matmul


def test_rows_table_and_plot(tmp_path):
    assert lm_head_cost.main(["--out-dir", str(tmp_path), "--preset", "tiny", "--device", "cpu",
                              "--batch-sizes", "1,8", "--iters", "2", "--warmup", "1"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [(r["batch_size"], r["variant"], r["det_rows"]) for r in rows] == [
        (1, "bf16", 0), (1, "fp32-all", 1), (1, "fp32-det-0.1", 1), (1, "one-gemm-0.1", 1),
        (1, "fp32-det-1", 1), (1, "one-gemm-1", 1),
        (8, "bf16", 0), (8, "fp32-all", 8), (8, "fp32-det-0.1", 1), (8, "one-gemm-0.1", 1),
        (8, "fp32-det-1", 8), (8, "one-gemm-1", 8)]
    assert all(isinstance(r["bf16_is_rounded_fp32"], bool) for r in rows)
    assert all(r["ms"] > 0 and r["device"].startswith("cpu") for r in rows)
    assert "| 8 | fp32-det-0.1 | 1 |" in (tmp_path / "table.md").read_text()
    assert (tmp_path / "lm_head_cost.png").stat().st_size > 0


def test_variants_compute_the_logits_they_time():
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 32, generator=g).to(torch.bfloat16)
    hidden = torch.randn(10, 32, generator=g).to(torch.bfloat16)
    fns = lm_head_cost.variants(hidden, weight, [0.2])
    bf16 = fns["bf16"][0]()
    assert torch.equal(bf16, torch.matmul(hidden, weight.t()).float())
    assert torch.equal(fns["fp32-all"][0](), fp32_matmul(hidden, weight))
    det, num_det = fns["fp32-det-0.2"]
    mixed = det()
    assert num_det == 2
    assert torch.equal(mixed[[0, 5]], fp32_matmul(hidden[[0, 5]], weight))
    others = [i for i in range(10) if i not in (0, 5)]
    assert torch.equal(mixed[others], bf16[others])
    one, num_one = fns["one-gemm-0.2"]
    single = one()
    full = fp32_matmul(hidden, weight)
    assert num_one == 2 and torch.equal(single[[0, 5]], full[[0, 5]])
    assert torch.equal(single[others], full[others].to(torch.bfloat16).float())
    assert lm_head_cost.bf16_is_rounded_fp32(hidden, weight) == torch.equal(
        torch.matmul(hidden, weight.t()), full.to(torch.bfloat16))
