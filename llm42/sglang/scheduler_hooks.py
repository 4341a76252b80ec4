"""The decode-verify-rollback hooks inside SGLang's scheduler process.

Flow for a deterministic request, in SGLang's normal and overlap event loops alike:
  1. prefill runs in any batch (batched prefill, the default) and a prompt pass (window -1, rows
     of W prompt tokens) later recomputes the prompt's KV and verifies o_0 like a candidate; a
     long prompt (`--llm42-solo-prefill-min-tokens`), one asking for prompt logprobs, or any with
     `--no-llm42-batched-prefill` runs in a batch of its own (`prefill_batch_hook`), so o_0
     depends on the request only;
  2. decode steps append candidates on the shared fast path; `output_ids_through_stop` shows
     the detokenizer only the verified prefix, and a finish (EOS, stop, length) is deferred
     until the tokens that caused it are verified (`update_finish_state_hook`);
  3. before the scheduler builds its next batch, windows and prompts that are due are verified in
     fixed-shape passes and the decision of `llm42.core` is applied: commit, or truncate +
     corrected token (`next_batch_hook`);
  4. finished requests are released and streamed only after their last window is verified.

Overlap loop: SGLang launches batch N+1 before it processes the result of batch N, so a rollback
found while processing N would come too late for N+1, already built from the old tokens. Hence
step 3 runs at the top of `get_next_batch_to_run`: when a pass is due, the result still in
flight is processed first (`_drain`), so the pass, the rollback and the next batch all see one
consistent state; iterations with nothing to verify keep the overlap.
"""

from __future__ import annotations

import logging
import random
import time

import torch

from llm42.core.decision import decide
from llm42.core.planner import (
    build_prompt_rows,
    build_row,
    num_job_rows,
    plan_passes,
    select_jobs,
)
from llm42.core.stats import sampling_kind
from llm42.core.window import DetRequestState
from llm42.sglang import (det_rows, kv_rollback, penalty_rewind, prefill_faults, prefix_cache,
                          runtime, verifier)
from llm42.sglang.request_fields import is_deterministic_params

logger = logging.getLogger(__name__)

META_KEYS = {
    "llm42_verify_passes": "num_verify_passes",
    "llm42_rollbacks": "num_rollbacks",
    "llm42_tokens_rolled_back": "num_tokens_rolled_back",
    "llm42_restarts": "num_restarts",
}


def det_state(req) -> DetRequestState | None:
    return getattr(req, "_llm42", None)


# ---------------------------------------------------------------- setup


def scheduler_init_hook(result, scheduler, *args, **kwargs):
    """AFTER Scheduler.__init__: validate against the loaded model and install the runtime."""
    from llm42.sglang.plugin import assert_hooks_applied
    from llm42.sglang.server_args import config_from_server_args

    folder = getattr(scheduler.server_args, "llm42_timeline_dir", None)
    if folder:  # also on a baseline server, to compare its step timeline with llm42's
        runtime.install_timeline(folder)
    config = config_from_server_args(scheduler.server_args)
    if config is None:
        return
    config.validate(scheduler.model_config.context_len)
    assert_hooks_applied()
    page_size = getattr(scheduler, "page_size", 1)
    if page_size != 1:
        raise ValueError(f"llm42 supports --page-size 1 only (got {page_size}).")
    if not scheduler.spec_algorithm.is_none():
        raise ValueError("llm42 cannot be combined with speculative decoding.")
    runtime.install(scheduler, config)


class _CounterView:
    """Per-token view of one per-request counter, for SGLang's customized_info channel."""

    __slots__ = ("state", "name")

    def __init__(self, state: DetRequestState, name: str):
        self.state, self.name = state, name

    def __getitem__(self, index):
        value = getattr(self.state, self.name)
        if isinstance(index, slice):
            return [value] * len(range(*index.indices(1 << 30)))
        return value

    def __len__(self):
        return 1 << 30


def req_init_hook(result, req, *args, **kwargs):
    """AFTER Req.__init__: attach window state to deterministic requests."""
    if runtime.RUNTIME is None or not is_deterministic_params(req.sampling_params):
        return
    state = DetRequestState(
        rid=req.rid,
        window_size=runtime.RUNTIME.config.window_size,
        num_prompt_tokens=len(req.origin_input_ids),
    )
    req._llm42 = state
    req._llm42_finish = None
    req._llm42_published = None  # verified tokens published before a retraction restart
    req._llm42_ready_at = None  # decode step at which its current window became full
    # Never match or publish radix-cache prefixes: cached KV was computed by other batches.
    req.extra_key = f"llm42-det:{req.rid}"
    req.skip_radix_cache_insert = True
    req.customized_info = {key: _CounterView(state, attr) for key, attr in META_KEYS.items()}


# ---------------------------------------------------------------- what leaves the scheduler


def output_ids_through_stop_getter(original_fget, req):
    """Unfinished deterministic requests publish only their verified tokens.

    After a retraction restart (below) the request regenerates tokens it already streamed;
    they come back identical, so until it catches up the published list (the tokens streamed
    before the restart) stands for them and SGLang's monotonic stream offsets never see the
    output shrink."""
    ids = original_fget(req)
    state = det_state(req)
    if state is None:
        return ids
    if not req.finished():
        ids = ids[: state.num_verified_tokens]
    published = req._llm42_published
    return published if published is not None and len(published) > len(ids) else ids


def stream_accept_hook(original, accumulator, *, req):
    """AROUND the output streamer's per-request accept: an unfinished deterministic request
    streams nothing while none of its tokens is verified.

    SGLang sends logprobs up to `max(len(output), 1)`: with no verified token it would send o_0's
    fast-path logprob and move its offset past it. That happens when the prompt pass is still
    pending (`--llm42-batched-prefill`), and when the overlap loop streams the batch a request
    was just retracted from (its output restarts from the prompt). A request aborted before
    anything was verified finishes with no output and no logprobs."""
    state = det_state(req)
    if state is not None and state.num_verified_tokens == 0:
        if not req.finished():
            return None
        # Aborted with nothing verified: SGLang appended the last fast-path token's logprob
        # after the abort cut the output; it would go out with an empty output.
        kv_rollback.truncate_logprobs(req, len(req.output_ids))
    return original(accumulator, req=req)


def update_finish_state_hook(original, req, new_accepted_len: int = 1):
    """AROUND Req.update_finish_state: keep SGLang's checks, defer finishes of candidates."""
    state = det_state(req)
    if state is None or req.finished():
        return original(req, new_accepted_len)
    sched = runtime.RUNTIME.scheduler
    if req.to_finish is not None:  # abort / timeout: candidates are dropped, never returned
        if state.num_output_tokens == 0 and req.output_ids:
            state.on_first_token()  # aborted while its prefill ran (overlap loop): o_0 stands
        state.rollback_unverified()
        kv_rollback.truncate_output(sched, req, state.num_output_tokens, None)
        return original(req, new_accepted_len)
    if req._llm42_finish is not None:
        # Overlap loop: the batch launched before the finish was seen decoded one token past it.
        kv_rollback.truncate_output(sched, req, state.num_output_tokens, sched.running_batch)
        return
    _sync_new_tokens(state, req)
    original(req, new_accepted_len)
    if req.finished() and state.num_candidate_tokens > 0:
        req._llm42_finish = (req.finished_reason, req.finished_len)
        req.finished_reason, req.finished_len = None, None
        state.mark_finishing()


def _sync_new_tokens(state: DetRequestState, req) -> None:
    num_new = len(req.output_ids) - state.num_output_tokens
    if num_new <= 0:
        return
    if state.num_output_tokens == 0:
        state.on_first_token()  # verified: solo prefill; a candidate: prompt pass pending
        num_new -= 1
        if state.verify_prompt and prefill_faults.enabled():
            prefill_faults.perturb(runtime.RUNTIME.scheduler, req, state.num_cached_prompt_tokens)
    if num_new:
        state.append_candidates(num_new)


def reset_for_retract_hook(result, req, *args, **kwargs):
    """AFTER Req.reset_for_retract: a retracted deterministic request restarts from its prompt.

    SGLang keeps the outputs and re-prefills prompt + outputs, which would give the verified
    tokens KV computed by a prefill instead of by their windows (`DetRequestState.restart`).
    Its KV is already released (`release_kv_cache`), so only the lists are cut."""
    state = det_state(req)
    if state is None:
        return
    # Only what the stream already carries: its offsets must not move past tokens whose
    # logprobs are not regenerated yet (the overlap loop may stream a just-retracted request).
    sent = req.output_ids[: min(req.send_token_offset, state.num_verified_tokens)]  # array copy
    if req._llm42_published is None or len(sent) > len(req._llm42_published):
        req._llm42_published = sent
    state.restart()
    kv_rollback.truncate_output(runtime.RUNTIME.scheduler, req, 0, None)
    req._llm42_finish = None
    req._llm42_ready_at = None
    runtime.RUNTIME.stats.observe_restart()


# ---------------------------------------------------------------- prefill isolation


def prefill_batch_hook(original, scheduler, *args, **kwargs):
    """AROUND Scheduler._get_new_batch_prefill_raw: a deterministic prefill runs alone, unless
    its prompt is verified afterwards (batched prefill, the default): then it joins any batch."""
    rt = runtime.RUNTIME
    queue = scheduler.waiting_queue
    chunked = scheduler.chunked_req
    running = kwargs.get("running_batch", args[1] if len(args) > 1 else None)
    if rt is None or _admits_nothing(scheduler, running):
        return original(scheduler, *args, **kwargs)
    alone = [_prefills_alone(rt, r) for r in queue]
    chunked_alone = _prefills_alone(rt, chunked)
    if not (any(alone) or chunked_alone):
        return original(scheduler, *args, **kwargs)
    det = [r for r, a in zip(queue, alone) if a]
    normal = [r for r, a in zip(queue, alone) if not a]
    if chunked is not None:
        visible = [] if chunked_alone else normal
    elif det and (rt.prefer_det_prefill or not normal):
        visible = det[:1]
    else:
        visible = normal
    rt.prefer_det_prefill = not rt.prefer_det_prefill
    visible_ids = {id(r) for r in visible}
    scheduler.waiting_queue = visible
    try:
        return original(scheduler, *args, **kwargs)
    finally:
        left = scheduler.waiting_queue
        keep = {id(r) for r in left} | {id(r) for r in queue if id(r) not in visible_ids}
        queued = {id(r) for r in queue}
        merged = [r for r in queue if id(r) in keep]
        merged += [r for r in left if id(r) not in queued]  # e.g. retracted by the original
        scheduler.waiting_queue = merged


def _admits_nothing(scheduler, running_batch) -> bool:
    """The first early return of SGLang 0.5.17's `_get_new_batch_prefill_raw` (its fingerprint
    is in patches/): a full running batch and no chunked prompt admit no request, so the split
    of the waiting queue, O(queue) per scheduler step (~1.5 ms with 1,800 queued), is skipped.
    Ready grammar requests and preemption modes, which the original handles before that return,
    take the full path."""
    return (running_batch is not None and running_batch.batch_is_full
            and scheduler.chunked_req is None
            and not scheduler.grammar_manager.has_waiting_grammars()
            and not (scheduler.enable_priority_preemption or scheduler.is_hybrid_swa))


def stash_chunked_hook(original, scheduler, req):
    """AROUND Scheduler.stash_chunked_request: after a prefill chunk, a deterministic request's
    next chunk starts where this one ended.

    SGLang advances `prefix_indices` while caching the chunk in the prefix tree, which
    `skip_radix_cache_insert` turns off for deterministic requests (their KV is rewritten by
    verification and rolled back); without this their first chunk would run again and again.
    The KV stays the request's own: nothing enters the tree, as with SGLang's ChunkCache."""
    if det_state(req) is None:
        return original(scheduler, req)
    row = scheduler.req_to_token_pool.req_to_token[req.req_pool_idx, : req.extend_range.end]
    req.prefix_indices = row.to(dtype=torch.int64, copy=True)


def _prefills_alone(rt, req) -> bool:
    """Deterministic and prefilled in a batch of its own; fixes `verify_prompt` on first sight.

    Long prompts (`Llm42Config.solo_prefill_threshold`) prefill alone: a solo prefill computes
    them once, where prompt passes would compute them a second time, in small passes. So does a
    request asking for prompt logprobs: the prompt pass gives o_0 and the prompt's KV, not the
    prompt's logprobs."""
    state = det_state(req) if req is not None else None
    if state is None:
        return False
    if state.num_output_tokens == 0 and state.num_restarts == 0:
        wants_prompt_logprobs = req.return_logprob and 0 <= req.logprob_start_len < len(
            req.origin_input_ids)
        state.verify_prompt = not rt.config.prefills_alone(
            len(req.origin_input_ids), wants_prompt_logprobs)
        if state.verify_prompt and rt.config.prefix_cache:
            req.extra_key = prefix_cache.namespace(rt.config)  # its prompt KV will be verified
    return not state.verify_prompt


# ---------------------------------------------------------------- sampling


def sampling_info_hook(result, cls, batch, vocab_size, *args, **kwargs):
    """AFTER SamplingBatchInfo.from_schedule_batch: seeded noise for every row.

    Deterministic rows use their seed, so decode and verifier draw the same noise at the same
    position; other rows get a random per-request seed (their output stays random). Always
    setting the tensor keeps SGLang's merge/filter of batches aligned."""
    if runtime.RUNTIME is None:
        return result
    det_rows.mark(result, [det_state(req) is not None for req in batch.reqs])
    if result.sampling_seed is not None:
        return result
    seeds = []
    for req in batch.reqs:
        if det_state(req) is not None or req.sampling_params.sampling_seed is not None:
            seeds.append(verifier.seed_of(req.sampling_params))
        else:
            if getattr(req, "_llm42_noise_seed", None) is None:
                req._llm42_noise_seed = random.getrandbits(62)
            seeds.append(req._llm42_noise_seed)
    result.sampling_seed = verifier.to_device(seeds, torch.int64, batch.device)
    return result


def logits_metadata_hook(result, *args, **kwargs):
    """AFTER LogitsMetadata.from_forward_batch: the verify pass needs logits for every row."""
    if runtime.IN_VERIFY_PASS:
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        result.forward_mode = ForwardMode.TARGET_VERIFY
    return result


# ---------------------------------------------------------------- verify, commit, roll back


def decode_result_hook(original, processor, batch, result):
    """AROUND process_batch_result_decode: count decode steps (how long full windows wait)."""
    original(processor, batch, result)
    if runtime.RUNTIME is not None:
        runtime.RUNTIME.decode_step += 1


class _Drained:
    """Stands in the overlap loop's result queue for a result llm42 already processed."""

    def __repr__(self):
        return "<llm42: result processed early>"


DRAINED = _Drained()


def process_result_hook(original, scheduler, batch, result):
    """AROUND Scheduler.process_batch_result: skip results `_drain` already processed."""
    if result is DRAINED:
        return None
    return original(scheduler, batch, result)


def next_batch_hook(original, scheduler, running_batch, last_batch):
    """AROUND Scheduler.get_next_batch_to_run: verify due windows before the next batch is built.

    A full window or a fast-path prompt waits (decoding on) until B rows fill a pass, it has
    waited `verify_wait_steps` decode steps, or a finish depends on it (`planner.select_jobs`;
    `--llm42-max-passes-per-step` spreads bursts over several steps)."""
    rt, timeline = runtime.RUNTIME, runtime.TIMELINE
    if rt is None and timeline is None:
        return original(scheduler, running_batch, last_batch)
    now = time.perf_counter()
    if timeline is not None:
        timeline.begin(now)
    if rt is not None:
        if rt.step_kind is not None:
            rt.stats.observe_step(rt.step_kind, now - rt.step_started)
        mates = (running_batch.reqs if running_batch is not None else []) + (
            last_batch.reqs if last_batch is not None else [])
        if _in_flight(scheduler) and penalty_rewind.needs_fed_outputs(mates):
            _drain(scheduler)  # penalizers must see every token before the next step
        if running_batch is not None and running_batch.reqs:
            _verify_due(rt, scheduler, running_batch)
    build_started = time.perf_counter()
    plan = original(scheduler, running_batch, last_batch)
    batch = plan.batch_to_run
    kind = _step_kind(batch)
    if rt is not None:
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


def _step_kind(batch) -> str | None:
    if batch is None or not batch.reqs:
        return None
    if batch.forward_mode.is_decode():
        return "decode"
    if batch.forward_mode.is_extend():
        alone = any((st := det_state(r)) is not None and not st.verify_prompt for r in batch.reqs)
        return "det_prefill" if alone else "prefill"
    return None


def _verify_due(rt, scheduler, batch) -> None:
    cfg = rt.config
    hold = cfg.defer_verify_on_prefill and _prefill_coming(scheduler, batch)
    touched, drained = [], False
    while not (touched and cfg.max_passes_per_step):  # under a pass cap: one round per step
        ready = [(r, st) for r in batch.reqs
                 if (st := det_state(r)) is not None and not r.finished() and st.is_ready]
        for req, _ in ready:
            if req._llm42_ready_at is None:
                req._llm42_ready_at = rt.decode_step
        chosen = select_jobs([num_job_rows(st) for _, st in ready],
                             [rt.decode_step - req._llm42_ready_at for req, _ in ready],
                             [st.is_finishing for _, st in ready],
                             cfg.verify_batch_size, cfg.verify_wait_steps,
                             cfg.max_passes_per_step, hold)
        if not chosen:
            break
        overlap = False
        if not drained and _in_flight(scheduler):
            drained = True
            overlap = cfg.overlap_verify and all(_range_is_fixed(ready[i][1]) for i in chosen)
            if not overlap:
                _drain(scheduler)
                continue  # the in-flight result changed the candidates: choose again
        jobs = []
        for req, st in (ready[i] for i in chosen):
            if st.is_prompt_pending:
                rt.stats.observe_cached_prompt(st.num_cached_prompt_tokens)
                jobs.append((req, build_prompt_rows(st, req.origin_input_ids)))
            else:
                jobs.append((req, [build_row(st, req.output_ids)]))
        _verify(rt, scheduler, batch, jobs, overlap)
        for req, _ in jobs:
            req._llm42_ready_at = None
            if not any(req is t for t in touched):
                touched.append(req)
    if touched:
        scheduler.batch_result_processor.output_streamer.stream_output(
            touched, batch.return_logprob
        )


def _prefill_coming(scheduler, batch) -> bool:
    """Whether this step will likely launch a prefill: SGLang prefers one whenever a request
    waits and there is room for it (a chunked prompt always continues)."""
    if scheduler.chunked_req is not None:
        return True
    return bool(scheduler.waiting_queue) and len(batch.reqs) < scheduler.max_running_requests


def _in_flight(scheduler) -> bool:
    """Overlap loop: a launched batch whose result has not been processed yet."""
    queue = getattr(scheduler, "result_queue", None) if scheduler.enable_overlap else None
    return bool(queue) and queue[0][1] is not DRAINED


def _range_is_fixed(state) -> bool:
    """The job compares the same candidates whatever the in-flight step appends: a full window
    (its end is fixed) or a prompt (o_0 only). A finishing request's partial window would grow."""
    return state.is_prompt_pending or state.num_output_tokens >= state.window_end


def _drain(scheduler) -> None:
    """Overlap loop: process the in-flight result now (`_in_flight` must hold).

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


def _verify(rt, scheduler, batch, jobs, overlap: bool = False) -> None:
    """Run the rows of `jobs` ((request, its rows) pairs, in order) in B x W passes; a request
    is decided by its last row (one row for a window, ceil(P / W) rows for a prompt).

    `overlap` (`--llm42-overlap-verify`, a result in flight, every job's range fixed): the passes
    are queued on the GPU behind the decode step in flight, that step's result is processed while
    they run, and only then are they sampled and decided. The decisions see the processed result,
    as after a drain: the in-flight step only appended candidates past the compared ranges."""
    cfg = rt.config
    owners = [(req, i == len(rows) - 1) for req, rows in jobs for i in range(len(rows))]
    rows = [row for _, rows in jobs for row in rows]
    launched, start = [], 0
    if overlap:
        _after_step_in_flight(scheduler)
    for vpass in plan_passes(rows, cfg.verify_batch_size, cfg.window_size):
        mine = owners[start : start + vpass.num_real_rows]
        start += vpass.num_real_rows
        row_reqs = [req for req, _ in mine] + [None] * vpass.num_pad_rows
        launched.append((mine, verifier.launch_pass(scheduler, batch, vpass, row_reqs)))
        if not overlap:  # one pass at a time, as before
            _finish(rt, scheduler, batch, *launched.pop())
    if overlap:
        _drain(scheduler)
        rt.stats.observe_overlapped_passes(len(launched))
        if runtime.TIMELINE is not None:
            runtime.TIMELINE.observe_overlap(len(launched))
        for item in launched:
            _finish(rt, scheduler, batch, *item)


def _after_step_in_flight(scheduler) -> None:
    """Order the passes after the decode step in flight on the GPU, without waiting for it on
    the host: it runs on SGLang's forward stream, the passes on the schedule stream."""
    forward_stream = getattr(scheduler, "forward_stream", None)
    if forward_stream is not None and torch.cuda.is_available() and str(
            getattr(scheduler, "device", "")).startswith("cuda"):
        torch.cuda.current_stream().wait_stream(forward_stream)


def _finish(rt, scheduler, batch, mine, launched: verifier.LaunchedPass) -> None:
    vpass = launched.vpass
    results, seconds, graphed = launched.finish(scheduler)
    observe_pass_path(rt, graphed)
    rt.stats.observe_pass(vpass.num_real_rows, vpass.num_pad_rows, seconds,
                          vpass.num_prompt_rows, graphed)
    if rt.metrics is not None:
        rt.metrics.observe_pass(vpass.num_real_rows, vpass.num_pad_rows, seconds)
    if runtime.TIMELINE is not None:
        runtime.TIMELINE.observe_pass(vpass.num_real_rows, vpass.num_prompt_rows, seconds)
    for (req, decides), res in zip(mine, results):
        if decides and not req.finished():  # aborted while an overlapped pass ran: KV freed
            _apply(rt, scheduler, batch, req, res)


def observe_pass_path(rt, graphed: bool) -> None:
    """Warn once when a server runs passes both through SGLang's prefill CUDA graphs and eagerly.

    A verified token is only reproducible if every pass computes it the same way; a replayed graph
    and the eager forward may not (e.g. a compiled piecewise graph fuses differently). Every pass
    has the same B x W shape, so this should never happen; if it does, the outputs of this
    server may depend on which path their passes took."""
    if graphed in rt.pass_paths:
        return
    rt.pass_paths.add(graphed)
    if len(rt.pass_paths) == 2:
        logger.warning(
            "llm42: verification passes ran both through CUDA graphs and eagerly on this server; "
            "deterministic outputs may differ between the two paths (see graphed_passes in "
            "/llm42_stats). Run with or without --cuda-graph-backend-prefill for every pass.")


def _apply(rt, sched, batch, req, res: verifier.RowResult) -> None:
    state = det_state(req)
    u, start = state.num_verified_tokens, state.window_start
    candidates = list(req.output_ids)
    injected = None
    if not rt.config.skip_compare:
        end = state.compare_end
        corrupted, idx = rt.injector.corrupt(candidates[u:end], rt.vocab_size)
        if idx is not None:
            injected = u + idx
            candidates[injected] = corrupted[idx]
    decision = decide(
        state, candidates, res.token_ids, skip_compare=rt.config.skip_compare,
        injected_index=injected,
    )
    if decision.is_rollback:
        kv_rollback.replace_tail(
            sched, req, decision.mismatch_index, decision.corrected_token_id, batch
        )
    if req.return_logprob:
        _write_verified_logprobs(req, res, u, decision.new_num_verified, start)
    was_prompt = state.is_prompt_pending
    state.apply(decision)
    if was_prompt and prefix_cache.uses_cache(req):
        prefix_cache.publish_prompt(sched, req)
    rt.stats.observe_decision(decision, _kind(req.sampling_params))
    if rt.metrics is not None:
        rt.metrics.observe_decision(decision)

    saved, req._llm42_finish = req._llm42_finish, None
    if saved is not None and not decision.is_rollback:
        if state.num_candidate_tokens == 0:
            req.finished_reason, req.finished_len = saved
        else:  # candidates past this window: verify them before finishing
            req._llm42_finish = saved
    elif decision.is_rollback:
        req.update_finish_state(1)  # the corrected token may be EOS or complete a stop string
    if req.finished():
        i = next(i for i, r in enumerate(batch.reqs) if r is req)
        sched.batch_result_processor._handle_finish_state_updated_req(req, batch, None, i, None)
        rt.stats.observe_finished()


def _kind(sp) -> str:
    return sampling_kind(sp.temperature, sp.top_p, sp.top_k, sp.min_p)


def _write_verified_logprobs(req, res, u: int, new_verified: int, window_start: int) -> None:
    """Client-visible logprobs of deterministic requests are the verifier's, never the fast path's."""
    lp = req.logprob
    for i in range(u, new_verified):
        j = i - window_start - 1
        _put(lp.output_token_logprobs_val, i, res.logprobs[j])
        _put(lp.output_token_logprobs_idx, i, req.output_ids[i])
        if lp.top_logprobs_num > 0:
            _put(lp.output_top_logprobs_val, i, res.top_logprobs_val[j])
            _put(lp.output_top_logprobs_idx, i, res.top_logprobs_idx[j])


def _put(values: list, i: int, value) -> None:
    if i < len(values):
        values[i] = value
    elif i == len(values):
        values.append(value)
    else:
        raise IndexError(f"logprob list has {len(values)} entries, writing index {i}")


# ---------------------------------------------------------------- stats over IPC


def get_internal_state_hook(result, scheduler, *args, **kwargs):
    rt = runtime.RUNTIME
    result.internal_state["llm42"] = rt.snapshot() if rt is not None else {
        "enabled": False, "timeline": runtime.timeline_path()}
    return result


RESET_KEY = "llm42_reset_stats"
MODE_KEY = "llm42_benchmark_mode"


def set_internal_state_hook(original, scheduler, recv_req):
    """AROUND Scheduler.set_internal_state: llm42's own keys (from its endpoints, or from
    SGLang's /set_internal_state, hence the gate is checked here too); others go to SGLang."""
    args = recv_req.server_args or {}
    if RESET_KEY not in args and MODE_KEY not in args:
        return original(scheduler, recv_req)
    from sglang.srt.managers.io_struct import SetInternalStateReqOutput

    rt, timeline = runtime.RUNTIME, runtime.TIMELINE
    if MODE_KEY in args:
        return SetInternalStateReqOutput(updated=rt is not None and rt.switch_benchmark_mode(
            args[MODE_KEY], num_det_in_flight(scheduler)))
    if rt is not None:
        rt.stats.reset()
    if timeline is not None:
        timeline.event("reset")
    return SetInternalStateReqOutput(updated=rt is not None or timeline is not None)


def num_det_in_flight(scheduler) -> int:
    """Unfinished deterministic requests anywhere in this scheduler: waiting (retracted ones
    included), in a grammar's queue, prefilling in chunks, running, or in a batch whose result
    is still in flight (overlap loop). A request the scheduler has not received yet is not in
    flight: it is created after the switch, with the new window."""
    reqs = list(scheduler.waiting_queue)
    grammars = getattr(scheduler, "grammar_manager", None)
    reqs += list(getattr(grammars, "grammar_queue", None) or [])
    reqs.append(scheduler.chunked_req)
    batches = [scheduler.running_batch, getattr(scheduler, "last_batch", None)]
    batches += [batch for batch, _ in getattr(scheduler, "result_queue", None) or []]
    for batch in batches:
        reqs += list(getattr(batch, "reqs", None) or [])
    live = {id(r) for r in reqs if r is not None and det_state(r) is not None and not r.finished()}
    return len(live)
