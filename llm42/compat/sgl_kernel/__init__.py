"""Pure-torch stand-in for the ``sgl_kernel`` CPU helpers SGLang 0.5.17 imports on a dense model.

PyPI has no CPU build of sgl-kernel, yet SGLang's CPU path does ``from sgl_kernel import ...`` at
module import time (``mem_cache/allocation.py``, ``kernels/ops/kvcache/cache_move.py``). This module
is importable as top-level ``sgl_kernel`` only through the ``llm42_compat.pth`` file (appended after
site-packages, so a real sgl-kernel always wins); see ``python -m llm42.compat --help``.

    import sgl_kernel                      # resolves here on a CPU-only host
    sgl_kernel.assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start, end, locs, n)

The speculative-decoding ops (``*_cpu`` names re-exported here, and the ``sgl_kernel.speculative``
submodule that NGRAM imports) live in ``speculative.py``.

Deliberately absent: ``torch.ops.sgl_kernel`` registrations. SGLang decides AMX support with
``hasattr(torch.ops.sgl_kernel, "convert_weight_packed")``; keeping that false makes every layer
take its ``forward_native`` path. Any other public name resolves to a stub that raises
``NotImplementedError`` naming the function when it is called (not when it is imported), because
SGLang imports some helpers on paths a dense model never calls.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    import torch

from .speculative import (
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    build_draft_decode_metadata_cpu,
    build_tree_kernel_efficient_cpu,
    check_pool_shape,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
    verify_tree_greedy_cpu,
)

__all__ = [
    "IS_LLM42_STAND_IN",
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_draft_decode_metadata_cpu",
    "build_tree_kernel_efficient_cpu",
    "copy_all_layer_kv_cache_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "verify_tree_greedy_cpu",
]

# Lets tools (and `python -m llm42.compat status`) tell this module from the real package.
IS_LLM42_STAND_IN = True


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,  # (bs,) int, rows of req_to_token
    req_to_token: torch.Tensor,  # (num_reqs, pool_len) int32, written in place
    start_offset: torch.Tensor,  # (bs,) int, first column written per row
    end_offset: torch.Tensor,  # (bs,) int, one past the last column written per row
    out_cache_loc: torch.Tensor,  # (sum(end - start),) int, KV slots, rows concatenated in order
    pool_len: int,
) -> None:
    """Scatter new KV slot ids into the request-to-token table (CPU twin of the Triton kernel).

    For row ``i`` with ``n_i = end_offset[i] - start_offset[i]`` and ``o_i = n_0 + ... + n_{i-1}``:

        req_to_token[req_pool_indices[i], start_offset[i] : end_offset[i]]
            = out_cache_loc[o_i : o_i + n_i]

    Both ranges are half-open. ``pool_len`` is ``req_to_token.shape[1]``; it is checked, not used.
    """
    check_pool_shape(req_to_token, pool_len, "assign_req_to_token_pool_cpu")
    rows = req_pool_indices.tolist()
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    if not len(rows) == len(starts) == len(ends):
        raise ValueError(
            "assign_req_to_token_pool_cpu: req_pool_indices, start_offset and end_offset must have "
            f"one entry per request, got {len(rows)}, {len(starts)}, {len(ends)}"
        )
    num_locs = sum(end - start for start, end in zip(starts, ends, strict=True))
    if num_locs > out_cache_loc.numel():
        raise ValueError(
            f"assign_req_to_token_pool_cpu: rows need {num_locs} cache locations, "
            f"out_cache_loc holds {out_cache_loc.numel()}"
        )
    offset = 0
    for row, start, end in zip(rows, starts, ends, strict=True):
        num_tokens = end - start
        if num_tokens <= 0:
            continue
        req_to_token[row, start:end] = out_cache_loc[offset : offset + num_tokens].to(
            req_to_token.dtype
        )
        offset += num_tokens


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor,  # (num_buffers,) uint64, base address of each per-layer K/V buffer
    strides: torch.Tensor,  # (num_buffers,) int, bytes per slot row of each buffer
    tgt_loc: torch.Tensor,  # (num_locs,) int, destination slot rows
    src_loc: torch.Tensor,  # (num_locs,) int, source slot rows
) -> None:
    """Copy KV slot rows ``src_loc[j] -> tgt_loc[j]`` in all buffers (CPU twin of the tiled kernel).

    Safe for in-place use like the Triton kernel: every source row is read before any target row is
    written. SGLang only hands over raw addresses, so each buffer is viewed through ctypes over
    ``[0, (max(src_loc, tgt_loc) + 1) * stride)`` bytes, which lies inside the buffer because the
    locations index it.
    """
    if tgt_loc.numel() != src_loc.numel():
        raise ValueError(
            f"copy_all_layer_kv_cache_cpu: tgt_loc has {tgt_loc.numel()} entries, "
            f"src_loc has {src_loc.numel()}"
        )
    if tgt_loc.numel() == 0:
        return
    import torch  # lazily: importing this module stays cheap (SGLang imports it early)

    tgt = tgt_loc.to(torch.int64).reshape(-1)
    src = src_loc.to(torch.int64).reshape(-1)
    num_rows = int(torch.maximum(tgt.max(), src.max()).item()) + 1
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        raw = (ctypes.c_uint8 * (num_rows * int(stride))).from_address(int(ptr))
        rows = torch.frombuffer(raw, dtype=torch.uint8).view(num_rows, int(stride))
        rows[tgt] = rows[src]  # advanced indexing gathers a copy of the sources first


def _not_implemented(name: str) -> Callable[..., NoReturn]:
    def stub(*args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(
            f"sgl_kernel.{name} is not implemented by llm42's CPU stand-in "
            f"(llm42/compat/sgl_kernel). It provides only {', '.join(__all__[1:])}; "
            "this SGLang code path needs a real sgl-kernel build (GPU host) or a pure-torch "
            "version added to llm42.compat.sgl_kernel."
        )

    stub.__name__ = stub.__qualname__ = name
    stub.__doc__ = f"Placeholder for sgl_kernel.{name}: raises NotImplementedError when called."
    return stub


def __getattr__(name: str) -> Callable[..., NoReturn]:
    # Dunder/private lookups (``__version__``, ``__path__`` probes, pickling) must fail normally.
    if name.startswith("_"):
        raise AttributeError(f"module 'sgl_kernel' (llm42 CPU stand-in) has no attribute {name!r}")
    return _not_implemented(name)
