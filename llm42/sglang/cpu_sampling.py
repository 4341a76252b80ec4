"""A pure-torch `murmur_hash32` for CPU-only hosts, bit-identical to SGLang's Triton kernel.

SGLang's seeded sampler (`multinomial_with_seed`: Gumbel-max over a hash of seed, position and
vocabulary index) is what lets decode and verification draw the same noise; its hash is a Triton
kernel, which has no CPU driver. llm42 replaces it only when `SGLANG_USE_CPU_ENGINE=1`.
"""

from __future__ import annotations

import torch

_MASK = 0xFFFFFFFF


def _rotl32(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) | (x >> (32 - r))) & _MASK


def _mix(h: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    # int64 products wrap modulo 2**64; their low 32 bits are the uint32 products.
    k = (k * 0xCC9E2D51) & _MASK
    k = _rotl32(k, 15)
    k = (k * 0x1B873593) & _MASK
    h = h ^ k
    h = _rotl32(h, 13)
    return (h * 5 + 0xE6546B64) & _MASK


def _fmix(h: torch.Tensor) -> torch.Tensor:
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _MASK
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _MASK
    return h ^ (h >> 16)


def murmur_hash32(seed: torch.Tensor, positions: torch.Tensor, col_indices: torch.Tensor):
    """[n] seeds, [n] positions, [m] columns -> [n, m] uint32 hashes (as SGLang's kernel)."""
    assert seed.shape == positions.shape and seed.dim() == 1 and col_indices.dim() == 1
    s = seed.to(torch.int64)
    lo, hi = (s & _MASK).view(-1, 1), ((s >> 32) & _MASK).view(-1, 1)
    pos = (positions.to(torch.int64) & _MASK).view(-1, 1)
    col = (col_indices.to(torch.int64) & _MASK).view(1, -1)
    h = _mix(_mix(_mix(torch.zeros_like(lo), lo), hi), pos)
    h = _fmix(_mix(h, col) ^ 16)
    return h.to(torch.uint32)
