"""Sampling hooks: seeded noise for every row of a decode batch, and logits for every row of a
verification pass. (Per-kind sampling of mixed batches: `group_sampling`.)"""

from __future__ import annotations

import random

import torch

from llm42.sglang import det_rows, request_state, runtime, verifier


def sampling_info_hook(result, cls, batch, vocab_size, *args, **kwargs):
    """AFTER SamplingBatchInfo.from_schedule_batch: seeded noise for every row.

    Deterministic rows use their seed, so decode and verifier draw the same noise at the same
    position; other rows get a random per-request seed (their output stays random). Always
    setting the tensor keeps SGLang's merge/filter of batches aligned."""
    if runtime.RUNTIME is None:
        return result
    det_rows.mark(result, [request_state.det_state(req) is not None for req in batch.reqs])
    if result.sampling_seed is not None:
        return result
    seeds = []
    for req in batch.reqs:
        fields = request_state.of(req)
        if (fields is not None and fields.det is not None) or (
                req.sampling_params.sampling_seed is not None):
            seeds.append(verifier.seed_of(req.sampling_params))
        else:
            if fields is None:
                fields = request_state.attach(req)
            if fields.noise_seed is None:
                fields.noise_seed = random.getrandbits(62)
            seeds.append(fields.noise_seed)
    result.sampling_seed = verifier.to_device(seeds, torch.int64, batch.device)
    return result


def logits_metadata_hook(result, *args, **kwargs):
    """AFTER LogitsMetadata.from_forward_batch: the verify pass needs logits for every row."""
    if runtime.IN_VERIFY_PASS:
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        result.forward_mode = ForwardMode.TARGET_VERIFY
    return result
