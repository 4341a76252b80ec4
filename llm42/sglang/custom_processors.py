"""Custom logit processors on deterministic requests, replayed per position by the verifier.

SGLang hands a processor each row's `custom_params` plus the live request as `__req__`; the
processors it ships (thinking budgets, no-repeat n-grams) read `origin_input_ids` and
`output_ids`. On the fast path, when output token k is sampled, `output_ids` holds exactly the k
tokens before it: candidates included, and the overlap loop's result in flight is processed
first while such a request runs (`in_flight.needs_fed_outputs`). The verifier calls the
same processor for the entry predicting token k with a view of the request whose `output_ids`
are those k tokens, so a processor that is a function of the tokens before a position gives the
verifier what it gave the fast path. One that reads other live state (wall time, counters it
keeps itself) is not replayable, and is not supported.

    custom_processors.apply(logits, reqs, output_indices)   # after penalties, mask and bias
"""

from __future__ import annotations

import torch


class RequestAt:
    """`req` as the fast path's processor saw it before sampling output token `k`."""

    def __init__(self, req, k: int):
        self._req = req
        self.output_ids = req.output_ids[:k]  # a slice of the same type (SGLang: array)

    def __getattr__(self, name):
        return getattr(self._req, name)


def apply(logits: torch.Tensor, reqs: list, output_indices: list[int]) -> None:
    """logits: [n, vocab] float32, in place; row i predicts output token `output_indices[i]`
    of `reqs[i]`. Each row goes through its processor alone, as the rows of a batch do when the
    processor works row by row (SGLang's own do)."""
    from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor

    for i, (req, k) in enumerate(zip(reqs, output_indices)):
        spec = getattr(req, "custom_logit_processor", None)
        if not spec:
            continue
        processor = CustomLogitProcessor.from_str(spec)
        params = {**(req.sampling_params.custom_params or {}), "__req__": RequestAt(req, k)}
        logits[i : i + 1] = processor(logits[i : i + 1], [params])
