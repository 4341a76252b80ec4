"""Put the fast path's penalizer state back after llm42 rolls back a request's tail.

SGLang's penalizers (`sglang.srt.sampling.penaltylib`) accumulate per request as tokens are
appended (`ScheduleBatch.prepare_for_decode` feeds each decode step's input token, i.e. every
output token but the last) and never look at `output_ids` again. After llm42 drops r candidates
they would still count them: min_new_tokens would lift its stop-token mask r positions early,
and frequency / presence / repetition penalties would punish tokens that are gone. The verifier
computes its values from the real tokens (`verify_logits`), so outputs would stay right, but
the fast path would keep disagreeing with it (rollbacks). Here:

- min_new_tokens: its count goes down by the number of dropped tokens;
- frequency / presence / repetition: the request's rows are rebuilt from the tokens kept, all
  but the last (`verify_logits.penalty_rows`: the same float32 values a fresh accumulation of
  those tokens gives).

    penalty_rewind.rewind(batch, req, num_removed)   # called by kv_rollback.truncate_output
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llm42.sglang import verify_logits

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch

# penalizer class name -> its per-request row tensor, and the PenaltyRows field rebuilt into it
_ROW_TENSORS = {
    "BatchedFrequencyPenalizer": ("cumulated_frequency_penalties", "frequency"),
    "BatchedPresencePenalizer": ("cumulated_presence_penalties", "presence"),
    "BatchedRepetitionPenalizer": ("cumulated_repetition_penalties", "repetition"),
}


def rewind(batch: ScheduleBatch, req: Req, num_removed: int) -> None:
    orchestrator = getattr(getattr(batch, "sampling_info", None), "penalizer_orchestrator", None)
    if num_removed <= 0 or orchestrator is None or not orchestrator.is_required:
        return
    row = next((i for i, r in enumerate(batch.reqs) if r is req), None)
    if row is None:
        return
    rows = None
    for cls, penalizer in orchestrator.penalizers.items():
        if not penalizer.is_prepared():
            continue
        if cls.__name__ == "BatchedMinNewTokensPenalizer":
            counts = penalizer.len_output_tokens.clone()  # [batch, 1] int32
            counts[row] = (counts[row] - num_removed).clamp_(min=0)
            penalizer.len_output_tokens = counts
        elif cls.__name__ in _ROW_TENSORS:
            name, field = _ROW_TENSORS[cls.__name__]
            table = getattr(penalizer, name)  # [batch, vocab] float32
            if rows is None:
                kept = list(req.output_ids[: max(len(req.output_ids) - 1, 0)])
                rows = verify_logits.penalty_rows(req, kept, table.shape[1], table.device)
            value = getattr(rows, field)
            if value is None:  # the request does not use it: its row never changed
                continue
            table = table.clone()  # rebind: a queued forward may still read the old tensor
            table[row] = value
            setattr(penalizer, name, table)
