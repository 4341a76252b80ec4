"""Fixed-shape verification plans: rows of W tokens grouped into passes of exactly B rows.

A fixed (B, W) shape lets the verifier run one captured graph / one batch-invariant kernel
configuration for every pass, so its numerics never depend on how many requests were ready.

    rows = [build_row(state, output_ids) for state, output_ids in ready]
    for verify_pass in plan_passes(rows, batch_size=8, window_size=64): run(verify_pass)

Layout of one pass (B = 3, W = 4, two real rows; prompt rows: `build_prompt_rows`):

    row 0   input_ids [t t t PAD]   positions [P0+kW, P0+kW+4)   prefix KV [0, P0+kW)
    row 1   input_ids [t t t t  ]   positions [P1+kW, P1+kW+4)   prefix KV [0, P1+kW)
    row 2   input_ids [PAD x 4  ]   positions [0, 4)             prefix KV [0, 0)   is_pad
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llm42.core.decision import PAD_TOKEN_ID
from llm42.core.errors import InvariantError
from llm42.core.window import DetRequestState


@dataclass(frozen=True)
class VerifyRow:
    """One request's verification row; real entries [0, num_real), padding [num_real, W)."""

    rid: str
    input_ids: tuple[int, ...]  # [W]
    positions: tuple[int, ...]  # [W], increasing, continued past num_real
    prefix_len: int
    num_real: int
    is_pad: bool = False
    sample_from: int = 0  # entries [sample_from, num_real) predict a token that is compared
    is_prompt: bool = False  # replays prompt tokens (build_prompt_rows), not a decode window

    def __post_init__(self) -> None:
        window_size = len(self.input_ids)
        if len(self.positions) != window_size:
            raise InvariantError(
                f"{self.rid}: {window_size} input ids but {len(self.positions)} positions"
            )
        if not 0 <= self.num_real <= window_size:
            raise InvariantError(f"{self.rid}: num_real {self.num_real} outside [0, {window_size}]")
        if self.is_pad != (self.num_real == 0):
            raise InvariantError(f"{self.rid}: pad rows and only pad rows have num_real == 0")
        if any(token_id != PAD_TOKEN_ID for token_id in self.input_ids[self.num_real :]):
            raise InvariantError(f"{self.rid}: entries from num_real on must be PAD_TOKEN_ID")
        if not 0 <= self.sample_from <= self.num_real:
            raise InvariantError(
                f"{self.rid}: sample_from {self.sample_from} outside [0, {self.num_real}]"
            )

    @property
    def window_size(self) -> int:
        return len(self.input_ids)

    @classmethod
    def pad(cls, window_size: int) -> VerifyRow:
        """A dummy row: all PAD_TOKEN_ID, positions [0, W), empty prefix, marked ``is_pad``."""
        return cls(
            rid="",
            input_ids=(PAD_TOKEN_ID,) * window_size,
            positions=tuple(range(window_size)),
            prefix_len=0,
            num_real=0,
            is_pad=True,
        )


def build_row(state: DetRequestState, output_ids: Sequence[int]) -> VerifyRow:
    """Row of window k: inputs o[kW, kW + num_real) then padding, positions [P + kW, P + kW + W)."""
    if len(output_ids) != state.num_output_tokens:
        raise InvariantError(
            f"{state.rid}: state has {state.num_output_tokens} output tokens, "
            f"list has {len(output_ids)}"
        )
    if state.num_compare_tokens == 0:
        raise InvariantError(
            f"{state.rid}: nothing to verify (verified={state.num_verified_tokens}, "
            f"output={state.num_output_tokens})"
        )
    if state.is_prompt_pending:
        raise InvariantError(f"{state.rid}: the prompt comes first (build_prompt_rows)")
    start, num_real = state.window_start, state.num_real_entries
    real_ids = tuple(output_ids[start : start + num_real])
    return VerifyRow(
        rid=state.rid,
        input_ids=real_ids + (PAD_TOKEN_ID,) * (state.window_size - num_real),
        positions=tuple(state.row_positions),
        prefix_len=state.prefix_len,
        num_real=num_real,
    )


def build_prompt_rows(state: DetRequestState, prompt_ids: Sequence[int],
                      output_ids: Sequence[int] = ()) -> list[VerifyRow]:
    """Rows replaying a fast-path prefill: W prompt tokens each, row j over prefix KV [0, jW).

    Row j reads the KV that rows before it write in the same pass (every layer writes its KV
    before attending) or in an earlier pass, so the prompt's KV and o_0, predicted by the last
    prompt entry, depend on the prompt alone, whatever the fast-path prefill batch looked like.
    Rows of ``num_cached_prompt_tokens`` are skipped: earlier prompt passes of another request
    with the same leading rows wrote that KV, bit for bit what these rows would write. With
    ``prompt_verifies_next`` one more entry follows the prompt's: o_0 at position P, predicting
    o_1 (in the last row, or in a row of its own when P is a multiple of W)."""
    num_prompt, window = state.num_prompt_tokens, state.window_size
    if not state.is_prompt_pending or state.num_output_tokens == 0:
        raise InvariantError(f"{state.rid}: no prompt pass pending")
    if len(prompt_ids) != num_prompt or num_prompt == 0:
        raise InvariantError(
            f"{state.rid}: state has {num_prompt} prompt tokens, list has {len(prompt_ids)}"
        )
    tokens = list(prompt_ids)
    if state.prompt_verifies_next:
        if len(output_ids) != state.num_output_tokens:
            raise InvariantError(
                f"{state.rid}: state has {state.num_output_tokens} output tokens, "
                f"list has {len(output_ids)}"
            )
        tokens.append(output_ids[0])
    rows = []
    for start in range(state.num_cached_prompt_tokens, len(tokens), window):
        real = tuple(tokens[start : start + window])
        last_prompt = num_prompt - 1 - start  # entry of the prompt's last token in this row
        rows.append(VerifyRow(
            rid=f"{state.rid}/prompt{start // window}",
            input_ids=real + (PAD_TOKEN_ID,) * (window - len(real)),
            positions=tuple(range(start, start + window)),
            prefix_len=start,
            num_real=len(real),
            sample_from=min(max(last_prompt, 0), len(real)),
            is_prompt=True,
        ))
    return rows


def num_job_rows(state: DetRequestState) -> int:
    """Rows of the request's next verification job: a window is one row, a pending prompt
    ceil((P - cached [+ 1]) / W) (``build_prompt_rows``), kept together in ``select_jobs``."""
    if state.is_prompt_pending:
        uncached = state.num_prompt_tokens - state.num_cached_prompt_tokens
        return -(-(uncached + state.prompt_verifies_next) // state.window_size)
    return 1


@dataclass(frozen=True)
class VerifyPass:
    """Exactly ``batch_size`` rows of ``window_size`` entries: real rows first, then pad rows."""

    rows: tuple[VerifyRow, ...]  # [B]
    batch_size: int
    window_size: int

    def __post_init__(self) -> None:
        if len(self.rows) != self.batch_size:
            raise InvariantError(f"pass has {len(self.rows)} rows, expected {self.batch_size}")
        if any(row.window_size != self.window_size for row in self.rows):
            raise InvariantError(f"every row of a pass must have {self.window_size} entries")
        is_pad = [row.is_pad for row in self.rows]
        if is_pad != sorted(is_pad):
            raise InvariantError("real rows must precede pad rows")

    @property
    def num_real_rows(self) -> int:
        return sum(1 for row in self.rows if not row.is_pad)

    @property
    def num_pad_rows(self) -> int:
        return self.batch_size - self.num_real_rows

    @property
    def num_prompt_rows(self) -> int:
        return sum(1 for row in self.rows if row.is_prompt)

    @property
    def flat_input_ids(self) -> list[int]:
        """[B * W] row-major input ids."""
        return [token_id for row in self.rows for token_id in row.input_ids]


def overdue_wait(max_wait: int) -> int:
    """Steps after which a ready job runs even past the per-step pass cap of `select_jobs`."""
    return 2 * max_wait + 1


def select_jobs(
    sizes: Sequence[int], waits: Sequence[int], urgent: Sequence[bool], batch_size: int,
    max_wait: int, max_passes: int = 0, hold: bool = False,
) -> list[int]:
    """Which ready jobs to verify now, as indices, most pressing first. A job is a window (one
    row) or a prompt (``len(build_prompt_rows(...))`` rows, kept together).

    A pass costs the same with 1 real row as with B, so a ready job may keep decoding (its
    next candidates pile up behind it) for up to ``max_wait`` steps while others fill the pass.
    Due now: urgent jobs (a finish waits on them) and those that waited ``max_wait``. Runs as
    many passes as the due jobs need, and every pass that is full anyway, and fills them with
    whatever else fits; the result never depends on when a job is verified, only the padding
    and latency do.

    ``max_passes`` > 0 caps the passes of one scheduler step: a burst of due jobs is then spread
    over several decode steps instead of stalling one of them for all its passes. Jobs over the
    cap keep waiting, except those that waited ``overdue_wait(max_wait)`` steps: they run
    regardless, so verification cannot fall behind without bound. A job larger than the cap
    (a long prompt) runs alone.

    ``hold``: the step is about to run a prefill, whose gap between decode steps a pass would
    lengthen further; only overdue jobs are due then (and fill their passes with others).
    """
    if not len(sizes) == len(waits) == len(urgent):
        raise InvariantError(
            f"{len(sizes)} sizes, {len(waits)} waits and {len(urgent)} urgency flags"
        )
    if any(size < 1 for size in sizes):
        raise InvariantError(f"every job has at least one row, got sizes {list(sizes)}")
    overdue = [w >= overdue_wait(max_wait) for w in waits]
    due = overdue if hold else [u or w >= max_wait for u, w in zip(urgent, waits)]
    order = sorted(range(len(waits)), key=lambda i: (not overdue[i], not urgent[i], -waits[i], i))
    rows_due = sum(size for size, d in zip(sizes, due) if d)
    full_passes = 0 if hold else sum(sizes) // batch_size
    capacity = batch_size * max(-(-rows_due // batch_size), full_passes)
    if max_passes > 0:
        rows_overdue = sum(size for size, o in zip(sizes, overdue) if o)
        capacity = min(capacity, batch_size * max(max_passes, -(-rows_overdue // batch_size)))
    chosen, used = [], 0
    for i in order:  # the due jobs come first and fit, unless a pass cap holds them back
        if used + sizes[i] <= capacity or (not chosen and due[i]):
            chosen.append(i)
            used += sizes[i]
    if rows_due == 0 and used % batch_size:
        return []  # nothing due and the jobs do not fill their passes (a prompt did not fit)
    return chosen


def cap_step_rows(sizes: Sequence[int], waits: Sequence[int], urgent: Sequence[bool],
                  max_rows: int) -> list[int]:
    """Of the jobs one step would verify, those within a budget of ``max_rows`` rows
    (``--llm42-max-pass-rows-per-step``), as indices, most pressing first: finishing jobs (a
    request's end waits on them), then the longest waiting, then the given order.

    Valid for row-invariant passes only, where a row's bits do not depend on the rows beside it
    and a pass costs its real rows: the step's work may then be cut anywhere. Jobs are taken in
    that order while they fit; one that does not fit waits for a later step, and smaller ones
    behind it may still use the budget. The most pressing job always runs, alone when it is
    larger than the budget (a long prompt, kept together as in ``select_jobs``), so a step
    verifies something whenever a job is due. No job waits behind the cap for ever: only
    finishing jobs and jobs that waited longer go ahead of it, and its wait grows each step.

        sizes [1, 3, 1], waits [2, 0, 5], urgent [F, T, F], max_rows 4 -> [1, 2]  (3 + 1 rows)
    """
    if not len(sizes) == len(waits) == len(urgent):
        raise InvariantError(
            f"{len(sizes)} sizes, {len(waits)} waits and {len(urgent)} urgency flags"
        )
    if max_rows < 1 or any(size < 1 for size in sizes):
        raise InvariantError(f"row budget {max_rows} and job sizes {list(sizes)} must be >= 1")
    order = sorted(range(len(sizes)), key=lambda i: (not urgent[i], -waits[i], i))
    chosen, used = [], 0
    for i in order:
        if used + sizes[i] <= max_rows or not chosen:
            chosen.append(i)
            used += sizes[i]
    return chosen


def plan_passes(rows: Sequence[VerifyRow], batch_size: int, window_size: int) -> list[VerifyPass]:
    """Split ``rows`` in order into passes of ``batch_size``; pad the last one with dummy rows."""
    if batch_size < 1 or window_size < 1:
        raise InvariantError(
            f"batch_size and window_size must be >= 1, got {batch_size}, {window_size}"
        )
    rids = [row.rid for row in rows]
    if any(row.is_pad for row in rows) or len(set(rids)) != len(rids):
        raise InvariantError(f"expected one real row per request window, found rids {rids}")
    passes = []
    for start in range(0, len(rows), batch_size):
        chunk = tuple(rows[start : start + batch_size])
        pad_rows = (VerifyRow.pad(window_size),) * (batch_size - len(chunk))
        passes.append(VerifyPass(chunk + pad_rows, batch_size, window_size))
    return passes
