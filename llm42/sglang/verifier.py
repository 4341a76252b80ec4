"""The fixed-shape verification forward pass: B rows x W tokens, whatever is ready.

Each real row replays a request's aligned window over its own KV (its slots are overwritten with
the verifier's KV); pad entries and dummy rows write into slot 0 of request row 0, the padding
row and slot SGLang itself reserves at startup (CUDA-graph padding), so a pass needs no memory of
its own, can never fail to allocate, and leaves SGLang's leak checks untouched.

Sampling goes through the model runner's Sampler, whose llm42 hook samples each kind of row
(greedy / top-k / top-p / min-p) on its own, in decode batches and here alike: SGLang's sampler
picks its code path from batch-wide flags, so otherwise a row's token would depend on its mates.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from llm42.core.decision import PAD_TOKEN_ID
from llm42.core.planner import VerifyPass
from llm42.sglang import det_rows, runtime, verify_logits

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.managers.scheduler import Scheduler

DEFAULT_SEED = 42  # SGLang's own default sampling_seed
class _PadReq:
    """Stands in for the Req of a dummy row: SGLang reads optional per-request fields from it."""

    rid = "llm42-pad"

    def __getattr__(self, name):
        return None


_PAD_REQ = _PadReq()


@dataclass
class RowResult:
    token_ids: list[int]  # verifier tokens of entries [sample_from, num_real)
    logprobs: list[float] | None
    top_logprobs_val: list | None
    top_logprobs_idx: list | None

    def join(self, later: RowResult) -> RowResult:
        """This row's entries, then those of the job's next row (a prompt's rows, the last of
        which may also predict o_1)."""
        return RowResult(*(_concat(a, b) for a, b in (
            (self.token_ids, later.token_ids), (self.logprobs, later.logprobs),
            (self.top_logprobs_val, later.top_logprobs_val),
            (self.top_logprobs_idx, later.top_logprobs_idx))))


def _concat(a: list | None, b: list | None) -> list | None:
    return None if a is None and b is None else (a or []) + (b or [])


@dataclass
class LaunchedPass:
    """A pass whose forward is queued on the GPU; `finish()` samples it and waits for it.

    The rows' logits are copied out at launch: a replayed CUDA graph writes every pass's logits
    into the same buffer, so a later pass would overwrite them."""

    vpass: VerifyPass
    reqs: list
    entries: list[tuple[int, int]]  # (row, entry) pairs whose token a decision reads
    logits: torch.Tensor | None  # [len(entries), vocab] float32, None when nothing is compared
    graphed: bool
    launch_s: float

    def finish(self, scheduler: Scheduler) -> tuple[list[RowResult | None], float, bool]:
        """The rows' results, the pass's seconds (launch + sampling, not what ran in between)
        and whether it replayed a CUDA graph."""
        t0 = time.perf_counter()
        results = _sample_rows(scheduler, self.vpass, self.reqs, self.entries, self.logits)
        return results, self.launch_s + time.perf_counter() - t0, self.graphed


def launch_pass(
    scheduler: Scheduler, decode_batch: ScheduleBatch, vpass: VerifyPass, reqs: list[Req | None]
) -> LaunchedPass:
    """Queue one pass's forward; `reqs[i]` is the request of row i (None for dummy rows). Its
    host-to-device copies do not block, so with the overlap loop it can be queued behind the
    decode step in flight (`verify_passes.run_round`)."""
    t0 = time.perf_counter()
    device = decode_batch.device
    W = vpass.window_size
    row_size = scheduler.req_to_token_pool.req_to_token.shape[1]

    pool_idx, prefix_lens, extend_lens, locs = [], [], [], []
    for row, req in zip(vpass.rows, reqs):
        if row.is_pad:
            pool_idx.append(0), prefix_lens.append(0), extend_lens.append(W)
            locs.append(torch.zeros(W, dtype=torch.int64, device=device))
            continue
        slots = scheduler.req_to_token_pool.req_to_token[
            req.req_pool_idx, row.prefix_len : row.prefix_len + row.num_real
        ].to(torch.int64)
        pad = torch.zeros(W - row.num_real, dtype=torch.int64, device=device)
        # A window reaching past the context (end of a long request): its tail becomes a dummy
        # sequence on row 0, so the pass keeps B*W tokens and the real entries are unchanged.
        room = row_size - row.prefix_len
        pool_idx.append(req.req_pool_idx), prefix_lens.append(row.prefix_len)
        extend_lens.append(min(W, room))
        locs.append(torch.cat([slots, pad]))
        if room < W:
            pool_idx.append(0), prefix_lens.append(0), extend_lens.append(W - room)

    flat_ids = [0 if t == PAD_TOKEN_ID else t for t in vpass.flat_input_ids]
    batch = extend_batch(decode_batch, reqs, pool_idx, prefix_lens, extend_lens, flat_ids, locs)

    result = forward_pass(scheduler, batch)
    logits = result.logits_output.next_token_logits  # [num_tokens, vocab]
    assert logits.shape[0] == len(vpass.rows) * W, f"verify logits {tuple(logits.shape)}"
    entries = [(r, j) for r, row in enumerate(vpass.rows) if not row.is_pad
               for j in range(row.sample_from, row.num_real)]
    picked = None
    if entries:
        index = to_device([r * W + j for r, j in entries], torch.int64, device)
        picked = logits.index_select(0, index).float()
    return LaunchedPass(vpass, reqs, entries, picked, bool(result.can_run_cuda_graph),
                        time.perf_counter() - t0)


def forward_pass(scheduler: Scheduler, batch: ScheduleBatch):
    """The model's forward over a pass's batch, with every hook in pass mode (fp32 logits for
    every row, logits for every token, the backends' pass settings); no sampling."""
    runtime.IN_VERIFY_PASS = True
    try:
        return scheduler.tp_worker.forward_batch_generation(batch, is_verify=True)
    finally:
        runtime.IN_VERIFY_PASS = False


def extend_batch(decode_batch: ScheduleBatch, reqs: list, pool_idx: list[int],
                 prefix_lens: list[int], extend_lens: list[int], input_ids: list[int],
                 locs: list[torch.Tensor]) -> ScheduleBatch:
    """A pass batch (`pass_batch`) in extend mode: sequence i is request row `pool_idx[i]`'s
    `extend_lens[i]` tokens after its first `prefix_lens[i]`, written to the KV slots `locs[i]`;
    `input_ids` are every sequence's tokens in order. Every token gets logits in pass mode."""
    device = decode_batch.device
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
    batch = pass_batch(decode_batch, reqs, len(pool_idx))
    batch.forward_mode = _extend_mode()
    batch.input_ids = to_device(input_ids, torch.int64, device)
    batch.req_pool_indices = to_device(pool_idx, torch.int64, device)
    batch.seq_lens = to_device(seq_lens, torch.int64, device)
    batch.seq_lens_cpu = torch.tensor(seq_lens, dtype=torch.int64)
    batch.orig_seq_lens = to_device(seq_lens, torch.int32, device)
    batch.seq_lens_sum = sum(seq_lens)
    batch.out_cache_loc = torch.cat(locs)
    batch.prefix_lens, batch.extend_lens = prefix_lens, extend_lens
    batch.extend_num_tokens = sum(extend_lens)
    batch.extend_logprob_start_lens = list(extend_lens)
    return batch


def pass_batch(decode_batch: ScheduleBatch, reqs: list, num_seqs: int) -> ScheduleBatch:
    """A copy of the decode batch carrying a pass of `num_seqs` sequences: `reqs` then dummy
    requests, no sampling, logprobs, grammar or speculation (the pass samples on its own); the
    caller sets the mode, ids, lengths and KV slots."""
    batch = copy.copy(decode_batch)
    batch.reqs = [r if r is not None else _PAD_REQ for r in reqs] + [_PAD_REQ] * (
        num_seqs - len(reqs))
    batch.extend_input_logprob_token_ids = None
    batch.return_logprob = False
    batch.top_logprobs_nums = None
    batch.token_ids_logprobs = None
    batch.sampling_info = None
    batch.has_grammar = False
    batch.spec_info = None
    batch.global_num_tokens = None
    batch.global_num_tokens_for_logprob = None
    batch.is_prefill_only = False
    batch.input_embeds = None
    batch.multimodal_inputs = [None] * len(batch.reqs)
    return batch


def to_device(values: list, dtype: torch.dtype, device) -> torch.Tensor:
    """A host list on `device` without blocking: from pinned memory, as SGLang copies its own
    batch tensors (a blocking copy on the overlap loop's schedule stream would wait for the
    forward in flight)."""
    from sglang.srt.utils.common import is_pin_memory_available

    host = torch.tensor(values, dtype=dtype, pin_memory=is_pin_memory_available(device))
    return host.to(device, non_blocking=True)


def _sample_rows(scheduler, vpass: VerifyPass, reqs, entries, logits):
    """Sample the real entries a decision reads (all of a window row, the last of a prompt) in
    one call of the model runner's Sampler, as decode does.

    Its llm42 hook (`group_sampling.sampler_forward_hook`) samples each kind of row (greedy /
    top-k / top-p / min-p) on its own, so an entry's token and logprobs depend on its request
    only, and exactly as on the fast path."""
    if not entries:  # only leading rows of long prompts: nothing is compared
        return [None if row.is_pad else RowResult([], [], [], []) for row in vpass.rows]
    entry_reqs = [reqs[r] for r, _ in entries]
    entry_positions = [vpass.rows[r].positions[j] for r, j in entries]
    per_entry = dict(zip(entries, sample_entries(scheduler, entry_reqs, logits, entry_positions)))

    results: list[RowResult | None] = []
    for r, row in enumerate(vpass.rows):
        if row.is_pad:
            results.append(None)
            continue
        vals = [per_entry[(r, j)] for j in range(row.sample_from, row.num_real)]
        results.append(
            RowResult(
                token_ids=[v[0] for v in vals],
                logprobs=[v[1] for v in vals],
                top_logprobs_val=[v[2] for v in vals],
                top_logprobs_idx=[v[3] for v in vals],
            )
        )
    return results


def sample_entries(scheduler, reqs, logits, positions: list[int]) -> list[tuple]:
    """The verifier's (token, logprob, top logprob values, top logprob ids) of each row of
    `logits` [n, V] float32 (modified in place): row i is `reqs[i]`'s entry whose input token is
    at `positions[i]`. Penalties, grammar masks, logit_bias and custom processors are applied
    first, as SGLang's model runner applies them before its Sampler; a pass's entries and an
    inline step's rows are sampled here alike."""
    verify_logits.apply(logits, reqs, [verify_logits.output_index(req, p)
                                       for req, p in zip(reqs, positions)])
    top_nums = [req.logprob.top_logprobs_num if req.return_logprob else 0 for req in reqs]
    ids, out = _sample(scheduler, reqs, logits, to_device(positions, torch.int64, logits.device),
                       top_nums)
    ids, lps = ids.tolist(), out.next_token_logprobs.tolist()
    top_v, top_i = out.next_token_top_logprobs_val, out.next_token_top_logprobs_idx
    return [(ids[k], lps[k], tolist(top_v[k]) if top_v else None,
             tolist(top_i[k]) if top_i else None) for k in range(len(reqs))]


def put_logprobs(req, i: int, logprob: float, top_v, top_i) -> None:
    """Output token i's client-visible logprob entries: the verifier's, over the fast path's."""
    lp = req.logprob
    put_entry(lp.output_token_logprobs_val, i, logprob)
    put_entry(lp.output_token_logprobs_idx, i, req.output_ids[i])
    if lp.top_logprobs_num > 0:
        put_entry(lp.output_top_logprobs_val, i, top_v)
        put_entry(lp.output_top_logprobs_idx, i, top_i)


def put_entry(values: list, i: int, value) -> None:
    """Entry i of a request's per-token logprob list: overwritten, or appended as the next."""
    if i < len(values):
        values[i] = value
    elif i == len(values):
        values.append(value)
    else:
        raise IndexError(f"logprob list has {len(values)} entries, writing index {i}")


def sample_tokens(reqs, logits, positions) -> torch.Tensor:
    """Token ids [n] that the model runner's Sampler draws for deterministic rows: row i of
    `logits` [n, V] belongs to `reqs[i]`, its draw keyed by `positions[i]` (a speculative
    step's draft nodes, `speculation`). The logits are used as given."""
    return _sample(runtime.RUNTIME.scheduler, reqs, logits, positions, None)[0]


def _sample(scheduler, reqs, logits, positions, top_nums: list[int] | None):
    """One call of the model runner's Sampler over deterministic rows (`reqs[i]` owns row i of
    `logits`): (token ids, its LogitsProcessorOutput, with logprobs when `top_nums` is given)."""
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput

    out = LogitsProcessorOutput(next_token_logits=logits)
    info = _sampling_info(reqs, logits.device, scheduler.model_config.vocab_size)
    sampler = scheduler.tp_worker.model_runner.sampler
    ids = sampler(out, info, top_nums is not None, top_nums or [0] * len(reqs),
                  [None] * len(reqs), positions)
    return ids, out


def _sampling_info(reqs, device, vocab_size):
    """Batch-wide flags as SGLang sets them; the Sampler hook splits the kinds again."""
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
    from sglang.srt.sampling.sampling_params import TOP_K_ALL

    sps = [r.sampling_params for r in reqs]
    info = SamplingBatchInfo(
        temperatures=to_device([sp.temperature for sp in sps], torch.float, device).view(-1, 1),
        top_ps=to_device([sp.top_p for sp in sps], torch.float, device),
        top_ks=to_device([sp.top_k for sp in sps], torch.int32, device),
        min_ps=to_device([sp.min_p for sp in sps], torch.float, device),
        is_all_greedy=all(sp.top_k <= 1 for sp in sps),
        is_any_greedy=any(sp.top_k <= 1 for sp in sps),
        need_top_p_sampling=any(sp.top_p != 1.0 for sp in sps),
        need_top_k_sampling=any(sp.top_k != TOP_K_ALL for sp in sps),
        need_min_p_sampling=any(sp.min_p > 0 for sp in sps),
        vocab_size=vocab_size,
        sampling_seed=to_device([seed_of(sp) for sp in sps], torch.int64, device),
        device=device,
    )
    det_rows.mark(info, [True] * len(reqs))  # every verified row is a deterministic request's
    return info


def seed_of(sampling_params) -> int:
    seed = sampling_params.sampling_seed
    return DEFAULT_SEED if seed is None else int(seed)


def tolist(x):
    return x.tolist() if hasattr(x, "tolist") else x


def _extend_mode():
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return ForwardMode.EXTEND
