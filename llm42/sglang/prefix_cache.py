"""Shared prompt KV for deterministic requests (`--llm42-prefix-cache`, with batched prefill).

A prompt pass writes prompt KV in rows of W tokens, row j over prefix KV [0, jW), in a pass of
fixed shape: the KV of the first jW tokens depends on those tokens alone. So it can be shared at
row boundaries, through SGLang's radix tree but in a namespace of its own (`namespace`):

  * after its prompt pass a request publishes its whole rows [0, W * (P // W)) there
    (`publish_prompt`, the steps of `RadixCache.cache_unfinished_req`, for verified KV only);
  * a later request's match there is cut to a multiple of W (`init_round_hook`), and its prompt
    pass replays only the rows after it (`DetRequestState.num_cached_prompt_tokens`).

Unverified fast-path KV never enters the namespace, and requests whose prompt is not verified by
a pass (solo prefills) keep their private key, so a cache hit gives bitwise the KV of a miss.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING

import torch

from llm42.sglang import runtime
from llm42.sglang.request_state import det_state, of

if TYPE_CHECKING:
    from llm42.core import Llm42Config


def namespace(config: Llm42Config, extra_key: str | None = None) -> str:
    """Radix-tree `extra_key` of verified prompt KV: rows of another W or B never mix (a
    fixed-shape pass's KV depends on them; a row-invariant pass's does not, so its rows are
    shared across every W and B), and the request's own key (SGLang's LoRA adapter id and cache
    salt) stays part of it, so verified rows are shared only between requests of one adapter
    and one salt."""
    from llm42.core.config import ROW_INVARIANT

    shape = (ROW_INVARIANT if config.verifier == ROW_INVARIANT
             else f"w{config.window_size}:b{config.verify_batch_size}")
    return f"llm42-verified:{shape}|{extra_key or ''}"


def uses_cache(req) -> bool:
    rt = runtime.RUNTIME
    return (rt is not None and rt.config.uses_prefix_cache
            and (req.extra_key or "").startswith(namespace(rt.config)))


def max_prefix_len_hook(original, req, input_len):
    """AROUND Req._compute_max_prefix_len: the cap `init_round_hook` sets for a re-match."""
    limit = original(req, input_len)
    fields = of(req)
    cap = None if fields is None else fields.prefix_cap
    return limit if cap is None else min(limit, cap)


def init_round_hook(original, req, tree_cache=None, *args, **kwargs):
    """AROUND Req.init_next_round_input: a deterministic match ends on a row boundary.

    A match inside a row would make this request's prompt pass rewrite KV the tree shares (and
    compute that row over a prefix split differently), so it matches again, capped at the
    boundary below."""
    result = original(req, tree_cache, *args, **kwargs)
    fields = of(req)
    state = None if fields is None else fields.det
    if tree_cache is None or state is None or not uses_cache(req):
        return result
    window = state.window_size
    matched = len(req.prefix_indices)
    if matched % window:
        fields.prefix_cap = matched - matched % window
        try:
            result = original(req, tree_cache, *args, **kwargs)
        finally:
            fields.prefix_cap = None
    state.use_cached_prompt(len(req.prefix_indices))
    return result


def publish_prompt(scheduler, req) -> int:
    """Insert the request's verified whole prompt rows into the tree; return the new tokens.

    Where the tree already holds them (another request published the same rows first), this
    request's copies are bitwise duplicates: freed, and its row points at the tree's slots. It
    then locks the tree node of its prompt instead of its own slots, as SGLang does after a
    prefill chunk, so SGLang's release at finish frees only what follows."""
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    window = det_state(req).window_size  # the rows its prompt pass wrote
    num_tokens = len(req.origin_input_ids) // window * window
    protected = req.cache_protected_len
    if req.req_pool_idx is None or num_tokens <= protected:
        return 0
    tree = scheduler.tree_cache
    tokens = array("q", req.origin_input_ids[:num_tokens])  # the tree compares types
    key = RadixKey(token_ids=tokens, extra_key=req.extra_key)
    own = scheduler.req_to_token_pool.req_to_token[req.req_pool_idx, :num_tokens]
    result = tree.insert(InsertParams(key=key, value=own.to(dtype=torch.int64, copy=True)))
    if result.prefix_len > protected:
        tree.token_to_kv_pool_allocator.free_segment(
            own[protected : result.prefix_len].to(torch.int64), start_pos=protected
        )
    match = tree.match_prefix(MatchPrefixParams(key=key))
    indices = match.device_indices
    if len(indices) != num_tokens:
        raise RuntimeError(f"{req.rid}: published {num_tokens} prompt tokens, matched {len(indices)}")
    scheduler.req_to_token_pool.write(
        (req.req_pool_idx, slice(protected, num_tokens)), indices[protected:]
    )
    tree.dec_lock_ref(req.last_node)
    tree.inc_lock_ref(match.last_device_node)
    req.last_node = match.last_device_node
    req.cache_protected_len = num_tokens
    return num_tokens - max(protected, result.prefix_len)
