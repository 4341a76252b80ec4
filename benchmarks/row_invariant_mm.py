"""A GEMM whose row results cannot depend on how many rows it computes, or where they sit.

    from benchmarks.row_invariant_mm import row_invariant_linear
    out = row_invariant_linear(x, w, torch.float32)   # x [M, K] bf16 @ w [N, K]^T -> [M, N] fp32

Every output element is accumulated in fp32 over K in the same tile order (BLOCK_K steps, one
`tl.dot` chain, no split-K) by a program that owns a fixed BLOCK_M x BLOCK_N tile. The tile sizes
are a function of (N, K) only, never of M, and M is not specialized by Triton
(`do_not_specialize`), so one compiled kernel serves every M: a row's bits depend on its own
input and the weight alone. Autotuning would break that (its pick can differ between processes),
so the configurations are fixed per shape; they are chosen by rule, not tuned on a GPU yet.

The grid runs the M tiles of one N tile next to each other (program id 0 is the M tile), so a
weight tile is read from HBM once and the few activation rows come from L2.

Needs CUDA and Triton; `row_invariant_linear` raises ImportError where Triton is missing.
"""

from __future__ import annotations

import functools

import torch

BLOCK_M = 64
BLOCK_K = 64
MIN_PROGRAMS = 96  # below this many N tiles, narrower tiles: a decode-sized M reads the weight
# with too few thread blocks to use the HBM bandwidth otherwise (a fixed rule, not a tuning)


def config_for(n: int, k: int) -> dict:
    """The tile configuration of an (N, K) weight: the same for every M."""
    block_n = 128
    while block_n > 32 and -(-n // block_n) < MIN_PROGRAMS:
        block_n //= 2
    return {"BLOCK_M": BLOCK_M, "BLOCK_N": block_n, "BLOCK_K": BLOCK_K, "num_warps": 4,
            "num_stages": 4}


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["M"])
    def row_invariant_mm_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bn,
                                stride_bk, stride_cm, stride_cn, BLOCK_M: tl.constexpr,
                                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
        b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(tl.cdiv(K, BLOCK_K)):
            k_left = K - kt * BLOCK_K
            a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left),
                        other=0.0)
            b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & (offs_n[None, :] < N),
                        other=0.0)
            acc = tl.dot(a, b, acc)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
        c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
        c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)

    return row_invariant_mm_kernel, triton.cdiv


def row_invariant_linear(x: torch.Tensor, w: torch.Tensor,
                         out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [M, K] @ w [N, K]^T -> [M, N] in `out_dtype` (default x's dtype), fp32 accumulation."""
    kernel, cdiv = _kernel()
    m, k = x.shape
    n, k_w = w.shape
    if k != k_w:
        raise ValueError(f"row_invariant_linear: x has K = {k}, the weight {k_w}")
    out = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    cfg = config_for(n, k)
    grid = (cdiv(m, cfg["BLOCK_M"]), cdiv(n, cfg["BLOCK_N"]))
    kernel[grid](x, w, out, m, n, k, x.stride(0), x.stride(1), w.stride(0), w.stride(1),
                 out.stride(0), out.stride(1), **cfg)
    return out
