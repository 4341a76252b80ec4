"""benchmarks.output_path_cost's report: CPU per thousand output tokens, against the run with
no deterministic request."""

from __future__ import annotations

from benchmarks.output_path_cost import table


def test_table_normalises_per_token_and_compares_with_the_normal_run():
    rows = [{"run": "normal only", "requests": 4, "deterministic": 0, "output_tokens": 2000,
             "wall_s": 3.0, "cpu_s": {"http": 1.0, "scheduler": 4.0}},
            {"run": "0.25 deterministic", "requests": 4, "deterministic": 1,
             "output_tokens": 1000, "wall_s": 2.0, "cpu_s": {"http": 1.5, "scheduler": 2.0}}]
    lines = table(rows).splitlines()
    assert lines[2].endswith("| 500.0 | 2000.0 |")  # no ratio on the baseline's own row
    assert lines[3].endswith("| 1500.0 (3.00x) | 2000.0 (1.00x) |")
