"""What SGLang adds to a deterministic row's logits before the Sampler, replayed by the verifier.

On the fast path `Scheduler._forward_isolation` hands the model runner a `copy_for_forward` of the
batch's SamplingBatchInfo, whose penalties are pre-accumulated (`update_penalties`), and
`SamplingBatchInfo.apply_logits_bias` then runs, in this order:

1. `logits += acc`, acc = zeros - frequency - presence + min_new_tokens mask (float32; the sum
   is the same in any order: 0 - f is exact and each later term is one rounding, or -inf);
2. `apply_scaling_penalties(logits, repetition)`;
3. the grammar mask (`grammar_replay.apply_masks`: the matcher's bitmask before that token);
4. `logits += logit_bias`;

and the Sampler then applies custom logit processors first (`custom_processors`, replayed with the
tokens before each position). The verifier samples through the same Sampler with a
SamplingBatchInfo of its own, so it applies these itself, per entry, with SGLang's float32 values,
ops and order. At an entry predicting output token k, SGLang's penalizers have seen the output
tokens o_0 .. o_{k-1} (one per decode step, `ScheduleBatch.prepare_for_decode`), and `penalty_rows`
rebuilds their state from exactly those tokens:

- frequency: `penalty` added count(v) times, one float32 addition at a time (a lookup table);
- presence: `penalty` where count(v) > 0; repetition: `penalty` where count(v) > 0, else 1;
- min_new_tokens: stop tokens get -inf while k < min_new_tokens (stop_token_ids | the
  tokenizer's additional stop ids | its eos id);
- logit_bias: a float32 [vocab] row, `row[int(key)] = value`.

A row whose batch mates use a feature it does not use gets 0.0 added (or is scaled by 1.0) on the
fast path: x + 0.0 == x and x * 1.0 == x / 1.0 == x (only -0.0 becomes +0.0, which compares,
exponentiates and sorts identically), so the verifier leaves it alone.

    verify_logits.apply(logits, reqs, output_indices)   # in place, before the Sampler
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llm42.sglang import custom_processors, grammar_replay


@dataclass
class PenaltyRows:
    """SGLang's penalizer state of one request after some output tokens: [vocab] float32 each
    (None: the request does not use that penalty)."""

    frequency: torch.Tensor | None
    presence: torch.Tensor | None
    repetition: torch.Tensor | None


def apply(logits: torch.Tensor, reqs: list, output_indices: list[int]) -> None:
    """logits: [n, vocab] float32 (modified in place); row i predicts output token
    `output_indices[i]` of `reqs[i]`."""
    vocab_size = logits.shape[1]
    additive = scaling = None
    for i, (req, k) in enumerate(zip(reqs, output_indices)):
        sp = req.sampling_params
        is_masked = k < (sp.min_new_tokens or 0)
        rows = (penalty_rows(req, list(req.output_ids[:k]), vocab_size, logits.device)
                if uses_penalties(sp) else _NO_PENALTIES)
        if rows.frequency is not None or rows.presence is not None or is_masked:
            additive = torch.zeros_like(logits) if additive is None else additive
            if rows.frequency is not None:
                additive[i].sub_(rows.frequency)
            if rows.presence is not None:
                additive[i].sub_(rows.presence)
            if is_masked:
                additive[i, stop_token_ids(req, vocab_size)] += float("-inf")
        if rows.repetition is not None:
            scaling = torch.ones_like(logits) if scaling is None else scaling
            scaling[i] = rows.repetition
    if additive is not None:
        logits.add_(additive)
    if scaling is not None:
        from sglang.srt.sampling.penaltylib.repetition_penalty import apply_scaling_penalties

        apply_scaling_penalties(logits, scaling)
    grammar_replay.apply_masks(logits, reqs, output_indices)
    biased = [i for i, req in enumerate(reqs) if req.sampling_params.logit_bias]
    if biased:
        bias = torch.zeros_like(logits)
        for i in biased:
            for key, value in reqs[i].sampling_params.logit_bias.items():
                bias[i, int(key)] = value
        logits.add_(bias)
    custom_processors.apply(logits, reqs, output_indices)


_NO_PENALTIES = PenaltyRows(None, None, None)


def adjusts(req) -> bool:
    """Whether `apply` changes anything of `req`'s logits (penalties, a min_new_tokens mask,
    a grammar, logit_bias, a custom logit processor). Where it does not, the Sampler alone makes
    the verifier's token from the verifier's logits, as it makes the fast path's."""
    sp = req.sampling_params
    return bool(uses_penalties(sp) or (sp.min_new_tokens or 0) > 0 or sp.logit_bias
                or getattr(req, "grammar", None) is not None
                or getattr(req, "custom_logit_processor", None))


def uses_penalties(sp) -> bool:
    return bool(sp.frequency_penalty or sp.presence_penalty) or sp.repetition_penalty not in (
        None, 1.0)


def penalty_rows(req, token_ids: list[int], vocab_size: int, device) -> PenaltyRows:
    """The penalizers' rows for `req` once `token_ids` went through `cumulate_output_tokens`."""
    sp = req.sampling_params
    if not uses_penalties(sp):
        return _NO_PENALTIES
    freq, pres = sp.frequency_penalty or 0.0, sp.presence_penalty or 0.0
    rep = 1.0 if sp.repetition_penalty is None else sp.repetition_penalty
    counts = torch.bincount(torch.tensor(token_ids, dtype=torch.int64),
                            minlength=vocab_size)[:vocab_size].to(device)
    seen = counts > 0
    zero = torch.zeros((), dtype=torch.float32, device=device)
    return PenaltyRows(
        frequency=_repeated_sums(freq, int(counts.max()) if token_ids else 0)
        .to(device)[counts] if freq else None,
        presence=torch.where(seen, _f32(pres, device), zero) if pres else None,
        repetition=(torch.where(seen, _f32(rep, device), torch.ones_like(zero))
                    if rep != 1.0 else None),
    )


def _repeated_sums(penalty: float, max_count: int) -> torch.Tensor:
    """[max_count + 1] float32: entry m is `penalty` added m times from 0.0, one float32
    addition at a time, as the frequency penalizer's scatter_add_ accumulates it."""
    step = torch.tensor(penalty, dtype=torch.float32)
    sums = [torch.zeros((), dtype=torch.float32)]
    for _ in range(max_count):
        sums.append(sums[-1] + step)
    return torch.stack(sums)


def _f32(value: float, device) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float32, device=device)


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
