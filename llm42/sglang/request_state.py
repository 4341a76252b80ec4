"""Everything llm42 keeps on one SGLang request: a `Llm42Req` hung on it as `req._llm42`.

    fields = attach(req, DetRequestState(rid=req.rid, window_size=W, num_prompt_tokens=P))
    state = det_state(req)  # None for a normal request

Torch-free and import-free of the other adapter modules, so every hook module can read it
without an import cycle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llm42.core.window import DetRequestState


@dataclass(eq=False)
class Llm42Req:
    """llm42's fields of one SGLang `Req`.

    Invariants: a deterministic request (`det` set) never gets a `noise_seed` (it samples with
    its own seed); `published`, `prefix_cap` and `sglang_extra_key` exist only with `det`. Window
    counters, the deferred finish and the readiness stamp live in `det` (`DetRequestState`),
    never here.
    """

    det: DetRequestState | None = None
    # Deterministic: the verified tokens streamed before the last retraction restart. Until the
    # regenerated output catches up they stand for it, so the stream never sees it shrink.
    published: Sequence[int] | None = None
    # Deterministic, prefix cache: the cap of a re-match in progress (`prefix_cache`), else None.
    prefix_cap: int | None = None
    # Deterministic: SGLang's own radix `extra_key` (LoRA adapter id, cache salt), replaced at
    # creation by a key that matches nothing; verified prompt rows are shared under it.
    sglang_extra_key: str | None = None
    # Normal request: the seed of its sampling noise, drawn when it is first sampled.
    noise_seed: int | None = None
    # Deterministic: prefills in a batch of its own (`hooks_prefill`); whether prompt rows then
    # verify its prompt is `det.verify_prompt`.
    prefill_alone: bool = False
    # Deterministic, --llm42-inline-verify: KV positions [0, exact_kv) hold the verifier's bits
    # (None: unknown). Set by pass decisions and by inline decode steps (`inline_verify`).
    exact_kv: int | None = None
    # Deterministic, --llm42-inline-verify: (output index, token, logprob, top values, top ids)
    # the verifier sampled from the inline step in flight's logits, until its token arrives.
    inline_result: tuple | None = None
    # Deterministic, --llm42-inline-verify: output index -> (logprob, top values, top ids) of
    # tokens verified on arrival, written over the fast path's before they are streamed.
    inline_logprobs: dict | None = None
    # Deterministic, --llm42-inline-verify: a pass rolled back one of its windows. Its fast-path
    # tokens do not survive verification here, so its steps run inline whatever their padding
    # (`inline_verify.worth_inline`): passes would throw a window away per mismatch.
    rolled_back: bool = False


def of(req) -> Llm42Req | None:
    return getattr(req, "_llm42", None)


def attach(req, det: DetRequestState | None = None) -> Llm42Req:
    fields = Llm42Req(det=det)
    req._llm42 = fields
    return fields


def det_state(req) -> DetRequestState | None:
    """The window state of a deterministic request; None for any other."""
    fields = getattr(req, "_llm42", None)
    return None if fields is None else fields.det


def deterministic_rows(reqs: Sequence, flags: Sequence[bool] | None = None) -> list[int]:
    """The indices of the deterministic requests of `reqs`, in order. The scheduler hooks run on
    the host's critical path (an 8B decode step at 256 rows is host-bound), so each step scans
    its batch once here and loops over the few deterministic rows, not over every row in Python.

    `flags`: the batch's per-row flags (`det_rows.of_batch`: kept aligned with its requests for
    the Sampler), several times faster to scan than the requests; without them, or of another
    length, the requests are read."""
    if flags is not None and len(flags) == len(reqs):
        return [i for i, is_det in enumerate(flags) if is_det]
    return [i for i, r in enumerate(reqs)
            if (f := getattr(r, "_llm42", None)) is not None and f.det is not None]


def deterministic(reqs: Sequence, flags: Sequence[bool] | None = None) -> list:
    """The deterministic requests of `reqs`, in order (`deterministic_rows`)."""
    return [reqs[i] for i in deterministic_rows(reqs, flags)]


def batch_kind(batch) -> str | None:
    """A batch as the step timeline names it: decode, prefill, det_prefill (deterministic
    prompts prefilled apart) or None (no batch, or another mode)."""
    if batch is None or not batch.reqs:
        return None
    if batch.forward_mode.is_decode():
        return "decode"
    if batch.forward_mode.is_extend():
        alone = any((f := of(r)) is not None and f.det is not None and f.prefill_alone
                    for r in batch.reqs)
        return "det_prefill" if alone else "prefill"
    return None
