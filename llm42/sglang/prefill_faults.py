"""Test fault: a fast-path prefill whose KV and first token depend on the run.

On a small CPU model a batched prefill happens to give the same KV as a solo one, so nothing
would show that the prompt pass (`--llm42-batched-prefill`) really replaces what the fast path
wrote. With `LLM42_TEST_PERTURB_PREFILL=1` every deterministic request prefilled on the fast path
gets random noise on its prompt KV (every layer) and a random o_0, different on every run; the
prompt pass must restore both bit for bit. Never set outside tests.
"""

from __future__ import annotations

import os
import random

ENV = "LLM42_TEST_PERTURB_PREFILL"


def enabled() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


def perturb(scheduler, req, start: int = 0) -> None:
    """Noise on the prompt KV slots [start, P) of `req` (what its prefill wrote: a prefix-cache
    hit's shared KV stays as verified) and a random candidate o_0 (also the next input)."""
    rng = random.Random()
    perturb_kv(scheduler, req, start, len(req.origin_input_ids), rng)
    token = rng.randrange(scheduler.model_config.vocab_size)
    req.output_ids[0] = token
    scheduler.future_map.output_tokens_buf[req.req_pool_idx] = token


def perturb_kv(scheduler, req, start: int, end: int, rng: random.Random | None = None) -> None:
    """Noise on the KV slots [start, end) of `req`, every layer: what a fast-path prefill of
    that chunk might have written instead (an inline prefill's rows must overwrite it)."""
    import torch

    rng = rng or random.Random()
    kv = scheduler.token_to_kv_pool_allocator.get_kvcache()
    slots = scheduler.req_to_token_pool.req_to_token[req.req_pool_idx, start:end].long()
    gen = torch.Generator(device="cpu").manual_seed(rng.getrandbits(63))
    for layer in range(kv.start_layer, kv.start_layer + kv.layer_num):
        for buf in kv.get_kv_buffer(layer):
            noise = torch.randn(buf[slots].shape, generator=gen) * 0.05
            buf[slots] += noise.to(buf.device, buf.dtype)
