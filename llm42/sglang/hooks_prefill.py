"""Prefill hooks: which deterministic requests prefill in a batch of their own, and where the
next chunk of a chunked deterministic prompt starts.

With batched prefill (the fixed-shape verifier's default) a deterministic prompt joins any batch
and a prompt pass verifies it later; a long prompt (`--llm42-solo-prefill-min-tokens`), one
asking for prompt logprobs, or any with `--no-llm42-batched-prefill` prefills alone, so o_0
depends on the request only. With `--llm42-verifier row-invariant` prompt rows verify a prompt that prefilled alone too
(`Llm42Config.verifies_prompt`): alone then decides only the prefill batch, which deterministic
prompts share (`_deterministic_batch`).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from llm42.core.config import ROW_INVARIANT
from llm42.sglang import inline_verify, prefix_cache, runtime
from llm42.sglang.request_state import det_state, of


def prefill_batch_hook(original, scheduler, *args, **kwargs):
    """AROUND Scheduler._get_new_batch_prefill_raw: a deterministic prefill runs alone, unless
    its prompt is verified afterwards (batched prefill, the default): then it joins any batch."""
    rt = runtime.RUNTIME
    running = kwargs.get("running_batch", args[1] if len(args) > 1 else None)
    if rt is None or _admits_nothing(scheduler, running):
        return original(scheduler, *args, **kwargs)
    with _grammars_admitted_first(scheduler):
        return _split_queue(rt, original, scheduler, *args, **kwargs)


def _split_queue(rt, original, scheduler, *args, **kwargs):
    queue = scheduler.waiting_queue
    chunked = scheduler.chunked_req
    for req in (*queue, chunked):
        _choose_prompt_path(rt, req)
    alone = [_prefills_alone(r) for r in queue]
    chunked_alone = _prefills_alone(chunked)
    if not (any(alone) or chunked_alone):
        return original(scheduler, *args, **kwargs)
    det = [r for r, a in zip(queue, alone) if a]
    normal = [r for r, a in zip(queue, alone) if not a]
    if chunked is not None:
        visible = [] if chunked_alone else normal
    elif det and (rt.prefer_det_prefill or not normal):
        visible = _deterministic_batch(rt, det)
    else:
        visible = normal
    rt.prefer_det_prefill = not rt.prefer_det_prefill
    visible_ids = {id(r) for r in visible}
    scheduler.waiting_queue = visible
    try:
        return original(scheduler, *args, **kwargs)
    finally:
        left = scheduler.waiting_queue
        keep = {id(r) for r in left} | {id(r) for r in queue if id(r) not in visible_ids}
        queued = {id(r) for r in queue}
        merged = [r for r in queue if id(r) in keep]
        merged += [r for r in left if id(r) not in queued]  # e.g. retracted by the original
        scheduler.waiting_queue = merged


def _deterministic_batch(rt, det: list) -> list:
    """The waiting deterministic prompts one prefill batch of their own may take.

    Fixed-shape: one, since its o_0 and KV come from that prefill and must depend on it alone.
    Row-invariant: prompt rows give every prompt's KV and o_0 whatever its batch, so every prompt
    they verify shares one batch of deterministic prompts only (SGLang takes as many as fit):
    with inline prompt rows its extend is skipped and the prompts' rows fill the verifier's
    forwards together, where a batch shared with normal prompts computes each deterministic
    prompt twice (the extend and its rows) and pads each one's rows. A prompt asking for prompt
    logprobs, whose o_0 and KV come from its prefill, still goes alone."""
    if rt.config.verifier != ROW_INVARIANT or not det_state(det[0]).verify_prompt:
        return det[:1]  # in queue order: a prompt that must go alone is not overtaken
    return [r for r in det if det_state(r).verify_prompt]


@contextmanager
def _grammars_admitted_first(scheduler):
    """Requests whose grammar has compiled join the waiting queue before it is split, and the
    grammar queue is out of the original's sight meanwhile.

    The original admits them itself, first thing: into the split queue, where a deterministic
    request that must prefill alone would join the batch of another (its o_0 would then depend
    on that batch)."""
    manager = scheduler.grammar_manager
    if manager.has_waiting_grammars():
        for req in manager.get_ready_grammar_requests():
            scheduler._add_request_to_queue(req)
    held, manager.grammar_queue = manager.grammar_queue, []
    try:
        yield
    finally:
        manager.grammar_queue = held + manager.grammar_queue


def _admits_nothing(scheduler, running_batch) -> bool:
    """The first early return of SGLang 0.5.17's `_get_new_batch_prefill_raw` (its fingerprint
    is in patches/): a full running batch and no chunked prompt admit no request, so the split
    of the waiting queue, O(queue) per scheduler step (~1.5 ms with 1,800 queued), is skipped.
    Ready grammar requests and preemption modes, which the original handles before that return,
    take the full path."""
    return (running_batch is not None and running_batch.batch_is_full
            and scheduler.chunked_req is None
            and not scheduler.grammar_manager.has_waiting_grammars()
            and not (scheduler.enable_priority_preemption or scheduler.is_hybrid_swa))


def _choose_prompt_path(rt, req) -> None:
    """Before a deterministic request's first prefill (and after a restart's, with the same
    result): fix `verify_prompt`, solo prefill or prompt passes, a function of the request alone.

    Long prompts (`Llm42Config.solo_prefill_threshold`) prefill alone: a solo prefill computes
    them once, where prompt passes would compute them a second time, in small passes. So does a
    request asking for prompt logprobs: the prompt pass gives o_0 and the prompt's KV, not the
    prompt's logprobs. A verified prompt may match verified KV of the prefix cache."""
    state = det_state(req) if req is not None else None
    if state is None or state.num_output_tokens != 0 or state.num_restarts != 0:
        return
    wants_prompt_logprobs = req.return_logprob and 0 <= req.logprob_start_len < len(
        req.origin_input_ids)
    num_tokens = len(req.origin_input_ids)
    of(req).prefill_alone = rt.config.prefills_alone(num_tokens, wants_prompt_logprobs)
    state.verify_prompt = rt.config.verifies_prompt(num_tokens, wants_prompt_logprobs)
    # inline verification: the prompt pass verifies o_1 too, so the next step can run inline
    state.prompt_verifies_next = state.verify_prompt and inline_verify.active(rt)
    if state.verify_prompt and rt.config.uses_prefix_cache:
        # its prompt KV will be verified
        req.extra_key = prefix_cache.namespace(rt.config, of(req).sglang_extra_key)


def _prefills_alone(req) -> bool:
    """Deterministic and prefilled in a batch of its own (`_choose_prompt_path` ran on it)."""
    fields = of(req) if req is not None else None
    return fields is not None and fields.det is not None and fields.prefill_alone


def stash_chunked_hook(original, scheduler, req):
    """AROUND Scheduler.stash_chunked_request: after a prefill chunk, a deterministic request's
    next chunk starts where this one ended.

    SGLang advances `prefix_indices` while caching the chunk in the prefix tree, which
    `skip_radix_cache_insert` turns off for deterministic requests (their KV is rewritten by
    verification and rolled back); without this their first chunk would run again and again.
    The KV stays the request's own: nothing enters the tree, as with SGLang's ChunkCache."""
    if det_state(req) is None:
        return original(scheduler, req)
    row = scheduler.req_to_token_pool.req_to_token[req.req_pool_idx, : req.extend_range.end]
    req.prefix_indices = row.to(dtype=torch.int64, copy=True)
