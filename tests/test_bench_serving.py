"""The serving benchmark client (`benchmarks/bench_serving.py`): the seeded deterministic
subset, and no row when there is no server.
"""

from __future__ import annotations

import pytest

from benchmarks.bench_serving import choose_deterministic


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


def test_warmup_keeps_each_requests_flag_and_adds_a_window_for_llm42():
    """Warm-up requests are the run's first ones, cut to 16 new tokens, deterministic where the
    run's are; an llm42 server gets one deterministic request past a window as well."""
    from benchmarks.bench_serving import warmup_inputs
    from benchmarks.request_funcs import RequestInput

    inputs = [RequestInput(f"p{i}", 3, 40 if i else 8, "m", 0.0, is_deterministic=i % 3 == 1,
                           send_flag=True) for i in range(6)]
    warm = warmup_inputs(inputs, 4, window=64)
    assert [w.prompt for w in warm] == ["p0", "p1", "p2", "p3", "p0"]
    assert [w.output_len for w in warm] == [8, 16, 16, 16, 66]
    assert [w.is_deterministic for w in warm] == [False, True, False, False, True]
    plain = warmup_inputs(inputs, 2, window=None)
    assert [(w.prompt, w.is_deterministic) for w in plain] == [("p0", False), ("p1", True)]
