"""One verification round on the model: its jobs' rows in B x W passes (`verifier`), each job's
decision (`llm42.core.verify_round`) applied to the request: KV and tokens rolled back, the
verifier's logprobs written, the prompt's rows published, the finish released or re-checked."""

from __future__ import annotations

import logging

import torch

from llm42.core.config import ROW_INVARIANT
from llm42.core.stats import sampling_kind
from llm42.core.verify_round import PassPlan, decide_job, job_rows, round_plans, settle
from llm42.sglang import (
    in_flight,
    inline_verify,
    kv_rollback,
    prefix_cache,
    rank_faults,
    row_pass,
    runtime,
    tp_share,
    verifier,
)
from llm42.sglang.request_state import det_state, of

logger = logging.getLogger(__name__)


def run_round(rt, scheduler, batch, reqs: list, overlap: bool = False) -> None:
    """Verify the next job of each of `reqs` (deterministic requests of `batch`, in order).

    `overlap` (`--llm42-overlap-verify`, a result in flight, every job's range fixed): the passes
    are queued on the GPU behind the decode step in flight, that step's result is processed while
    they run, and only then are they sampled and decided. The decisions see the processed result,
    as after a drain: the in-flight step only appended candidates past the compared ranges."""
    cfg = rt.config
    jobs = []
    for req in reqs:
        state = det_state(req)
        if state.is_prompt_pending:
            rt.stats.observe_cached_prompt(state.num_cached_prompt_tokens)
        jobs.append(job_rows(state, req.origin_input_ids, req.output_ids))
    launched, partial = [], {}
    if overlap:
        after_forward_stream(scheduler)
    for plan in round_plans(jobs, cfg):
        launch = (row_pass.launch_row_pass if cfg.verifier == ROW_INVARIANT
                  else verifier.launch_pass)
        launched.append((plan, launch(scheduler, batch, plan.vpass, plan.row_owners(reqs))))
        if not overlap:  # one pass at a time
            sample_and_decide(rt, scheduler, batch, reqs, partial, *launched.pop())
    if overlap:
        in_flight.drain(scheduler)
        rt.stats.observe_overlapped_passes(len(launched))
        if runtime.TIMELINE is not None:
            runtime.TIMELINE.observe_overlap(len(launched))
        for item in launched:
            sample_and_decide(rt, scheduler, batch, reqs, partial, *item)


def after_forward_stream(scheduler) -> None:
    """Order what the schedule stream queues next (passes, the sampling of a folded pass's
    logits) after the forward stream's work (the decode step in flight, the step a pass rode
    in), without waiting for it on the host."""
    forward_stream = getattr(scheduler, "forward_stream", None)
    if forward_stream is not None and torch.cuda.is_available() and str(
            getattr(scheduler, "device", "")).startswith("cuda"):
        torch.cuda.current_stream().wait_stream(forward_stream)


def sample_and_decide(rt, scheduler, batch, reqs: list, partial: dict, plan: PassPlan,
                      launched: verifier.LaunchedPass, folded: bool = False) -> None:
    """Sample a launched pass (waiting for it), count it, and decide the jobs it completes.
    `partial`: the verifier tokens of jobs whose rows began in an earlier pass of the round.
    `folded`: a pass that rode in a decode step (`fold_pass`), its forward already run."""
    vpass = launched.vpass
    results, seconds, graphed = launched.finish(scheduler)
    observe_pass_path(rt, graphed)
    # a row-invariant pass computes its real rows only (its planned dummy rows never run)
    num_pad_rows = 0 if rt.config.verifier == ROW_INVARIANT else vpass.num_pad_rows
    rt.stats.observe_pass(vpass.num_real_rows, num_pad_rows, seconds, vpass.num_prompt_rows,
                          graphed)
    if rt.metrics is not None:
        rt.metrics.observe_pass(vpass.num_real_rows, num_pad_rows, seconds)
    if runtime.TIMELINE is not None:
        runtime.TIMELINE.observe_pass(vpass.num_real_rows, vpass.num_prompt_rows, seconds,
                                      folded)
    for owner, decides, res in zip(plan.owners, plan.decides, results):
        if owner in partial:
            res = partial.pop(owner).join(res)
        if not decides:
            partial[owner] = res
            continue
        req = reqs[owner]
        # None: left the batch before a folded pass was decided (`fold_pass`); finished:
        # aborted while an overlapped pass ran, KV freed
        if req is not None and not req.finished():
            apply_result(rt, scheduler, batch, req, res)


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


def apply_result(rt, sched, batch, req, res: verifier.RowResult) -> None:
    """Decide one job from its verifier tokens and bring the request in line with the decision:
    1. a rollback truncates its tokens and KV and writes the verifier's token;
    2. the verified tokens get the verifier's logprobs;
    3. the state settles; a just-verified prompt publishes its rows (`--llm42-prefix-cache`);
    4. a released finish finishes it, a rollback re-checks the finish on the corrected token;
       a finished request leaves the batch as SGLang's own finishes do."""
    state = det_state(req)
    u, start = state.num_verified_tokens, state.window_start
    decision = decide_job(state, req.output_ids, res.token_ids, rt.injector, rt.vocab_size,
                          rt.config.skip_compare)
    decision = rank_faults.split_decision(decision, rt.vocab_size)  # tests only
    if decision.is_rollback:
        of(req).rolled_back = True  # inline from now on where it can be (`worth_inline`)
        kv_rollback.replace_tail(
            sched, req, decision.mismatch_index, decision.corrected_token_id, batch
        )
    if req.return_logprob:
        _write_verified_logprobs(req, res, u, decision.new_num_verified, start)
    settled = settle(state, decision)
    inline_verify.after_decision(rt, req, state)
    tp_share.observe_decision(rt, req, u, decision)
    if settled.was_prompt and prefix_cache.uses_cache(req):
        prefix_cache.publish_prompt(sched, req)
    sp = req.sampling_params
    rt.stats.observe_decision(decision, sampling_kind(sp.temperature, sp.top_p, sp.top_k, sp.min_p))
    if rt.metrics is not None:
        rt.metrics.observe_decision(decision)
    if settled.finish is not None:
        req.finished_reason, req.finished_len = settled.finish
    elif settled.recheck_finish:
        req.update_finish_state(1)  # the corrected token may be EOS or complete a stop string
    if req.finished():
        i = next(i for i, r in enumerate(batch.reqs) if r is req)
        sched.batch_result_processor._handle_finish_state_updated_req(req, batch, None, i, None)
        rt.stats.observe_finished()


def _write_verified_logprobs(req, res, u: int, new_verified: int, window_start: int) -> None:
    """Client-visible logprobs of deterministic requests are the verifier's, never the fast path's."""
    top = req.logprob.top_logprobs_num > 0
    for i in range(u, new_verified):
        j = i - window_start - 1
        verifier.put_logprobs(req, i, res.logprobs[j], res.top_logprobs_val[j] if top else None,
                              res.top_logprobs_idx[j] if top else None)
