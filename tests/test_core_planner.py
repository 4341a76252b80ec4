"""build_row / plan_passes / select_jobs / cap_step_rows: fixed (B, W) verification shapes, pad
rows marked, and which ready jobs a step verifies."""

from __future__ import annotations

import pytest

from llm42.core import (
    PAD_TOKEN_ID,
    DetRequestState,
    InvariantError,
    VerifyPass,
    VerifyRow,
    build_prompt_rows,
    build_row,
    cap_step_rows,
    decide,
    num_job_rows,
    plan_passes,
    select_jobs,
)

P = 10


def make_state(rid: str, window_size: int, u: int, n: int, finishing: bool = False):
    state = DetRequestState(
        rid=rid,
        window_size=window_size,
        num_prompt_tokens=P,
        num_verified_tokens=u,
        num_output_tokens=n,
        deferred_finish="finish" if finishing else None,
    )
    return state, [100 + i for i in range(n)]


def assert_pass_shape(verify_pass: VerifyPass, batch_size: int, window_size: int) -> None:
    assert len(verify_pass.rows) == batch_size, f"expected {batch_size} rows"
    assert len(verify_pass.flat_input_ids) == batch_size * window_size, "input ids not B x W"
    assert all(len(row.positions) == window_size for row in verify_pass.rows), "not B x W"
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
    planned = [row.rid for p in passes for row in p.rows if not row.is_pad]
    assert planned == [row.rid for row in rows], "rows must keep their order"


def test_flat_lists_are_row_major() -> None:
    row = build_row(*make_state("a", 2, 1, 3))
    (verify_pass,) = plan_passes([row], batch_size=2, window_size=2)
    assert verify_pass.flat_input_ids == [100, 101, PAD_TOKEN_ID, PAD_TOKEN_ID]
    assert [row.positions for row in verify_pass.rows] == [(P, P + 1), (0, 1)]


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
def test_select_jobs_of_one_row(waits, urgent, batch_size, max_wait, expected) -> None:
    assert select_jobs([1] * len(waits), waits, urgent, batch_size, max_wait) == expected


@pytest.mark.parametrize(
    ("sizes", "waits", "urgent", "expected"),
    [  # batch_size 8, max_wait 3; a size > 1 is a pending prompt (build_prompt_rows)
        ([5, 3], [0, 0], [False] * 2, [0, 1]),  # 8 rows fill a pass: run now
        ([5, 1, 1], [0, 0, 0], [False] * 3, []),  # 7 rows, none due: wait
        ([5, 1, 1, 1, 1], [3, 0, 0, 0, 2], [False] * 5, [0, 4, 1, 2]),  # due prompt + 3 spare
        ([9, 1], [0, 4], [False] * 2, [1]),  # due window; the 9-row prompt does not fit
        ([9, 1], [4, 0], [False] * 2, [0, 1]),  # due prompt: two passes, the window rides
        ([2, 1], [0, 0], [True, False], [0, 1]),  # a finish waits on the prompt
    ],
)
def test_select_jobs_keeps_prompt_rows_together(sizes, waits, urgent, expected) -> None:
    chosen = select_jobs(sizes, waits, urgent, 8, 3)
    assert chosen == expected
    # the passes that run are the fewest that hold every due row
    due_rows = sum(sizes[i] for i in range(len(sizes)) if urgent[i] or waits[i] >= 3)
    assert sum(sizes[i] for i in chosen) <= 8 * max(-(-due_rows // 8), sum(sizes) // 8)


@pytest.mark.parametrize(
    ("sizes", "waits", "max_passes", "expected"),
    [  # batch_size 4, max_wait 3: due at 3 steps, overdue (past any cap) at 7
        ([1] * 9, [3] * 9, 0, list(range(9))),  # no cap: three passes at once
        ([1] * 9, [3] * 9, 1, [0, 1, 2, 3]),  # cap 1: one pass now, the rest next steps
        ([1] * 9, [3] * 9, 2, list(range(8))),
        ([1] * 6 + [1] * 3, [3] * 6 + [7] * 3, 1, [6, 7, 8, 0]),  # overdue first
        ([1] * 9, [7] * 9, 1, list(range(9))),  # all overdue: the cap gives way
        ([9, 1], [3, 3], 1, [0]),  # a due prompt larger than the cap runs alone
        ([9, 1], [0, 0], 1, []),  # nothing due, and the window alone would not fill a pass
        ([9, 1], [0, 0], 0, []),
        ([1] * 8, [0] * 8, 1, [0, 1, 2, 3]),  # two full passes, none due: one now
    ],
)
def test_select_jobs_pass_cap(sizes, waits, max_passes, expected) -> None:
    chosen = select_jobs(sizes, waits, [False] * len(sizes), 4, 3, max_passes)
    assert chosen == expected


@pytest.mark.parametrize(
    ("sizes", "waits", "urgent", "expected"),
    [  # batch_size 4, max_wait 3, a prefill is coming (hold): only overdue jobs (waited 7) run
        ([1] * 4, [3] * 4, [False] * 4, []),  # due and a full pass: held back
        ([1] * 2, [0] * 2, [True] * 2, []),  # a finish waits on them: still held back
        ([1] * 4, [7, 3, 3, 0], [False] * 4, [0, 1, 2, 3]),  # one overdue; the others fill it
        ([9, 1], [7, 0], [False] * 2, [0, 1]),  # an overdue prompt: its passes, filled
    ],
)
def test_select_jobs_hold_before_a_prefill(sizes, waits, urgent, expected) -> None:
    assert select_jobs(sizes, waits, urgent, 4, 3, hold=True) == expected
    assert set(expected) <= set(select_jobs(sizes, waits, urgent, 4, 3)), "hold only removes"


@pytest.mark.parametrize(
    ("sizes", "waits", "urgent", "max_rows", "expected"),
    [  # a size > 1 is a pending prompt (its rows kept together); the budget is in rows
        ([1] * 5, [0] * 5, [False] * 5, 3, [0, 1, 2]),  # three windows now, two next step
        ([1] * 4, [0, 2, 1, 0], [False] * 4, 2, [1, 2]),  # the longest waiting first
        ([1] * 4, [3, 0, 0, 5], [False, False, True, False], 2, [2, 3]),  # finishing first
        ([1, 1], [0, 0], [True, True], 1, [0]),  # finishing too: the given order breaks ties
        ([6, 1, 1], [4, 0, 0], [False] * 3, 4, [0]),  # a prompt over the budget runs alone
        ([1, 6, 1], [1, 4, 0], [False] * 3, 4, [1]),  # ...when it is the most pressing job
        ([1, 6, 1], [4, 1, 0], [False] * 3, 4, [0, 2]),  # else it waits; smaller jobs fill
        ([3, 2, 1], [2, 1, 0], [False] * 3, 4, [0, 2]),  # the 2-row prompt does not fit
        ([1, 3, 1], [2, 0, 5], [False, True, False], 4, [1, 2]),  # the docstring's example
        ([1] * 3, [0] * 3, [False] * 3, 3, [0, 1, 2]),  # exactly the budget: nothing waits
        ([], [], [], 2, []),
    ],
)
def test_cap_step_rows(sizes, waits, urgent, max_rows, expected) -> None:
    chosen = cap_step_rows(sizes, waits, urgent, max_rows)
    assert chosen == expected
    rows = sum(sizes[i] for i in chosen)
    assert rows <= max_rows or len(chosen) == 1, f"{rows} rows over a budget of {max_rows}"


def test_cap_step_rows_starves_nothing() -> None:
    """Two one-row windows become ready every step against a budget of 2 rows, so windows alone
    fill every step. A 5-row prompt that became ready at step 3, behind that step's windows,
    runs alone the next step, and no window ever waits more than one step."""
    waiting: dict[str, tuple[int, int]] = {}  # job -> (rows, step it became ready)
    ran_at, rows_at = {}, []
    for step in range(40):
        waiting.update({f"w{step}a": (1, step), f"w{step}b": (1, step)})
        if step == 3:
            waiting["prompt"] = (5, step)
        names = list(waiting)
        chosen = cap_step_rows([waiting[n][0] for n in names],
                               [step - waiting[n][1] for n in names], [False] * len(names), 2)
        assert chosen, f"step {step}: nothing ran"
        rows_at.append(sum(waiting[names[i]][0] for i in chosen))
        for i in chosen:
            ran_at[names[i]] = step
            del waiting[names[i]]
    assert ran_at["prompt"] == 4 and rows_at[4] == 5, "the prompt ran alone, over the budget"
    assert max(rows_at[:4] + rows_at[5:]) == 2
    window_waits = [ran_at[n] - int(n[1:-1]) for n in ran_at if n != "prompt"]
    assert max(window_waits) <= 1, f"a window waited {max(window_waits)} steps"


def test_cap_step_rows_misuse_raises() -> None:
    with pytest.raises(InvariantError, match="2 sizes, 1 waits"):
        cap_step_rows([1, 1], [0], [False, False], 2)
    with pytest.raises(InvariantError, match="must be >= 1"):
        cap_step_rows([1], [0], [False], 0)


def test_select_jobs_misuse_raises() -> None:
    with pytest.raises(InvariantError, match="2 waits and 1"):
        select_jobs([1, 1], [0, 1], [False], 4, 3)
    with pytest.raises(InvariantError, match="at least one row"):
        select_jobs([0], [0], [False], 4, 3)


def test_num_job_rows_counts_uncached_prompt_rows() -> None:
    for cached, rows in ((0, 3), (4, 2), (8, 1)):
        state = DetRequestState(rid="p", window_size=4, num_prompt_tokens=10, verify_prompt=True)
        state.use_cached_prompt(cached)
        state.on_first_token()
        assert state.is_prompt_pending
        assert num_job_rows(state) == rows == len(build_prompt_rows(state, list(range(10))))
        state.append_candidates(5)  # decoding on behind the pending prompt changes nothing
        assert num_job_rows(state) == rows
    state.apply(decide(state, [7] * 6, [7]))  # o_0 verified: a window of one row is next
    assert not state.is_prompt_pending and num_job_rows(state) == 1
