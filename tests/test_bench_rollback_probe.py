"""The rollback probe's numbers: per-kind rows from bench_serving records and /llm42_stats."""

from __future__ import annotations

import json

from benchmarks import rollback_probe


def _rec(kind: str, split: dict, **kw) -> dict:
    return {"sampling_kind": kind, "temperature": kw.get("temperature", 0.0),
            "top_p": kw.get("top_p"), "top_k": None, "min_p": None, "recompute_pct": 12.5,
            "verify_passes": 9, "output_throughput": 30.0, "duration": 60.0,
            "llm42_stats": {"by_sampling_kind": split}}


def test_windows_rolled_back_sum_every_kind_the_server_saw(tmp_path):
    split = {"top_p": {"decisions": 30, "rollbacks": 6}, "greedy": {"decisions": 10, "rollbacks": 2}}
    row = rollback_probe.kind_row(_rec("t0.7-top_p0.9", split, temperature=0.7, top_p=0.9),
                                  "t0.7-top_p0.9")
    assert (row["rollbacks"], row["decisions"]) == (8, 40)
    assert row["windows_rolled_back_pct"] == 20.0
    jsonl = tmp_path / "probe.jsonl"
    jsonl.write_text(json.dumps(_rec("greedy", {"greedy": {"decisions": 4, "rollbacks": 1}}))
                     + "\n")
    [written] = rollback_probe.write_report(jsonl, tmp_path)
    table = (tmp_path / "probe.md").read_text().splitlines()
    assert table[2].startswith("| greedy | 0.00 |") and "| 25.0 | 1 / 4 |" in table[2]
    assert (tmp_path / "probe.png").stat().st_size > 0


def test_every_kind_sends_its_sampling():
    assert set(rollback_probe.KINDS) == {"greedy", "t1.0", "t0.7-top_p0.9", "top_k50", "min_p0.05"}
    from benchmarks import bench_serving

    for argv in rollback_probe.KINDS.values():
        bench_serving.build_parser().parse_args(argv)  # flags bench_serving accepts
