"""The verify loop: before the scheduler builds its next batch, the windows and prompts that are
due are verified (`verify_passes`), so the batch is built from the corrected tokens.

Overlap loop: SGLang launches batch N+1 before it processes the result of batch N, so a rollback
found while processing N would come too late for N+1, already built from the old tokens. Hence
verification runs at the top of `get_next_batch_to_run`: when a pass is due, the result still in
flight is processed first (`in_flight.drain`), so the pass, the rollback and the next batch all
see one consistent state; iterations with nothing to verify keep the overlap. With folded
passes (`fold_pass`) a due round rides in the batch built here instead, and is decided at the
next iteration's top (`decide_folded`), after that batch's result is processed.
"""

from __future__ import annotations

import time

from llm42.core.verify_round import cap_jobs, due_jobs, range_is_fixed
from llm42.sglang import det_rows, fold_pass, in_flight, inline_verify, runtime, verify_passes
from llm42.sglang.request_state import batch_kind, det_state, deterministic


def decode_result_hook(original, processor, batch, result):
    """AROUND process_batch_result_decode: the verifier's tokens of an inline step's rows
    (`inline_verify`) before SGLang appends the step's tokens; count decode steps (how long full
    windows wait)."""
    rt = runtime.RUNTIME
    _sample_inline(rt, result)
    original(processor, batch, result)
    if rt is not None:
        rt.decode_step += 1


def prefill_result_hook(original, processor, batch, result):
    """AROUND process_batch_result_prefill: the verifier's o_0 of each prompt whose rows ran
    inline with this prefill (`inline_prefill`), before SGLang appends o_0."""
    _sample_inline(runtime.RUNTIME, result)
    return original(processor, batch, result)


def _sample_inline(rt, result) -> None:
    step = getattr(getattr(result, "logits_output", None), "llm42_inline", None)
    if rt is not None and step is not None:
        ready = result.copy_done is not None
        if ready:
            result.copy_done.synchronize()  # the step's logits are on the forward stream
        inline_verify.sample_step(rt, step, logits_ready=ready)


def next_batch_hook(original, scheduler, running_batch, last_batch):
    """AROUND Scheduler.get_next_batch_to_run: verify due windows before the next batch is built.

    A full window or a fast-path prompt waits (decoding on) until B rows fill a pass, it has
    waited `verify_wait_steps` decode steps, or a finish depends on it (`planner.select_jobs`;
    `--llm42-max-passes-per-step` and `--llm42-max-pass-rows-per-step` spread bursts over
    several steps)."""
    rt, timeline = runtime.RUNTIME, runtime.TIMELINE
    if rt is None and timeline is None:
        return original(scheduler, running_batch, last_batch)
    now = time.perf_counter()
    if timeline is not None:
        timeline.begin(now)
    if rt is not None:
        if rt.step_kind is not None:
            rt.stats.observe_step(rt.step_kind, now - rt.step_started)
        batches = [b for b in (running_batch, last_batch) if b is not None]
        if len(batches) == 2 and batches[0] is batches[1]:
            batches.pop()
        if in_flight.in_flight(scheduler) and any(
                in_flight.needs_fed_outputs(b.reqs, det_rows.of_batch(b)) for b in batches):
            in_flight.drain(scheduler)  # penalizers must see every token before the next step
        if running_batch is not None and running_batch.reqs:
            verify_due(rt, scheduler, running_batch)
    build_started = time.perf_counter()
    plan = original(scheduler, running_batch, last_batch)
    batch = plan.batch_to_run
    kind = batch_kind(batch)
    if rt is not None:
        inline_verify.plan_step(rt, batch)
        rt.step_started, rt.step_kind = time.perf_counter(), kind
        rt.stats.observe_schedule(rt.step_started - now, rt.step_started - build_started)
    if timeline is not None:
        _record_launch(timeline, kind, scheduler, batch)
    return plan


def _record_launch(timeline, kind, scheduler, batch) -> None:
    reqs = len(batch.reqs) if kind is not None else 0
    tokens = reqs
    if kind in ("prefill", "det_prefill"):
        tokens = int(getattr(batch, "extend_num_tokens", None) or 0)
    running = getattr(scheduler, "running_batch", None)
    timeline.launched(kind, reqs=reqs, tokens=tokens,
                      running=len(running.reqs) if running is not None else 0,
                      queued=len(scheduler.waiting_queue))


def verify_due(rt, scheduler, batch) -> None:
    """Verification rounds over the running batch's ready jobs until none is due (one round per
    step under `--llm42-max-passes-per-step` or `--llm42-max-pass-rows-per-step`, whose row
    budget `cap_jobs` applies); then stream what they verified.

    A round needs the in-flight result processed first: it may append candidates to, or finish,
    the chosen jobs. With `--llm42-overlap-verify` a round whose every job's compared range is
    fixed (`range_is_fixed`) runs while that result is processed instead."""
    cfg = rt.config
    touched = decide_folded(rt, scheduler, batch)
    coming = _prefill_coming(scheduler, batch)
    # folded passes: a round due while a prefill comes waits for the decode step after it to
    # ride in, instead of a pass lengthening the prefill's gap (overdue ones run as passes)
    hold = (cfg.defer_verify_on_prefill or fold_pass.active(rt)) and coming
    drained = False
    capped = cfg.max_passes_per_step or cfg.max_pass_rows_per_step is not None
    while not (touched and capped):  # under a pass or row cap: one round per step
        num_running, det_reqs = len(batch.reqs), deterministic(batch.reqs,
                                                               det_rows.of_batch(batch))
        if not det_reqs:
            break
        num_det, rolled_back = (inline_verify.chained_rows(det_reqs)
                                if inline_verify.active(rt) else (0, False))
        ready, urgent = [], []
        for r in det_reqs:
            st = det_state(r)
            if r.finished():
                continue
            catch_up = inline_verify.catching_up(rt, r, st, num_running, num_det, rolled_back)
            if st.is_ready or catch_up:
                ready.append(r)
                urgent.append(catch_up)
        states = [det_state(r) for r in ready]
        chosen, deferred = cap_jobs(states, due_jobs(states, rt.decode_step, cfg, hold, urgent),
                                    rt.decode_step, cfg)
        if not chosen:
            break
        jobs = [ready[i] for i in chosen]
        overlap = False
        if not drained and in_flight.in_flight(scheduler):
            drained = True
            overlap = cfg.overlap_verify and all(range_is_fixed(det_state(r)) for r in jobs)
            if not overlap:
                in_flight.drain(scheduler)
                continue  # the in-flight result changed the candidates: choose again
        if cfg.max_pass_rows_per_step is not None:
            rt.stats.observe_row_cap(len(deferred))
        if fold_pass.offer(rt, batch, jobs, coming):
            break  # rides in the step about to be built, decided before the next one
        verify_passes.run_round(rt, scheduler, batch, jobs, overlap)
        touched += [r for r in jobs if not any(r is t for t in touched)]
    if touched:
        scheduler.batch_result_processor.output_streamer.stream_output(
            touched, batch.return_logprob
        )


def decide_folded(rt, scheduler, batch) -> list:
    """The decisions of the round that rode in the last decode step (`fold_pass`), once that
    step's result is processed: as a pass decides after a drain, so that a rollback and the
    next batch see one state. Returns the requests decided, to stream."""
    riders = rt.folded
    if riders is None:
        return []
    rt.folded = None
    if in_flight.in_flight(scheduler):
        in_flight.drain(scheduler)
    present = {id(r) for r in batch.reqs}
    reqs = [r if id(r) in present else None for r in riders.reqs]  # gone: nothing to decide
    if all(r is None for r in reqs):
        return []
    verify_passes.after_forward_stream(scheduler)  # its logits came from the forward stream
    partial: dict = {}
    for plan, launched in zip(riders.plans, riders.launched):
        verify_passes.sample_and_decide(rt, scheduler, batch, reqs, partial, plan, launched,
                                        folded=True)
    return [r for r in reqs if r is not None]


def _prefill_coming(scheduler, batch) -> bool:
    """Whether this step will likely launch a prefill: SGLang prefers one whenever a request
    waits and there is room for it (a chunked prompt always continues)."""
    if scheduler.chunked_req is not None:
        return True
    return bool(scheduler.waiting_queue) and len(batch.reqs) < scheduler.max_running_requests
