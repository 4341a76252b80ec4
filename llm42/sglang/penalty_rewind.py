"""Rewind the fast path's min_new_tokens counter of a request whose tail was rolled back.

SGLang's `BatchedMinNewTokensPenalizer` counts a request's output tokens (+1 per decode step in
`ScheduleBatch.prepare_for_decode`) and never looks at `output_ids`; after llm42 drops r candidates
it would count r tokens that are gone and lift the stop-token mask r positions early. The verifier
masks by the real position (`verify_logits`), so outputs would stay right, but every window at the
min_new_tokens boundary could roll back once more. Decrementing by the dropped count keeps the
fast path masking where the verifier does.

    penalty_rewind.rewind(batch, req, num_removed)   # called by kv_rollback.truncate_output
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch


def rewind(batch: ScheduleBatch, req: Req, num_removed: int) -> None:
    orchestrator = getattr(getattr(batch, "sampling_info", None), "penalizer_orchestrator", None)
    if num_removed <= 0 or orchestrator is None or not orchestrator.is_required:
        return
    from sglang.srt.sampling.penaltylib import BatchedMinNewTokensPenalizer

    penalizer = orchestrator.penalizers.get(BatchedMinNewTokensPenalizer)
    if penalizer is None or not penalizer.is_prepared():
        return
    row = next((i for i, r in enumerate(batch.reqs) if r is req), None)
    counts = penalizer.len_output_tokens  # [batch, 1] int32
    if row is None or row >= counts.shape[0]:
        return
    counts = counts.clone()  # rebind: a queued forward may still read the old tensor
    counts[row] = (counts[row] - num_removed).clamp_(min=0)
    penalizer.len_output_tokens = counts
