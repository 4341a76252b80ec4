"""Hooks on a request's life in the scheduler: server start, a deterministic request's creation,
its finishes (deferred until verified, or an abort dropping its candidates) and its retraction
(a restart from the prompt)."""

from __future__ import annotations

from llm42.core.config import ROW_INVARIANT
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
)
from llm42.sglang.keys import META_KEYS
from llm42.sglang.request_fields import is_deterministic_params
from llm42.sglang.request_state import attach, det_state, of


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
    unproven, rows = verdict.unproven_backend, None
    if config.verifier == ROW_INVARIANT:
        row_unproven, rows = _check_row_invariant(scheduler, config)
        unproven = row_unproven or unproven
    runtime.install(scheduler, config, unproven_backend=unproven, row_pass_rows=rows)


def _check_row_invariant(scheduler, config) -> tuple[str | None, int]:
    """--llm42-verifier row-invariant only on a decode attention backend whose row passes fix
    each row's KV split, with a proof (or the override), and where its forwards' GEMMs keep each
    row's bits whatever the other rows (checked on the loaded weights, `row_pass.check_linears`).
    Returns what is unproven about it (None: nothing) and the rows of its forwards."""
    import torch

    device = torch.device(scheduler.device).type
    rows = row_pass.rows_per_forward(device)
    _, decode = scheduler.server_args.get_attention_backends()
    if rows is None or decode != row_pass.ROW_PASS_BACKENDS.get(device):
        raise ValueError(
            f"llm42: --llm42-verifier row-invariant needs decode attention "
            f"{row_pass.ROW_PASS_BACKENDS.get(device, '(none on this device)')} on {device} "
            f"(got {decode}); serve with --llm42-verifier fixed-shape")
    pool_rows = scheduler.req_to_token_pool.size
    if pool_rows < rows:
        raise ValueError(
            f"llm42: --llm42-verifier row-invariant runs forwards of {rows} rows, but this "
            f"server holds {pool_rows} requests (the attention backend sizes its batch buffers "
            f"by that); pass --max-running-requests {rows} or more, or serve with "
            "--llm42-verifier fixed-shape")
    unproven = None
    if row_pass.PROVEN_ROW_BACKENDS.get(device) != decode:
        unproven = f"row-invariant:{decode}"
        if not config.allow_unproven_backend:
            raise ValueError(
                f"llm42: --llm42-verifier row-invariant has no determinism proof on {device} "
                f"{decode} yet (proven: {_proven_row_backends()}); pass "
                "--llm42-allow-unproven-backend "
                "to run it for a proof, or serve with --llm42-verifier fixed-shape")
    problems = row_pass.check_linears(scheduler.tp_worker.model_runner.model, rows)
    if problems:
        raise ValueError("llm42: --llm42-verifier row-invariant refused, this device's GEMMs "
                         "are not row-invariant at the pass shape: " + "; ".join(problems))
    return unproven, rows


def _proven_row_backends() -> str:
    return ", ".join(f"{device} {backend}" for device, backend
                     in row_pass.PROVEN_ROW_BACKENDS.items())


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
    fields = attach(req, state)
    # Never match or publish radix-cache prefixes: cached KV was computed by other batches.
    fields.sglang_extra_key, req.extra_key = req.extra_key, f"llm42-det:{req.rid}"
    req.skip_radix_cache_insert = True
    req.customized_info = {key: _CounterView(state, attr) for key, attr in META_KEYS.items()}


def update_finish_state_hook(original, req, new_accepted_len: int = 1):
    """AROUND Req.update_finish_state: keep SGLang's checks, defer finishes of candidates.

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
