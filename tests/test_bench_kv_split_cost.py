"""benchmarks.kv_split_cost on CPU: the split policies it times, and its rows and table (the
kernel timing itself needs a GPU: here a stand-in that costs what its splits launch)."""

from __future__ import annotations

import json

import torch

from benchmarks import kv_split_cost


def test_tile_splits_follow_each_rows_own_length():
    lengths = torch.tensor([1, 256, 257, 5000], dtype=torch.int32)
    assert kv_split_cost.tile_splits(lengths, 256, 8).tolist() == [1, 1, 2, 8]
    # a row's splits do not depend on its neighbours (the row pass's requirement)
    assert kv_split_cost.tile_splits(lengths[2:3], 256, 8).tolist() == [2]
    drawn = kv_split_cost.kv_lengths(256, 500)
    assert drawn.dtype == torch.int32 and 16 <= int(drawn.min()) and int(drawn.max()) <= 4000
    assert 300 < float(drawn.float().mean()) < 700


def test_rows_and_table_report_each_policy_against_sglangs(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self: self)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "stand-in")
    monkeypatch.setattr(kv_split_cost, "sglang_splits",
                        lambda lengths, max_splits: torch.ones_like(lengths))
    # a stand-in kernel: a fixed cost per launched split program
    monkeypatch.setattr(kv_split_cost, "time_layer",
                        lambda lengths, splits, max_splits, repeats: 0.01 * float(splits.sum()))
    kv_split_cost.main(["--out-dir", str(tmp_path), "--batches", "4", "--mean-lengths", "500",
                        "--tiles", "256"])
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["policy"] for r in rows] == ["sglang", "max", "tile256"]
    assert rows[0]["vs_sglang"] == 1.0 and rows[1]["vs_sglang"] == 8.0
    assert rows[1]["step_ms"] == rows[1]["layer_ms"] * kv_split_cost.LAYERS
    assert 1.0 <= rows[2]["vs_sglang"] <= 8.0
    assert "| 4 | 500 | max | 8.00 |" in (tmp_path / "table.md").read_text()
    assert (tmp_path / "kv_split_cost.png").stat().st_size > 0 and "git_commit" in rows[0]

