"""Exact rollback of a running request's tail: KV slots, token list, logprobs, batch lengths.

For a request with prompt length P and n output tokens, SGLang (page size 1, no speculation)
keeps `kv_committed_len == kv_allocated_len == P + n - 1` once a decode result is processed and
before the next batch is built (llm42 verifies only then, see `in_flight.drain`): slots
`req_to_token[row, 0 : P+n-1)` hold the KV of the prompt and of o_0 .. o_{n-2}; o_{n-1} is the
next decode input. Truncating the output to n' tokens frees the slots

    req_to_token[row, P+n'-1 : P+n-1)        (n - n' slots, half-open)

and shrinks every length by that count. A verifier correction keeps o_0 .. o_{m-1} and puts the
corrected token at m (`replace_tail`): n' = m + 1, so the freed slots are [P+m, P+n-1) and the
KV of o_{m-1} stays. The next decode input (relayed through `future_map.output_tokens_buf[row]`)
becomes the new last token.

An abort can also be processed while the overlap loop already built the next batch, which
allocated one more slot (`kv_committed_len == P + n`); truncation frees up to
`kv_committed_len`, so that slot is freed with the others and nothing is freed twice.

Speculative decoding keeps the same committed length but allocates a tail for the drafts
beyond it (`kv_allocated_len > kv_committed_len`, freed by SGLang only at the finish); a
truncation frees that tail with the rest, and the next step allocates a new one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llm42.sglang import grammar_replay, penalty_rewind, speculation

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.managers.scheduler import Scheduler

_LOGPROB_LISTS = (
    "output_token_logprobs_val",
    "output_token_logprobs_idx",
    "output_top_logprobs_val",
    "output_top_logprobs_idx",
    "output_token_ids_logprobs_val",
    "output_token_ids_logprobs_idx",
)


def truncate_output(
    scheduler: Scheduler, req: Req, new_len: int, batch: ScheduleBatch | None
) -> int:
    """Drop output tokens [new_len, n) and their KV; return the number of freed KV slots."""
    n = len(req.output_ids)
    grammar_replay.rewind(req, new_len)  # also a token it accepted past the output (module doc)
    if new_len >= n:
        return 0
    num_freed = n - new_len
    if req.req_pool_idx is not None and req.kv is not None:
        prompt_len = len(req.origin_input_ids)
        row = scheduler.req_to_token_pool.req_to_token[req.req_pool_idx]
        start = prompt_len + new_len - 1
        end = max(req.kv_committed_len, req.kv.kv_allocated_len)  # a speculative draft tail too
        if end > start:
            scheduler.token_to_kv_pool_allocator.free(row[start:end].to(torch_long()))
            req.kv.kv_allocated_len = start
        dropped = req.kv_committed_len - start
        if dropped > 0:
            req.kv_committed_len = start
            req.decode_batch_idx = max(0, req.decode_batch_idx - dropped)
            if batch is not None:
                _shrink_batch_row(batch, req, dropped)
    del req.output_ids[new_len:]
    truncate_logprobs(req, new_len)
    if batch is not None:
        penalty_rewind.rewind(batch, req, num_freed)
    return num_freed


def truncate_logprobs(req: Req, new_len: int) -> None:
    """Drop output logprob entries from index `new_len` on."""
    for name in _LOGPROB_LISTS:
        values = getattr(req.logprob, name, None) if req.logprob is not None else None
        if values is not None and len(values) > new_len:
            del values[new_len:]


def replace_tail(
    scheduler: Scheduler, req: Req, index: int, token_id: int, batch: ScheduleBatch | None
) -> int:
    """Keep output [0, index), put `token_id` at `index`; return the number of freed KV slots.

    Implemented as truncation to index + 1 (keeping the KV of o_{index-1}) and an overwrite of
    the last token, which has no KV yet: it is the next decode input."""
    num_freed = truncate_output(scheduler, req, index + 1, batch)
    req.output_ids[index] = token_id
    grammar_replay.replace_last(req, index, token_id)
    if req.req_pool_idx is not None:
        scheduler.future_map.output_tokens_buf[req.req_pool_idx] = token_id
    speculation.rewind(scheduler, batch, req, token_id)
    return num_freed


def _shrink_batch_row(batch: ScheduleBatch, req: Req, num: int) -> None:
    try:
        i = next(i for i, r in enumerate(batch.reqs) if r is req)
    except StopIteration:
        return
    # Rebind instead of in-place edits: the tensors may be aliased by a queued ForwardBatch.
    for name in ("seq_lens", "seq_lens_cpu", "orig_seq_lens"):
        t = getattr(batch, name, None)
        if t is not None and len(t) > i:
            t = t.clone()
            t[i] -= num
            setattr(batch, name, t)
    batch.seq_lens_sum = None


def torch_long():
    import torch

    return torch.int64
