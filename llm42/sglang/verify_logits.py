"""What SGLang adds to a deterministic row's logits before the Sampler, replayed by the verifier.

On the fast path `ModelRunner._preprocess_logits` calls `SamplingBatchInfo.apply_logits_bias`:
additive penalties first (`BatchedMinNewTokensPenalizer` among them), then the grammar mask, then
`logits.add_(logit_bias)`. The verifier samples through the same Sampler but with a
SamplingBatchInfo of its own, so it applies the features a deterministic request may use itself,
in SGLang's order and with SGLang's float32 values and ops, entry by entry:

1. min_new_tokens: at an entry predicting output token k (k output tokens before it; o_0 is
   k = 0), the request's stop tokens get -inf added while k < min_new_tokens. Stop tokens are the
   penalizer's: stop_token_ids | the tokenizer's additional stop ids | its eos id.
2. logit_bias: a float32 [vocab] row, `row[int(key)] = value`, added.

Both are functions of the request and the position only, never of verified tokens, so the
verifier's value at a position is the fast path's there. A row whose batch mates use a feature it
does not use gets 0.0 added on the fast path: x + 0.0 == x (only -0.0 becomes +0.0, which
compares, exponentiates and sorts identically), so the verifier adds nothing for it.

    verify_logits.apply(logits, reqs, output_indices)   # in place, before the Sampler
"""

from __future__ import annotations

import torch


def apply(logits: torch.Tensor, reqs: list, output_indices: list[int]) -> None:
    """logits: [n, vocab] float32 (modified in place); row i predicts output token
    `output_indices[i]` of `reqs[i]`."""
    vocab_size = logits.shape[1]
    masked = [i for i, (req, k) in enumerate(zip(reqs, output_indices))
              if k < (req.sampling_params.min_new_tokens or 0)]
    if masked:
        additive = torch.zeros_like(logits)
        for i in masked:
            additive[i, stop_token_ids(reqs[i], vocab_size)] = float("-inf")
        logits.add_(additive)
    biased = [i for i, req in enumerate(reqs) if req.sampling_params.logit_bias]
    if biased:
        bias = torch.zeros_like(logits)
        for i in biased:
            for key, value in reqs[i].sampling_params.logit_bias.items():
                bias[i, int(key)] = value
        logits.add_(bias)


def stop_token_ids(req, vocab_size: int) -> list[int]:
    """The token ids `BatchedMinNewTokensPenalizer` masks for this request (inside the vocab)."""
    tokenizer = req.tokenizer
    ids = set(req.sampling_params.stop_token_ids or ())
    ids |= set(getattr(tokenizer, "additional_stop_token_ids", None) or ())
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is not None:
        ids.add(eos)
    return sorted(i for i in ids if 0 <= i < vocab_size)


def output_index(req, position: int) -> int:
    """The output index of the token predicted at absolute `position` (the input token's)."""
    return position + 1 - len(req.origin_input_ids)
