"""The overlap loop's result in flight: SGLang launches batch N+1 before it processes the result
of batch N. llm42 processes that result early (`drain`) when a verification pass must see it,
and leaves `DRAINED` in its queue entry so that the loop does not process it twice."""

from __future__ import annotations

import time

from llm42.sglang import hook_times, runtime
from llm42.sglang.request_state import batch_kind


class _Drained:
    """Stands in the overlap loop's result queue for a result llm42 already processed."""

    def __repr__(self):
        return "<llm42: result processed early>"


DRAINED = _Drained()


def process_result_hook(original, scheduler, batch, result):
    """AROUND Scheduler.process_batch_result: skip results `drain` already processed. With a
    step timeline, time the wait for the result's GPU work apart from its processing (SGLang's
    processors wait on the same `copy_done` event first thing, so waiting here changes nothing)."""
    if result is DRAINED:
        return None
    timeline = runtime.TIMELINE
    if timeline is None:
        return original(scheduler, batch, result)
    t0 = time.perf_counter()
    done = getattr(result, "copy_done", None)
    if done is not None:
        done.synchronize()
    t1 = time.perf_counter()
    hook_times.not_own(t1 - t0)  # SGLang's processors wait on it first thing
    try:
        return original(scheduler, batch, result)
    finally:
        timeline.observe_result(batch_kind(batch) or "other", t1 - t0,
                                time.perf_counter() - t1)


def in_flight(scheduler) -> bool:
    """Overlap loop: a launched batch whose result has not been processed yet."""
    queue = getattr(scheduler, "result_queue", None) if scheduler.enable_overlap else None
    return bool(queue) and queue[0][1] is not DRAINED


def drain(scheduler) -> None:
    """Overlap loop: process the in-flight result now (`in_flight` must hold).

    The loop pops one queue entry per launched batch, so the entry stays as `DRAINED`."""
    t0 = time.perf_counter()
    queue = scheduler.result_queue
    pending_batch, pending_result = queue.popleft()
    scheduler.process_batch_result(pending_batch, pending_result)
    queue.appendleft((pending_batch, DRAINED))
    rt = runtime.RUNTIME
    rt.stats.observe_early_result(time.perf_counter() - t0)
    if runtime.TIMELINE is not None:
        runtime.TIMELINE.observe_drain()


def needs_fed_outputs(reqs, flags=None) -> bool:
    """Overlap loop: must the in-flight result be processed before the next batch is built?

    `prepare_for_decode` feeds the penalizers each request's last *processed* output token. With
    a result still in flight that is one token behind (the last prompt token on the first decode
    step) and, as llm42 processes results early only on verification steps, now and then one
    token skipped and the next fed twice: a timing-dependent state the verifier cannot replay.
    So while a deterministic request with frequency / presence / repetition penalties is in the
    batch (or its prefill is in flight), every step processes its result first, and the fast
    path feeds o_{k-1} before sampling o_k, as the verifier assumes. (min_new_tokens only counts
    steps, which is right either way.) A custom logit processor reads the request's output_ids,
    which lag the same way: the same rule holds for it."""
    from llm42.sglang import verify_logits
    from llm42.sglang.request_state import deterministic

    return any(verify_logits.uses_penalties(r.sampling_params)
               or getattr(r, "custom_logit_processor", None) for r in deterministic(reqs, flags))
