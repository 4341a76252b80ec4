"""Hooks on a request's life in the scheduler: server start, a deterministic request's creation,
its finishes (deferred until verified, or an abort dropping its candidates) and its retraction
(a restart from the prompt)."""

from __future__ import annotations

import functools
import logging
from dataclasses import replace

from llm42.core.config import FIXED_SHAPE, ROW_INVARIANT
from llm42.core.verify_round import withhold_finish
from llm42.core.window import DetRequestState
from llm42.sglang import (
    backend_gate,
    inline_verify,
    kv_rollback,
    prefill_faults,
    row_pass,
    runtime,
    speculation,
    verifier_choice,
)
from llm42.sglang.request_fields import is_deterministic_params
from llm42.sglang.request_state import attach, det_state, of

logger = logging.getLogger(__name__)


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
    refusal = speculation.check_server_args(scheduler.server_args)
    if refusal:
        raise ValueError(refusal)
    if speculation.is_speculative(scheduler.server_args) and scheduler.enable_overlap:
        raise ValueError("llm42 with speculative decoding needs --disable-overlap-schedule "
                         "(the launcher sets it)")
    # Checked at launch already (server_args.from_cli_args_hook); again here for any path that
    # builds the server args otherwise, and for the backend the stats report.
    verdict = backend_gate.check_server_args(
        scheduler.server_args, allow_unproven=config.allow_unproven_backend)
    if not verdict.allowed:
        raise ValueError(f"llm42: {verdict.message}")
    verifier, rows, row_unproven, line = choose_verifier(config, scheduler)
    if verifier != config.verifier:
        config = replace(config, verifier=verifier)
        config.validate(scheduler.model_config.context_len)  # flags valid for the other one
    if getattr(scheduler, "tp_rank", 0) == 0:
        logger.info("llm42: %s", line)
    runtime.install(scheduler, config, unproven_backend=row_unproven or verdict.unproven_backend,
                    row_pass_rows=rows)


def choose_verifier(config, scheduler) -> tuple[str, int | None, str | None, str]:
    """(verifier, rows of its forwards or None, what is unproven about it or None, the log
    line): `verifier_choice.choose` on this scheduler's device, pool and loaded weights."""
    import torch

    if config.requested_verifier == FIXED_SHAPE:  # nothing about the server to look at
        return FIXED_SHAPE, None, None, verifier_choice.FIXED_LINE
    device = torch.device(scheduler.device).type
    _, decode = scheduler.server_args.get_attention_backends()
    rows = row_pass.rows_per_forward(device)
    model = scheduler.tp_worker.model_runner.model
    verifier, line = verifier_choice.choose(
        config, device, decode, pool_rows=scheduler.req_to_token_pool.size, rows=rows,
        linear_problems=lambda n: row_pass.check_linears(model, n))
    if verifier != ROW_INVARIANT:
        return verifier, None, None, line
    return verifier, rows, verifier_choice.unproven(device, decode), line


def req_init_hook(result, req, *args, **kwargs):
    """AFTER Req.__init__: attach window state to deterministic requests."""
    if runtime.RUNTIME is None or not is_deterministic_params(req.sampling_params):
        return
    state = DetRequestState(
        rid=req.rid,
        window_size=runtime.RUNTIME.config.window_size,
        num_prompt_tokens=len(req.origin_input_ids),
    )
    fields = attach(req, state)
    _bind_det_request_hooks(req)
    # Never match or publish radix-cache prefixes: cached KV was computed by other batches.
    fields.sglang_extra_key, req.extra_key = req.extra_key, f"llm42-det:{req.rid}"
    req.skip_radix_cache_insert = True


def _bind_det_request_hooks(req) -> None:
    """The `around_det_req` hooks of patches/ as this request's own methods: its calls go
    through them, other requests' calls straight to SGLang's method (`plugin.DET_REQUEST_TYPE`)."""
    from llm42.sglang.plugin import DET_REQUEST_HOOKS

    for name, hook in DET_REQUEST_HOOKS:
        setattr(req, name, functools.partial(hook, getattr(type(req), name), req))


def update_finish_state_hook(original, req, new_accepted_len: int = 1):
    """AROUND Req.update_finish_state, bound on deterministic requests only
    (`_bind_det_request_hooks`): keep SGLang's checks, defer finishes of candidates.

    A finish caused by unverified candidates is withheld in the request's state
    (`DetRequestState.deferred_finish`) until the decision verifying them releases it."""
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
    if state.is_finishing:
        # Its finish is withheld while its last window waits for a pass (the overlap loop's
        # batch in flight, or --llm42-max-finish-wait): what was decoded past it is dropped.
        _drop_tail(sched, req, state.num_output_tokens)
        return
    original(req, new_accepted_len)
    past = speculation.past_stop(req)
    if past:  # a speculative step accepted tokens beyond the stop: never candidates
        _drop_tail(sched, req, len(req.output_ids) - past)
    _sync_new_tokens(state, req)
    inline_verify.on_token(runtime.RUNTIME, req, state)  # an inline step's token: verified now
    if req.finished() and withhold_finish(state, (req.finished_reason, req.finished_len)):
        req.finished_reason, req.finished_len = None, None


def _drop_tail(sched, req, new_len: int) -> None:
    """Drop `req`'s output past `new_len`; a speculative step then starts again from the last
    kept token (its draft tree would otherwise grow from a dropped one)."""
    batch = sched.running_batch
    if kv_rollback.truncate_output(sched, req, new_len, batch) and req.output_ids:
        speculation.rewind(sched, batch, req, req.output_ids[-1])


def _sync_new_tokens(state: DetRequestState, req) -> None:
    num_new = len(req.output_ids) - state.num_output_tokens
    if num_new <= 0:
        return
    if state.num_output_tokens == 0:
        state.on_first_token()  # verified: solo prefill; a candidate: prompt pass pending
        num_new -= 1
        if state.verify_prompt and prefill_faults.enabled() and not _prompt_inline(req):
            prefill_faults.perturb(runtime.RUNTIME.scheduler, req, state.num_cached_prompt_tokens)
    if num_new:
        state.append_candidates(num_new)


def _prompt_inline(req) -> bool:
    """Its prompt's rows ran inline with its prefill (`inline_prefill`): its prompt KV is the
    verifier's already (a test fault perturbed the fast path's before the rows replaced it)."""
    exact = of(req).exact_kv
    return exact is not None and exact >= len(req.origin_input_ids)


def reset_for_retract_hook(result, req, *args, **kwargs):
    """AFTER Req.reset_for_retract: a retracted deterministic request restarts from its prompt.

    SGLang keeps the outputs and re-prefills prompt + outputs, which would give the verified
    tokens KV computed by a prefill instead of by their windows (`DetRequestState.restart`).
    Its KV is already released (`release_kv_cache`), so only the lists are cut."""
    fields = of(req)
    if fields is None or fields.det is None:
        return
    state = fields.det
    # Only what the stream already carries: its offsets must not move past tokens whose
    # logprobs are not regenerated yet (the overlap loop may stream a just-retracted request).
    sent = req.output_ids[: min(req.send_token_offset, state.num_verified_tokens)]  # array copy
    if fields.published is None or len(sent) > len(fields.published):
        fields.published = sent
    state.restart()  # drops the deferred finish and the readiness stamp too
    inline_verify.forget(req)
    kv_rollback.truncate_output(runtime.RUNTIME.scheduler, req, 0, None)
    runtime.RUNTIME.stats.observe_restart()
