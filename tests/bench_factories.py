"""Result rows for the tests of `benchmarks/`: a synthetic JSONL row, and the rows a run wrote."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.metrics import empty_summary


def result_row(config: str, ratio: float, out_tps: float | None, **kw) -> dict:
    """A row with every required key (`benchmarks.metrics.REQUIRED_KEYS`); `kw` overrides."""
    row = {"dataset": "random", "workload": "random 8/4 n=6", "model": "m", "config": config,
           "window_size": None, "verify_batch_size": None, "det_ratio": ratio,
           "skip_compare": None, "inject_mismatch_rate": None, "num_prompts": 6,
           "request_rate": "inf", "max_concurrency": None, **empty_summary(),
           "recompute_pct": None, "rollbacks": None, "verify_passes": None, "gpu": "cpu",
           "git_commit": None, "command": "x", "timestamp": "t", "skipped": False,
           "skip_reason": None}
    row.update(output_throughput=out_tps, completed=6 if out_tps else 0, **kw)
    return row


def read_results(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
