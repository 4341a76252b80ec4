"""Plain-torch twins of sgl-kernel's CPU speculative-decoding ops (SGLang 0.5.17, CPU hosts).

SGLang's speculative workers import these at module import time on a CPU engine
(``speculative/eagle_utils.py``, ``eagle_worker_common.py``, ``spec_utils.py``,
``kernels/ops/speculative/{cache_locs,eagle}.py``, and ``ngram_worker.py``'s
``from sgl_kernel.speculative import reconstruct_indices_from_tree_mask``). PyPI has no CPU
sgl-kernel, so without these every ``--speculative-algorithm`` dies at startup. Each function
follows the C++ kernel of the same name in sgl-kernel ``csrc/cpu/spec.cpp`` (argument order, dtypes,
in-place outputs); SGLang's Triton kernels of the same names are the references the tests compare
with. Loops run over requests and tree nodes on host lists: batches and trees are small, and the
per-node walk is the algorithm.

    from sgl_kernel.speculative import reconstruct_indices_from_tree_mask   # CPU: resolves here
    verify_tree_greedy_cpu(predicts, accept_index, accept_token_num, candidates, ...)

Shapes: ``bs`` requests, ``n`` = draft_token_num tree nodes per request (node 0 is the root, the
last verified token), flat node index ``b * n + i``. Tree links are -1 where there is none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = [
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "build_draft_decode_metadata_cpu",
    "build_tree_kernel_efficient_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "reconstruct_indices_from_tree_mask",
    "verify_tree_greedy_cpu",
]

_QLEN_ONLY = 1  # TreeMaskMode: 0 FULL_MASK (prefix columns too), 1 QLEN_ONLY (n x n per request)


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,  # (bs,) int
    req_to_token: torch.Tensor,  # (num_reqs, pool_len) int32
    start_offset: torch.Tensor,  # (bs,) int
    end_offset: torch.Tensor,  # (bs,) int
    out_cache_loc: torch.Tensor,  # (sum(end - start),) int64, written
    pool_len: int,
) -> None:
    """Gather KV slots: ``out_cache_loc[o_i : o_i + n_i] = req_to_token[row_i, start_i : end_i]``
    with ``n_i = end_i - start_i`` and ``o_i`` the sum of the earlier ``n``. The verify pass reads
    the slots that SGLang over-allocated for the drafts this way."""
    check_pool_shape(req_to_token, pool_len, "assign_extend_cache_locs_cpu")
    offset = 0
    for row, start, end in zip(
        req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist(), strict=True
    ):
        num_tokens = end - start
        out_cache_loc[offset : offset + num_tokens] = req_to_token[row, start:end]
        offset += num_tokens


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,  # (bs,) int
    req_to_token: torch.Tensor,  # (num_reqs, pool_len) int32
    seq_lens: torch.Tensor,  # (bs,) int
    out_cache_loc: torch.Tensor,  # (bs * topk * num_steps,) int64, written
    pool_len: int,
    topk: int,
    num_steps: int,
) -> None:
    """The draft-decode write slots: ``out_cache_loc[b * k : (b + 1) * k] =
    req_to_token[row_b, seq_len_b : seq_len_b + k]`` with ``k = topk * num_steps``."""
    check_pool_shape(req_to_token, pool_len, "assign_draft_cache_locs_contiguous_cpu")
    copy_len = topk * num_steps
    if out_cache_loc.numel() != req_pool_indices.numel() * copy_len:
        raise ValueError(
            f"assign_draft_cache_locs_contiguous_cpu: out_cache_loc has {out_cache_loc.numel()} "
            f"entries, expected bs * topk * num_steps = {req_pool_indices.numel() * copy_len}"
        )
    for b, (row, start) in enumerate(
        zip(req_pool_indices.tolist(), seq_lens.tolist(), strict=True)
    ):
        out_cache_loc[b * copy_len : (b + 1) * copy_len] = req_to_token[
            row, start : start + copy_len
        ]


def build_draft_decode_metadata_cpu(
    req_to_token: torch.Tensor,  # (num_reqs, pool_len) int32
    req_pool_indices: torch.Tensor,  # (bs,) int
    seq_lens: torch.Tensor,  # (bs,) int
    topk: int,
    num_steps: int,
    pool_len: int,
) -> torch.Tensor:  # (bs * topk, pool_len) int32
    """A request-to-token table for multi-step draft decode: row ``b * topk + t`` holds request
    ``b``'s committed prefix ``[0, seq_len_b)`` followed by branch ``t``'s draft slots (laid out
    at ``seq_len_b + t * num_steps`` by ``assign_draft_cache_locs_contiguous_cpu``). Only the first
    ``seq_len_b + num_steps`` columns of each row are defined."""
    import torch

    check_pool_shape(req_to_token, pool_len, "build_draft_decode_metadata_cpu")
    out = torch.empty((req_pool_indices.numel() * topk, pool_len), dtype=req_to_token.dtype)
    for b, (row, seq_len) in enumerate(
        zip(req_pool_indices.tolist(), seq_lens.tolist(), strict=True)
    ):
        for t in range(topk):
            flat = b * topk + t
            out[flat, :seq_len] = req_to_token[row, :seq_len]
            draft_start = seq_len + t * num_steps
            out[flat, seq_len : seq_len + num_steps] = req_to_token[
                row, draft_start : draft_start + num_steps
            ]
    return out


def build_tree_kernel_efficient_cpu(
    parent_list: torch.Tensor,  # (bs, topk * (depth - 1) + 1) int64
    selected_index: torch.Tensor,  # (bs, n - 1) int64
    verified_seq_len: torch.Tensor,  # (bs,) int64
    tree_mask: torch.Tensor,  # bool, written: QLEN_ONLY (bs*n*n,), FULL_MASK (sum(seq)*n + bs*n*n,)
    positions: torch.Tensor,  # (bs * n,) int64, written
    retrive_index: torch.Tensor,  # (bs, n) int64, written
    retrive_next_token: torch.Tensor,  # (bs, n) int64, pre-filled with -1, written
    retrive_next_sibling: torch.Tensor,  # (bs, n) int64, pre-filled with -1, written
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """Build the EAGLE draft tree for the verify pass from the draft's top-k bookkeeping.

    Node ``i >= 1`` is draft token ``selected_index[b, i - 1]``; its parent is found through
    ``parent_list``. Writes, per request: ``retrive_index[b, i] = b * n + i``; the first-child /
    next-sibling links (a later node becomes the first child, pushing the earlier one to its
    sibling); each node's position ``seq_len + depth``; and the tree mask rows (root and
    ancestors and the node itself true, other tree columns false; FULL_MASK rows also have the
    ``seq_len`` prefix columns, which are left as the caller filled them).
    """
    mode = int(tree_mask_mode)
    if mode not in (0, _QLEN_ONLY):
        raise ValueError(
            f"build_tree_kernel_efficient_cpu: tree_mask_mode {mode} (QLEN_ONLY_BITPACKING) has "
            "no CPU implementation; CPU workers use FULL_MASK (0) or QLEN_ONLY (1)"
        )
    n = draft_token_num
    parents = parent_list.tolist()
    selected = selected_index.tolist()
    seq_lens = verified_seq_len.tolist()
    next_token = retrive_next_token.tolist()
    next_sibling = retrive_next_sibling.tolist()
    mask_offset = 0  # FULL_MASK: rows of earlier requests are (seq_len + n) wide
    for b, seq_len in enumerate(seq_lens):
        sel, par = selected[b], parents[b]
        retrive_index[b] = _arange(b * n, n, retrive_index)
        positions[b * n] = seq_len
        for i in range(n - 1, 0, -1):
            parent = _parent_slot(sel, par, i, topk, n)
            if parent == n:
                continue  # the C++ kernel skips a node whose parent is not in the tree
            if next_token[b][parent] != -1:
                next_sibling[b][i] = next_token[b][parent]
            next_token[b][parent] = i

        if mode == _QLEN_ONLY:
            row_stride, row_base, prefix = n, b * n * n, 0
        else:
            row_stride, row_base, prefix = seq_len + n, mask_offset, seq_len
            mask_offset += (seq_len + n) * n
        for node in range(n):
            row = row_base + node * row_stride + prefix
            tree_mask[row : row + n] = False
            tree_mask[row] = True  # the root
            num_ancestors = 0
            cur = node
            while cur > 0:  # the node itself, then each ancestor up to (not including) the root
                num_ancestors += 1
                tree_mask[row + cur] = True
                cur = _parent_slot(sel, par, cur, topk, n)
                if cur == n:
                    break
            if node > 0:
                positions[b * n + node] = seq_len + num_ancestors
    retrive_next_token.copy_(_tensor_like(next_token, retrive_next_token))
    retrive_next_sibling.copy_(_tensor_like(next_sibling, retrive_next_sibling))


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,  # (bs * n,) int32, written
    accept_index: torch.Tensor,  # (bs, num_spec_step) int32, written (-1 pre-filled by caller)
    accept_token_num: torch.Tensor,  # (bs,) int32, written: accepted drafts, bonus excluded
    candidates: torch.Tensor,  # (bs, n) int: draft token of each node
    retrive_index: torch.Tensor,  # (bs, n) int: flat index of each node
    retrive_next_token: torch.Tensor,  # (bs, n) int
    retrive_next_sibling: torch.Tensor,  # (bs, n) int
    target_predict: torch.Tensor,  # (bs, n) int: the target's argmax after each node
) -> None:
    """Greedy tree verification: from the root, repeatedly descend to the first child whose draft
    token equals the target's argmax after the last accepted node. Accepted flat indices go to
    ``accept_index[b, 0..k]`` (root first); ``predicts`` gets the target token at every accepted
    node, so the last accepted node's entry is the bonus token."""
    bs = candidates.shape[0]
    num_spec_step = accept_index.shape[1]
    cands = candidates.tolist()
    flat_index = retrive_index.tolist()
    next_token = retrive_next_token.tolist()
    next_sibling = retrive_next_sibling.tolist()
    targets = target_predict.reshape(-1).tolist()  # by flat index
    for b in range(bs):
        last = flat_index[b][0]
        accept_index[b, 0] = last
        num_correct = 0
        cur = 0
        for _ in range(1, num_spec_step):
            cur = next_token[b][cur]
            while cur != -1 and cands[b][cur] != targets[last]:
                cur = next_sibling[b][cur]
            if cur == -1:
                break
            predicts[last] = targets[last]
            num_correct += 1
            accept_index[b, num_correct] = flat_index[b][cur]
            last = flat_index[b][cur]
        accept_token_num[b] = num_correct
        predicts[last] = targets[last]


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor,  # (bs * accept_stride,) int32
    accept_lens: torch.Tensor,  # (bs,) int32, bonus included
    bonus_tokens: torch.Tensor,  # (bs,) int32, written
    accept_stride: int,
) -> None:
    """``bonus_tokens[b] = accept_tokens[b * accept_stride + accept_lens[b] - 1]``: the last
    accepted token of each request, the root of its next draft tree."""
    flat = accept_tokens.reshape(-1)
    for b, accept_len in enumerate(accept_lens.tolist()):
        bonus_tokens[b] = flat[b * accept_stride + accept_len - 1]


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor,  # (bs, num_spec_step) or flat int, -1 = rejected
    out_cache_loc: torch.Tensor,  # (bs * n,) int64: the verify pass's KV slots
    accept_out_cache_loc: torch.Tensor,  # (num_accepted,) int64, written
    size: int | None = None,  # entries of accept_index to scan (default: all)
) -> None:
    """Compact the accepted tokens' KV slots in order:
    ``accept_out_cache_loc = [out_cache_loc[i] for i in accept_index.flatten() if i > -1]``.
    (sgl-kernel's newer op takes ``size``; SGLang 0.5.17 calls it without.)"""
    indices = accept_index.reshape(-1).tolist()
    if size is not None:
        indices = indices[:size]
    accepted = [i for i in indices if i > -1]
    if len(accepted) > accept_out_cache_loc.numel():
        raise ValueError(
            f"fill_accept_out_cache_loc_cpu: {len(accepted)} accepted entries, "
            f"accept_out_cache_loc holds {accept_out_cache_loc.numel()}"
        )
    for dst, src in enumerate(accepted):
        accept_out_cache_loc[dst] = out_cache_loc[src]


def reconstruct_indices_from_tree_mask(
    tree_mask: torch.Tensor,  # (bs * n * n,) bool: [b, i, j] true when node j is i or i's ancestor
    verified_seq_len: torch.Tensor,  # (bs,) int
    positions: torch.Tensor,  # (bs * n,) written
    retrive_index: torch.Tensor,  # (bs, n) written
    retrive_next_token: torch.Tensor,  # (bs, n) written
    retrive_next_sibling: torch.Tensor,  # (bs, n) written
    batch_size: int,
    draft_token_num: int,
) -> None:
    """Tree links of an NGRAM draft from its QLEN ancestor mask (nodes in BFS order).

    For node ``i`` of request ``b``: depth = number of ancestors ``j < i``; parent = the
    largest such ``j``; ``positions = seq_len + depth``; ``retrive_index = b * n + i``; first
    child = the smallest ``k > i`` that has ``i`` as an ancestor; next sibling = the smallest
    ``k > i`` whose ancestors between its parent and itself are none, i.e. whose parent is
    ``i``'s parent."""
    n = draft_token_num
    mask = tree_mask.reshape(batch_size, n, n).tolist()
    seq_lens = verified_seq_len.tolist()
    for b in range(batch_size):
        tree = mask[b]
        ancestors = [[j for j in range(i) if tree[i][j]] for i in range(n)]
        parent = [a[-1] if a else -1 for a in ancestors]
        retrive_index[b] = _arange(b * n, n, retrive_index)
        for i in range(n):
            positions[b * n + i] = seq_lens[b] + len(ancestors[i])
            retrive_next_token[b, i] = next((k for k in range(i + 1, n) if tree[k][i]), -1)
            sibling = -1
            if parent[i] != -1:
                sibling = next((k for k in range(i + 1, n) if parent[k] == parent[i]), -1)
            retrive_next_sibling[b, i] = sibling


def _parent_slot(selected: list[int], parents: list[int], node: int, topk: int, n: int) -> int:
    """The tree node (1-based, 0 = root) that is ``node``'s parent, ``n`` when it is not in the
    tree. Node ``i`` is draft candidate ``selected[i - 1]``; candidate ``c`` was expanded from
    top-k slot ``c // topk``, whose candidate is ``parents[c // topk]`` (slot 0: the root)."""
    parent_tb_idx = selected[node - 1] // topk
    if parent_tb_idx == 0:
        return 0
    parent_token_idx = parents[parent_tb_idx]
    for pos, token_idx in enumerate(selected):
        if token_idx == parent_token_idx:
            return pos + 1
    return n


def check_pool_shape(req_to_token: torch.Tensor, pool_len: int, name: str) -> None:
    """``req_to_token`` is SGLang's (num_reqs, pool_len) table; `name` is the op that asks."""
    if req_to_token.dim() != 2 or req_to_token.shape[1] != pool_len:
        raise ValueError(
            f"{name}: expected req_to_token of shape (num_reqs, {pool_len}), "
            f"got {tuple(req_to_token.shape)}"
        )


def _arange(start: int, count: int, like: torch.Tensor) -> torch.Tensor:
    import torch

    return torch.arange(start, start + count, dtype=like.dtype, device=like.device)


def _tensor_like(values: list, like: torch.Tensor) -> torch.Tensor:
    import torch

    return torch.tensor(values, dtype=like.dtype, device=like.device)
