"""The row-invariant verification pass (`--llm42-verifier row-invariant`): every entry of a pass is
computed as a decode row of its own, so its bits depend on its request alone.

A fixed-shape pass (`verifier.launch_pass`) is reproducible only because every pass has the same
B x W shape: its extend attention and GEMMs see the same batch every time, so W, B and the
prefill path are part of what a deterministic output is a function of. Here each real entry of
the `VerifyPass` becomes one decode row: query = the entry's token at its position, keys = its
request's KV before it (written by earlier entries of the same pass at the same layer, or by
earlier passes). Per row, decode attention reduces over exactly that row's keys, norms and
activations are per row, and the GEMMs run at one fixed number of rows (`rows_per_forward`,
padded with SGLang's padding slot as the fixed-shape pass pads), where a row's result does not
depend on the other rows (`row_invariance.check_linears` checks that at startup). So:

    entries of the pass, in order:  (row r, position p) for p in [prefix_len, prefix_len+num_real)
    forwards:                       [e_0 .. e_{M-1}] [e_M .. e_{2M-1}] ...   (decode, M rows each)
    an entry's logits / KV:         f(its request's tokens [0, p])           (whatever W, B, the
                                                                               pass's other rows)

Entries are taken row by row in position order, so an entry's predecessors of the same request
are in its own forward or an earlier one. The price: a window of W entries costs W decode rows
instead of one extend row of W tokens, and a pass may take several forwards. (Prompt entries
as extend sequences over their prefix, with Triton's unified kernel, kept their bits on an H100
but cost 5.8x the decode rows' deterministic prefill time at ShareGPT 10 %:
`benchmarks/results/h100-2026-12-08-prompt-rows`.)
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

from llm42.core.decision import PAD_TOKEN_ID
from llm42.core.planner import VerifyPass
from llm42.sglang import runtime, verifier

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.managers.scheduler import Scheduler

# Rows of every forward of a row-invariant pass, per device type: a shape at which the GEMMs'
# rows are independent of each other (checked at startup, `check_linears`); on CUDA one of
# SGLang's decode CUDA-graph sizes, and as large as the decode batches the benchmarks run, so
# that every such decode step can verify its deterministic rows inline (`inline_verify`; 64
# before). The count is part of what an output is a function of (the GEMMs keep a row's bits at
# one M, not necessarily across M), like a kernel choice.
ROWS_PER_FORWARD = {"cpu": 16, "cuda": 256}
# Experiments only (GPU A/B of the forward size: fewer, larger forwards read the weights fewer
# times per verified token, smaller ones pad less): another row count. It changes outputs.
ROWS_ENV = "LLM42_ROW_PASS_ROWS"
# Experiments only (GPU A/B of the attention's KV splits): a row's Triton KV splits become
# ceil(its KV length / this many tokens), at most the backend's maximum, instead of the maximum
# for every row. Still a function of the row alone (as SGLang's deterministic mode splits by a
# tile), fewer splits for short rows. It changes outputs.
KV_TILE_ENV = "LLM42_ROW_PASS_KV_TILE"


def rows_per_forward(device_type: str) -> int | None:
    """None: the row-invariant verifier is not available on this device."""
    rows = ROWS_PER_FORWARD.get(device_type)
    override = os.environ.get(ROWS_ENV, "")
    if rows is None or not override:
        return rows
    if not override.isdigit() or int(override) < 1:
        raise ValueError(f"llm42: {ROWS_ENV} must be an integer >= 1, got {override!r}")
    return int(override)


# The rows of the running forward whose bits the verifier keeps, when not all of them: an inline
# step's eligible rows (`inline_verify.run_forward`); None inside a pass, where every row is.
_VERIFIED_ROWS: torch.Tensor | None = None


@contextmanager
def verified_rows(rows: torch.Tensor | None):
    """Within it, only `rows` (device indices into the forward's rows) need a split of their
    own (`static_kv_splits_hook`); the other rows keep SGLang's choice."""
    global _VERIFIED_ROWS
    _VERIFIED_ROWS = rows
    try:
        yield
    finally:
        _VERIFIED_ROWS = None


def static_kv_splits_hook(original, backend, num_kv_splits, seq_lens):
    """AROUND TritonAttnBackend.get_num_kv_splits: inside a row-invariant pass every row gets
    the backend's maximum number of KV splits, so a row's split (and its attention's bits)
    depends on its own KV length only; elsewhere SGLang picks splits from the whole batch. In
    an inline step only the rows the verifier keeps need it: the step's other rows (normal
    requests, padding) take SGLang's splits, which attend faster at a batch's size, and a row's
    attention never reads another row's split."""
    from llm42.core.config import ROW_INVARIANT

    rt = runtime.RUNTIME
    if not (runtime.IN_VERIFY_PASS and rt is not None and rt.config.verifier == ROW_INVARIANT):
        return original(backend, num_kv_splits, seq_lens)
    rows, tile = _VERIFIED_ROWS, kv_tile()
    if num_kv_splits.shape != seq_lens.shape:  # several tokens a row (speculative): the maximum
        num_kv_splits.fill_(backend.max_kv_splits)
    elif rows is None:
        num_kv_splits.copy_(_own_splits(backend, seq_lens, tile, num_kv_splits.dtype))
    else:
        original(backend, num_kv_splits, seq_lens)
        own = _own_splits(backend, seq_lens.index_select(0, rows), tile, num_kv_splits.dtype)
        num_kv_splits.index_copy_(0, rows, own)
    return None


def _own_splits(backend, seq_lens: torch.Tensor, tile: int | None, dtype) -> torch.Tensor:
    """Each row's KV splits from its own length alone: the maximum, or one per `tile` tokens."""
    if tile is None:
        return torch.full_like(seq_lens, backend.max_kv_splits, dtype=dtype)
    return torch.clamp((seq_lens + tile - 1) // tile, 1, backend.max_kv_splits).to(dtype)


def kv_tile() -> int | None:
    """`LLM42_ROW_PASS_KV_TILE` (experiments only); None: every row gets the maximum split."""
    tile = os.environ.get(KV_TILE_ENV, "")
    if not tile:
        return None
    if not tile.isdigit() or int(tile) < 1:
        raise ValueError(f"llm42: {KV_TILE_ENV} must be an integer >= 1, got {tile!r}")
    return int(tile)


def launch_row_pass(
    scheduler: Scheduler, decode_batch: ScheduleBatch, vpass: VerifyPass, reqs: list[Req | None]
):
    """Run `vpass`'s real entries in forwards of `rows_per_forward` rows; the logits of the
    entries a decision reads, as `verifier.launch_pass` returns them."""
    t0 = time.perf_counter()
    device = decode_batch.device
    rows = rows_per_forward(torch.device(device).type)
    if rows is None:
        raise RuntimeError(f"llm42: the row-invariant verifier has no row shape for {device}")
    entries, sampled = pass_entries(vpass, reqs)
    logits, graphed = entry_logits(scheduler, decode_batch, entries, [i for _, i in sampled],
                                   rows, device)
    return verifier.LaunchedPass(vpass, reqs, [key for key, _ in sampled], logits, graphed,
                                 time.perf_counter() - t0)


def entry_logits(scheduler, batch, entries: list, wanted: list[int], rows: int,
                 device) -> tuple[torch.Tensor | None, bool]:
    """The fp32 logits of `entries[i]` (request, position, token) for each i in `wanted`, in
    that order (None when none), and whether a CUDA graph replayed: the entries as decode rows,
    R a forward in entry order, so an entry's predecessors of its request run before it."""
    wanted_set = set(wanted)
    picked, order = [], []
    graphed = False
    for start in range(0, len(entries), rows):
        chunk = entries[start : start + rows]
        out, ran_graph = _forward(scheduler, batch, chunk, rows, device)
        graphed = graphed or ran_graph
        # Copied out before the next forward: a replayed decode graph returns its static output
        # buffer, which that forward overwrites (as a fixed-shape pass copies at launch).
        keep = [j for j in range(len(chunk)) if start + j in wanted_set]
        if keep:
            index = verifier.to_device(keep, torch.int64, device)
            picked.append(out.index_select(0, index).float())
            order += [start + j for j in keep]
    if not picked:
        return None, graphed
    found = torch.cat(picked)
    if order != list(wanted):
        position = {entry: j for j, entry in enumerate(order)}
        found = found.index_select(0, verifier.to_device([position[i] for i in wanted],
                                                         torch.int64, device))
    return found, graphed


def pass_entries(vpass: VerifyPass, reqs: list) -> tuple[list, list]:
    """The pass's real entries in forward order, (request, position, token), row by row in
    position order (an entry's predecessors of its request come before it), and, for each
    compared entry, its ((row, entry), index into the entries)."""
    entries, sampled = [], []
    for r, (row, req) in enumerate(zip(vpass.rows, reqs)):
        if row.is_pad:
            continue
        for j in range(row.num_real):
            if j >= row.sample_from:
                sampled.append(((r, j), len(entries)))
            entries.append((req, row.positions[j], row.input_ids[j]))
    return entries, sampled


def pad_token(token: int) -> int:
    """A planned padding entry's token as a forward's input (its id is not in the vocabulary)."""
    return 0 if token == PAD_TOKEN_ID else token


def _forward(scheduler, decode_batch, chunk: list, rows: int, device) -> tuple[torch.Tensor, bool]:
    """One decode forward of `rows` rows: the chunk's entries (request, position, token), then
    padding rows."""
    tokens = [pad_token(t) for _, _, t in chunk] + [0] * (rows - len(chunk))
    return forward_rows(scheduler, decode_batch, [req for req, _, _ in chunk],
                        [pos for _, pos, _ in chunk], rows,
                        verifier.to_device(tokens, torch.int64, device))


def forward_rows(scheduler, decode_batch, reqs: list, positions: list[int], rows: int,
                 input_ids: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """The row-invariant forward: row i is `reqs[i]`'s token `input_ids[i]` at `positions[i]`,
    its KV written to that position's slot; rows past `reqs` are padding (SGLang's padding slot:
    request row 0, slot 0, as the fixed-shape pass pads). A pass's entries and an inline decode
    step (`inline_verify`) both run here, so a row's bits are the same in either. Returns the
    [rows, vocab] logits and whether a CUDA graph replayed."""
    device = input_ids.device
    req_to_token = scheduler.req_to_token_pool.req_to_token
    pool_idx = [req.req_pool_idx for req in reqs] + [0] * (rows - len(reqs))
    positions = list(positions) + [0] * (rows - len(reqs))
    pool = verifier.to_device(pool_idx, torch.int64, device)
    pos = verifier.to_device(positions, torch.int64, device)
    locs = req_to_token[pool, pos].to(torch.int64)
    if len(reqs) < rows:
        locs[len(reqs):] = 0
    seq_lens = [p + 1 for p in positions]
    batch = verifier.pass_batch(decode_batch, list(reqs), rows)
    batch.forward_mode = _decode_mode()
    batch.input_ids = input_ids
    batch.req_pool_indices = pool
    batch.seq_lens = verifier.to_device(seq_lens, torch.int64, device)
    batch.seq_lens_cpu = torch.tensor(seq_lens, dtype=torch.int64)
    batch.orig_seq_lens = verifier.to_device(seq_lens, torch.int32, device)
    batch.seq_lens_sum = sum(seq_lens)
    batch.out_cache_loc = locs
    batch.prefix_lens = batch.extend_lens = batch.extend_logprob_start_lens = None
    batch.extend_num_tokens = None
    result = verifier.forward_pass(scheduler, batch)
    logits = result.logits_output.next_token_logits  # [rows, vocab]
    assert logits.shape[0] == rows, f"row pass logits {tuple(logits.shape)}"
    return logits, bool(result.can_run_cuda_graph)


def _decode_mode():
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return ForwardMode.DECODE


def check_linears(model, rows: int, seed: int = 0) -> list[str]:
    """Why a forward of `rows` rows would not be row-invariant on this model and device: for
    every distinct GEMM weight shape of `model`, and its LM head in fp32 (as passes compute it),
    a row's output must keep its bits when the other rows change and when the rows are
    permuted. [] when it holds."""
    import torch.nn.functional as F

    from llm42.sglang.fp32_logits import fp32_matmul

    gemms = {}  # (shape, dtype, fp32 logits) -> (label, weight, gemm)
    for name, weight in model.named_parameters():
        if weight.dim() == 2 and "embed" not in name:
            gemms.setdefault((tuple(weight.shape), weight.dtype, False), (name, weight, F.linear))
    head = getattr(getattr(model, "lm_head", None), "weight", None)
    if head is not None:
        gemms[(tuple(head.shape), head.dtype, True)] = ("lm_head (fp32 logits)", head,
                                                        fp32_matmul)
    g = torch.Generator().manual_seed(seed)
    problems = []
    for label, weight, gemm in gemms.values():
        x = torch.randn(rows, weight.shape[1], generator=g).to(weight.device, weight.dtype)
        mates = torch.randn(rows, weight.shape[1], generator=g).to(weight.device, weight.dtype)
        mates[0] = x[0]
        perm = torch.randperm(rows, generator=g).to(weight.device)
        with torch.no_grad():
            y = gemm(x, weight)
            if not torch.equal(gemm(mates, weight)[0], y[0]):
                problems.append(f"{label} {tuple(weight.shape)}: a row changes with the other "
                                f"rows at {rows} rows")
            elif not torch.equal(gemm(x[perm], weight), y[perm]):
                problems.append(f"{label} {tuple(weight.shape)}: rows change with their "
                                f"position at {rows} rows")
    return problems
