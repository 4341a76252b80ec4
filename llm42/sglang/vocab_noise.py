"""Seeded top-k / top-p / min-p draws whose noise is keyed by vocabulary id (deterministic rows).

SGLang's seeded sorted sampler (`top_k_top_p_min_p_sampling_from_probs_torch` ->
`multinomial_with_seed`) draws its Gumbel noise by *sorted rank*. Decode and the verifier compute
slightly different probabilities; when two near-tied tokens swap ranks they swap their noise too,
and the draw can flip to a third token that neither tie member was: a rollback that no change of
the winner caused. Measured on SmolLM2 real weights (CPU), seeded top_p 0.9 requests recomputed
1.97x as many tokens as temperature-only ones.

Here the masks are computed in sorted space (as SGLang computes them) but applied in vocabulary
order, and the noise of token v at a position is a function of (seed, position, v) alone:

    probs [n, V] --sort--> keep_sorted [n, V] --scatter by id--> keep [n, V]
    score[v] = log p[v] + gumbel(murmur(seed, position, v))   (v kept; -inf otherwise)
    token = argmax_v score[v]

So a perturbation that reorders tokens changes the draw only when a token whose membership or
score moved is (or becomes) the argmax. Temperature-only rows already draw by id in SGLang and
are left to it; normal requests never take this path (`det_rows`).
"""

from __future__ import annotations

import torch

GROUP_ATTR = "llm42_vocab_noise"  # set on the per-kind copy of a SamplingBatchInfo
_TWO_32 = float(1 << 32)


def keep_mask(probs: torch.Tensor, top_ks: torch.Tensor, top_ps: torch.Tensor,
              min_ps: torch.Tensor) -> torch.Tensor:
    """[n, V] bool in vocabulary order: the tokens SGLang's sorted sampler would keep.

    As in SGLang: top-p on the cumulative mass of the untruncated sorted distribution, min-p
    relative to the most likely token; the most likely token is always kept."""
    sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)
    ranks = torch.arange(probs.shape[-1], device=probs.device).view(1, -1)
    keep = ranks < top_ks.view(-1, 1).to(torch.int64)
    keep &= (sorted_probs.cumsum(dim=-1) - sorted_probs) <= top_ps.view(-1, 1)
    keep &= sorted_probs >= sorted_probs[:, :1] * min_ps.view(-1, 1)
    keep[:, 0] = True
    return torch.zeros_like(keep).scatter_(1, order, keep)


def gumbel_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int,
                 device) -> torch.Tensor:
    """[n, V] float64 Gumbel noise of (seed, position, vocabulary id), always finite.

    The hash is SGLang's `murmur_hash32` (its Triton kernel on GPU, llm42's bit-identical torch
    version on CPU); u = (h + 0.5) / 2**32 lies strictly inside (0, 1)."""
    from sglang.srt.layers import sampler as sglang_sampler

    columns = torch.arange(vocab_size, device=device)
    hashed = sglang_sampler.murmur_hash32(seeds.to(torch.uint64), positions, columns)
    u = (hashed.to(torch.float64) + 0.5) / _TWO_32
    return -torch.log(-torch.log(u))


def draw(probs: torch.Tensor, top_ks: torch.Tensor, top_ps: torch.Tensor, min_ps: torch.Tensor,
         seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """probs [n, V] (temperature applied), per-row top_ks [n], top_ps [n], min_ps [n],
    seeds [n], positions [n] -> token ids [n] int32."""
    keep = keep_mask(probs, top_ks, top_ps, min_ps)
    scores = probs.to(torch.float64).log_()
    scores += gumbel_noise(seeds, positions, probs.shape[-1], probs.device)
    scores.masked_fill_(~keep, float("-inf"))
    return scores.argmax(dim=-1).to(torch.int32)


def sample_from_probs_hook(original, sampler, probs, sampling_info, positions,
                           simple_sampling_case):
    """AROUND Sampler._sample_from_probs: the per-kind group of deterministic truncated rows
    (`group_sampling` sets GROUP_ATTR on it) draws by vocabulary id; every other call is
    SGLang's."""
    if simple_sampling_case or not getattr(sampling_info, GROUP_ATTR, False):
        return original(sampler, probs, sampling_info, positions, simple_sampling_case)
    return draw(probs, sampling_info.top_ks, sampling_info.top_ps, sampling_info.min_ps,
                sampling_info.sampling_seed, positions)
