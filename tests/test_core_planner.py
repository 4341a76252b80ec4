"""build_row / plan_passes / select_rows: fixed (B, W) verification shapes, pad rows marked."""

from __future__ import annotations

import pytest

from llm42.core import (
    PAD_TOKEN_ID,
    DetRequestState,
    InvariantError,
    VerifyPass,
    VerifyRow,
    build_row,
    fill_spare_rows,
    plan_passes,
    select_rows,
)

P = 10


def make_state(rid: str, window_size: int, u: int, n: int, finishing: bool = False):
    state = DetRequestState(
        rid=rid,
        window_size=window_size,
        num_prompt_tokens=P,
        num_verified_tokens=u,
        num_output_tokens=n,
        is_finishing=finishing,
    )
    return state, [100 + i for i in range(n)]


def assert_pass_shape(verify_pass: VerifyPass, batch_size: int, window_size: int) -> None:
    assert len(verify_pass.rows) == batch_size, f"expected {batch_size} rows"
    assert len(verify_pass.flat_input_ids) == batch_size * window_size, "input ids not B x W"
    assert len(verify_pass.flat_positions) == batch_size * window_size, "positions not B x W"
    for row in verify_pass.rows[verify_pass.num_real_rows :]:
        assert row.is_pad and row.num_real == 0 and row.prefix_len == 0, f"bad pad row {row}"
        assert row.input_ids == (PAD_TOKEN_ID,) * window_size
        assert row.positions == tuple(range(window_size))


ROW_CASES = [
    # (W, u, n, finishing) -> (input output indices, prefix_len)
    ((4, 1, 5, False), ([0, 1, 2, 3], P)),  # full window 0
    ((4, 1, 9, False), ([0, 1, 2, 3], P)),  # decoded past the window end: still window 0
    ((4, 5, 7, True), ([4, 5], P + 4)),  # window 1 cut short by EOS: 2 real, 2 pad
    ((4, 3, 5, False), ([0, 1, 2, 3], P)),  # re-verification of window 0 after a rollback
    ((1, 3, 4, False), ([2], P + 2)),  # W=1: a single input
]


@pytest.mark.parametrize(("args", "expected"), ROW_CASES)
def test_build_row(args, expected) -> None:
    window_size, u, n, finishing = args
    input_indices, prefix_len = expected
    state, output_ids = make_state("r", window_size, u, n, finishing)
    row = build_row(state, output_ids)
    num_pad = window_size - len(input_indices)
    assert row.input_ids == tuple(100 + i for i in input_indices) + (PAD_TOKEN_ID,) * num_pad
    assert row.positions == tuple(range(prefix_len, prefix_len + window_size)), "positions"
    assert (row.prefix_len, row.num_real, row.is_pad) == (prefix_len, len(input_indices), False)


def test_build_row_misuse_raises() -> None:
    state, output_ids = make_state("r", 4, 1, 5)
    with pytest.raises(InvariantError, match="list has 4"):
        build_row(state, output_ids[:-1])
    state, output_ids = make_state("r", 4, 5, 5)
    with pytest.raises(InvariantError, match="nothing to verify"):
        build_row(state, output_ids)


PASS_CASES = [
    # (num_rows, B) -> real rows per pass
    ((0, 4), []),  # nothing ready: no pass
    ((1, 4), [1]),  # fewer than B: padded with 3 dummy rows
    ((4, 4), [4]),  # exactly B: no padding
    ((9, 4), [4, 4, 1]),  # more than B: several passes, the last one padded
    ((3, 1), [1, 1, 1]),  # B=1: one pass per row
]


@pytest.mark.parametrize(("args", "expected"), PASS_CASES)
def test_plan_passes(args, expected) -> None:
    num_rows, batch_size = args
    window_size = 3
    rows = [build_row(*make_state(f"r{i}", window_size, 1, 4)) for i in range(num_rows)]
    passes = plan_passes(rows, batch_size, window_size)
    assert [p.num_real_rows for p in passes] == expected, "real rows per pass"
    for verify_pass in passes:
        assert_pass_shape(verify_pass, batch_size, window_size)
        assert verify_pass.num_pad_rows == batch_size - verify_pass.num_real_rows
    planned = [row.rid for p in passes for row in p.real_rows]
    assert planned == [row.rid for row in rows], "rows must keep their order"


def test_flat_lists_are_row_major() -> None:
    row = build_row(*make_state("a", 2, 1, 3))
    (verify_pass,) = plan_passes([row], batch_size=2, window_size=2)
    assert verify_pass.flat_input_ids == [100, 101, PAD_TOKEN_ID, PAD_TOKEN_ID]
    assert verify_pass.flat_positions == [P, P + 1, 0, 1]


def test_plan_misuse_raises() -> None:
    row = build_row(*make_state("a", 2, 1, 3))
    with pytest.raises(InvariantError, match="one real row per request"):
        plan_passes([row, row], batch_size=2, window_size=2)
    with pytest.raises(InvariantError, match="entries"):
        plan_passes([row], batch_size=2, window_size=3)
    with pytest.raises(InvariantError, match="must be >= 1"):
        plan_passes([row], batch_size=0, window_size=2)
    with pytest.raises(InvariantError, match="precede"):
        VerifyPass((VerifyRow.pad(2), row), batch_size=2, window_size=2)
    with pytest.raises(InvariantError, match="PAD_TOKEN_ID"):
        VerifyRow(rid="x", input_ids=(1, 2), positions=(0, 1), prefix_len=0, num_real=1)


@pytest.mark.parametrize(
    ("waits", "urgent", "batch_size", "max_wait", "expected"),
    [
        ([0, 1, 2], [False] * 3, 4, 3, []),  # nothing due, pass not full: keep decoding
        ([0, 1, 3], [False] * 3, 4, 3, [2, 1, 0]),  # one overdue: one pass, oldest first
        ([0, 0, 0, 0, 0], [False] * 5, 4, 3, [0, 1, 2, 3]),  # a full pass runs at once
        ([0, 0, 1], [False, True, False], 4, 3, [1, 2, 0]),  # a finish waits on row 1
        ([5, 0, 0, 0, 0, 0], [False] * 6, 4, 3, [0, 1, 2, 3]),  # due + fill, the rest waits
        ([0, 0], [False] * 2, 4, 0, [0, 1]),  # max_wait 0: every full window at once
        ([4] * 9, [False] * 9, 4, 3, list(range(9))),  # 9 due: three passes
        ([], [], 4, 3, []),
    ],
)
def test_select_rows(waits, urgent, batch_size, max_wait, expected) -> None:
    assert select_rows(waits, urgent, batch_size, max_wait) == expected


def test_select_rows_misuse_raises() -> None:
    with pytest.raises(InvariantError, match="2 waits but 1"):
        select_rows([0, 1], [False], 4, 3)


@pytest.mark.parametrize(
    "num_rows, batch_size, waits, urgent, expected",
    [
        (5, 4, [0, 3, 1, 7], [False, False, True, False], [2, 3, 1]),  # 3 spare: urgent, oldest
        (8, 8, [9, 9], [True, True], []),  # the prompt rows fill their passes: none ride along
        (9, 8, [0, 1], [False, False], [1, 0]),  # 7 spare, only 2 ready
        (2, 4, [], [], []),
    ],
)
def test_fill_spare_rows_uses_the_dummy_rows_of_prompt_passes(
    num_rows, batch_size, waits, urgent, expected
):
    assert fill_spare_rows(num_rows, waits, urgent, batch_size) == expected
