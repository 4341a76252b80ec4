"""Speculative decoding on SGLang's ``torch_native`` attention backend (CPU hosts).

SGLang 0.5.17 serves speculative decoding on CPU only with ``intel_amx`` (sgl-kernel's AMX
kernels, absent on PyPI). ``torch_native``, the backend every CPU server here runs, lacks the two
attention shapes speculation adds:

* **target verify** (``ForwardMode.TARGET_VERIFY``): each request extends by its ``n`` draft
  nodes at once. Its ``ForwardBatch`` carries no ``extend_*`` lengths, and a draft tree (NGRAM,
  EAGLE with topk > 1) needs its tree mask. ``verify_forward_extend`` (an ``around_on_cpu`` hook on
  ``TorchNativeAttnBackend.forward_extend``) runs it; every other mode goes to SGLang's code.
* **multi-step draft decode** (EAGLE / STANDALONE): step ``i`` of the draft model decodes each
  branch's ``i``-th draft token against the committed prefix plus the branch's earlier drafts.
  ``TorchNativeMultiStepDraftBackend`` is that container (the twin of
  ``IntelAMXMultiStepDraftBackend``); ``llm42.compat.spec_draft_backends`` hands it out.

Draft extend (``DRAFT_EXTEND_V2``) needs nothing new: its batch has ordinary extend lengths.

    o = verify_forward_extend(original, backend, q, k, v, layer, forward_batch)

KV layout during verify, per request (``s`` = committed length, slots over-allocated by SGLang)::

    req_to_token[row, [0, s)]      committed prefix, visible to every draft node
    req_to_token[row, [s, s + n)]  this pass's draft nodes (written here at out_cache_loc);
                                   node i sees node j iff tree_mask[i, j] (j is i or an ancestor)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from torch.nn.functional import scaled_dot_product_attention

from llm42.compat.sgl_kernel.speculative import build_draft_decode_metadata_cpu

if TYPE_CHECKING:
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.model_executor.model_runner import ModelRunner

__all__ = ["TorchNativeMultiStepDraftBackend", "tree_masks", "verify_forward_extend"]


def verify_forward_extend(
    original,
    self,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layer: RadixAttention,
    forward_batch: ForwardBatch,
    save_kv_cache: bool = True,
    **kwargs: Any,
) -> torch.Tensor:
    """``TorchNativeAttnBackend.forward_extend`` with a target-verify path (other modes: SGLang's).

    For request ``b`` with committed length ``s`` and ``n`` draft nodes, query rows
    ``[b * n, (b + 1) * n)`` attend to ``req_to_token[row, [0, s + n)]`` under the mask
    ``[ones(n, s) | tree_mask_b]``.
    """
    if not forward_batch.forward_mode.is_target_verify():
        return original(self, q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
    if layer.is_cross_attention or layer.sliding_window_size not in (None, -1):
        raise NotImplementedError(
            "llm42's torch_native verify path covers self-attention without a sliding window; "
            f"layer {layer.layer_id} has cross-attention or sliding window "
            f"{layer.sliding_window_size}"
        )
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    if save_kv_cache and k is not None and v is not None:
        self.token_to_kv_pool.set_kv_buffer(
            layer, KVWriteLoc(forward_batch.out_cache_loc, self.swa_out_cache_loc), k, v
        )
    spec_info = forward_batch.spec_info
    num_nodes = int(spec_info.draft_token_num)
    seq_lens = forward_batch.seq_lens.tolist()
    masks = tree_masks(spec_info.custom_mask, seq_lens, num_nodes)

    q_ = q.reshape(-1, layer.tp_q_head_num, layer.qk_head_dim)
    o = q.new_empty((q_.shape[0], layer.tp_q_head_num * layer.v_head_dim))
    o_ = o.view(-1, layer.tp_q_head_num, layer.v_head_dim)
    k_cache = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
    v_cache = self.token_to_kv_pool.get_value_buffer(layer.layer_id)
    req_to_token = self.req_to_token_pool.req_to_token
    for b, (row, seq_len) in enumerate(
        zip(forward_batch.req_pool_indices.tolist(), seq_lens, strict=True)
    ):
        slots = req_to_token[row, : seq_len + num_nodes]
        attn_mask = torch.ones((num_nodes, seq_len + num_nodes), dtype=torch.bool)
        attn_mask[:, seq_len:] = masks[b]
        rows = slice(b * num_nodes, (b + 1) * num_nodes)
        o_[rows] = _attend(q_[rows], k_cache[slots], v_cache[slots], attn_mask, layer)
    return o


def tree_masks(
    custom_mask: torch.Tensor | None,  # bool, QLEN (bs*n*n,) or FULL (sum(s)*n + bs*n*n,)
    seq_lens: list[int],
    num_nodes: int,
) -> list[torch.Tensor]:  # bs x (n, n) bool
    """Each request's ``(n, n)`` node-visibility mask from a verify input's ``custom_mask``.

    On CPU SGLang builds the QLEN layout (``default_tree_mask_mode``; NGRAM keeps its QLEN mask
    off CUDA); the FULL layout (``n`` rows of ``s + n`` columns per request, prefix first) is
    read too. Without a mask, or with one node, the nodes form a causal chain.
    """
    bs, n = len(seq_lens), num_nodes
    if custom_mask is None or custom_mask.numel() == 0 or n == 1:
        return [torch.ones((n, n), dtype=torch.bool).tril()] * bs
    flat = custom_mask.reshape(-1).to(torch.bool)
    if flat.numel() == bs * n * n:
        return list(flat.view(bs, n, n).unbind(0))
    if flat.numel() == sum(seq_lens) * n + bs * n * n:
        masks, offset = [], 0
        for seq_len in seq_lens:
            rows = flat[offset : offset + n * (seq_len + n)].view(n, seq_len + n)
            masks.append(rows[:, seq_len:])
            offset += n * (seq_len + n)
        return masks
    raise ValueError(
        f"verify tree mask has {flat.numel()} entries; expected {bs * n * n} (QLEN layout) or "
        f"{sum(seq_lens) * n + bs * n * n} (FULL layout) for {bs} requests of {n} nodes"
    )


def _attend(
    q: torch.Tensor,  # (q_len, heads, head_dim)
    keys: torch.Tensor,  # (kv_len, kv_heads, head_dim)
    values: torch.Tensor,  # (kv_len, kv_heads, v_head_dim)
    attn_mask: torch.Tensor | None,  # (q_len, kv_len) bool, True = visible
    layer: RadixAttention,
) -> torch.Tensor:  # (q_len, heads, v_head_dim)
    keys = keys.to(q.dtype)
    values = values.to(q.dtype)
    out = scaled_dot_product_attention(
        q.movedim(0, 1).unsqueeze(0),
        keys.movedim(0, 1).unsqueeze(0),
        values.movedim(0, 1).unsqueeze(0),
        attn_mask=attn_mask,
        scale=layer.scaling,
        enable_gqa=layer.tp_q_head_num != layer.tp_k_head_num,
    )
    return out.squeeze(0).movedim(0, 1)


class _DraftStepBackend(TorchNativeAttnBackend):
    """The torch_native backend of one draft-decode step: each branch's query attends to its
    own row of a draft request-to-token table, over ``seq_len + step + 1`` slots."""

    def __init__(self, model_runner: ModelRunner) -> None:
        super().__init__(model_runner)
        # (req_to_token_draft (bs*topk, pool_len), rows (bs*topk,), seq_lens (bs*topk,))
        self.step_metadata: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        from sglang.srt.mem_cache.memory_pool import KVWriteLoc

        if self.step_metadata is None:
            raise RuntimeError(
                "draft decode step ran before TorchNativeMultiStepDraftBackend."
                "init_forward_metadata"
            )
        if save_kv_cache and k is not None and v is not None:
            self.token_to_kv_pool.set_kv_buffer(
                layer, KVWriteLoc(forward_batch.out_cache_loc, None), k, v
            )
        req_to_token, rows, seq_lens = self.step_metadata
        q_ = q.reshape(-1, layer.tp_q_head_num, layer.qk_head_dim)
        o = q.new_empty((q_.shape[0], layer.tp_q_head_num * layer.v_head_dim))
        o_ = o.view(-1, layer.tp_q_head_num, layer.v_head_dim)
        k_cache = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
        v_cache = self.token_to_kv_pool.get_value_buffer(layer.layer_id)
        for i, (row, seq_len) in enumerate(zip(rows.tolist(), seq_lens.tolist(), strict=True)):
            slots = req_to_token[row, :seq_len]
            o_[i : i + 1] = _attend(q_[i : i + 1], k_cache[slots], v_cache[slots], None, layer)
        return o


class TorchNativeMultiStepDraftBackend:
    """Per-step torch_native backends for EAGLE-style multi-step draft decode.

    ``init_forward_metadata`` builds, once per draft round, the draft request-to-token table
    (``build_draft_decode_metadata_cpu``: row ``b * topk + t`` = request ``b``'s prefix, then
    branch ``t``'s draft slots) and gives step ``i`` the lengths ``seq_len_b + i + 1``: the token
    decoded at step ``i`` (written at ``seq_len_b + i``) sees the prefix, its branch's earlier
    drafts and itself.
    """

    def __init__(self, model_runner: ModelRunner, topk: int, speculative_num_steps: int) -> None:
        self.topk = topk
        self.speculative_num_steps = speculative_num_steps
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.attn_backends = [
            _DraftStepBackend(model_runner) for _ in range(speculative_num_steps - 1)
        ]

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        req_to_token = self.req_to_token_pool.req_to_token
        req_to_token_draft = build_draft_decode_metadata_cpu(
            req_to_token,
            forward_batch.req_pool_indices,
            forward_batch.seq_lens,
            self.topk,
            self.speculative_num_steps,
            req_to_token.shape[1],
        )
        rows = torch.arange(req_to_token_draft.shape[0])
        branch_seq_lens = forward_batch.seq_lens.to(torch.int64).repeat_interleave(self.topk)
        for step, backend in enumerate(self.attn_backends):
            backend.step_metadata = (req_to_token_draft, rows, branch_seq_lens + step + 1)
