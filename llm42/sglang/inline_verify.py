"""`--llm42-inline-verify`: a decode step that verifies its deterministic rows as it makes them.

Under the row-invariant verifier a pass entry is one decode row in a forward of R rows
(`row_pass`): its bits depend only on its request's token, position and KV. A decode step of
N <= R rows run as that same forward (the step's rows, then padding to R) computes, for a
deterministic row whose KV positions [0, p) already hold the verifier's bits, exactly the entry a
pass would compute for it later. So its logits are the verifier's logits for the token it
samples, and its KV at p is the verifier's KV: the token is verified on arrival, with no window
wait, no pass and no rollback, and the next step can do the same. Per step:

    launch   (`plan_step`, after SGLang built the decode batch)  row i eligible when the step is
             worth it (`worth_inline`) and the request's exact KV reaches its position p
             (`Llm42Req.exact_kv` == p)
    forward  (`take_launch` / `run_forward`, for ModelRunner.forward)  the batch as one R-row
             row pass; the eligible rows' logits copied out; the first N rows go to the sampler
    result   (`sample_step`, before SGLang processes the step)  the verifier's sampling of those
             logits (penalties, grammar, seeds, as for a pass entry)
    arrival  (`on_token`, in Req.update_finish_state)  the fast path's token equals the
             verifier's: committed (`DetRequestState.verify_on_arrival`), its finish not
             withheld; else it stays a candidate for a pass (`inline_misses`)

Exact KV starts where a pass decision leaves it (`after_decision`: the verified prefix) and
grows by one per eligible step; any other step at position p cuts it to p. A request whose
candidates block its chain (a step of more than R rows, a miss, a prompt pass run after its
first decode step was launched) is verified at the next round as a partial window
(`catching_up`), after which its next step is eligible again. Outputs do not change: the same
forward of the same rows computes every verified token either way (tests/test_row_invariant.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from llm42.sglang import (
    det_rows,
    fold_pass,
    fp32_logits,
    inline_prefill,
    prefix_cache,
    row_pass,
    runtime,
    tp_share,
    verifier,
)
from llm42.sglang.request_state import det_state, deterministic_rows, of

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import ScheduleBatch

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class InlineStep:
    """One decode step launched as a row-invariant forward."""

    batch: ScheduleBatch  # the decode batch (the forward's template, as a pass's)
    reqs: list  # its requests at launch, in row order
    positions: list[int]  # the input token's position of each row
    eligible: list[tuple[int, object, int]]  # (row, request, output index its logits predict)
    riders: fold_pass.Riders | None = None  # a due round's entries, after the step's rows
    checked: list[int] = field(default_factory=list)  # eligible rows sampled again
    # (`inline_prefill.checked`)
    logits: torch.Tensor | None = None  # [len(checked), vocab] fp32, copied at the forward

    @property
    def claimed(self) -> list:
        """(request, start, end) of the KV this step claims exact."""
        return [(req, self.positions[i], self.positions[i] + 1) for i, req, _ in self.eligible]


_Step = InlineStep | inline_prefill.PrefillStep


_LAUNCH: _Step | None = None  # planned for the forward about to run


def active(rt) -> bool:
    return bool(getattr(rt, "inline_verify", False))


def worth_inline(rt, num_rows: int, num_det_rows: int, rolled_back: bool = False) -> bool:
    """Whether a decode step of `num_rows` rows, `num_det_rows` of them deterministic, runs as an
    R-row forward: its R - N padding rows slow every row of the step, where passes would verify
    those deterministic rows at one R-row forward per R tokens (`--llm42-inline-pad-ratio`).
    Whatever the padding when one of them was `rolled_back`: passes cost that request a window
    per mismatch (a lone request whose windows keep rolling back would crawl)."""
    rows = rt.row_pass_rows
    return (num_det_rows > 0 and num_rows <= rows
            and (rolled_back or rows - num_rows <= rt.config.inline_pad_ratio * num_det_rows))


def chained_rows(reqs) -> tuple[int, bool]:
    """How many of `reqs` are rows an inline step can verify (deterministic, with a verified
    prompt: their KV can become the verifier's), and whether one of them was rolled back: the
    two inputs of `worth_inline`. The hooks pass the batch's deterministic requests only
    (`request_state.deterministic`): a Python loop over every row costs a host-bound step."""
    num, rolled = 0, False
    for req in reqs:
        fields = of(req)
        if fields is not None and fields.det is not None and fields.det.verify_prompt and (
                not req.finished()):
            num += 1
            rolled = rolled or fields.rolled_back
    return num, rolled


def plan_step(rt, batch) -> None:
    """After SGLang built `batch`: plan it as an inline step if it is a decode batch worth it
    (`worth_inline`) with an eligible deterministic row, and move each deterministic row's
    exact KV; a prefill batch runs its deterministic prompts' rows inline (`inline_prefill`)."""
    global _LAUNCH
    if _LAUNCH is not None:  # planned but never run: its claims do not hold
        _abandon(_LAUNCH)
    riders = fold_pass.attach(rt, batch) if active(rt) else None
    if not active(rt) or batch is None or not batch.reqs:
        return
    if batch.forward_mode.is_extend():
        _LAUNCH = inline_prefill.plan(rt, batch)
        return
    if not batch.forward_mode.is_decode():
        return
    det_index = deterministic_rows(batch.reqs, det_rows.of_batch(batch))
    if not det_index:
        return
    num_det, rolled_back = chained_rows([batch.reqs[i] for i in det_index])
    # a step carrying riders runs at R rows anyway: its padding costs nothing more
    inline = riders is not None or worth_inline(rt, len(batch.reqs), num_det, rolled_back)
    if num_det and not inline:
        rt.stats.observe_inline_declined()
    seq_lens = batch.seq_lens_cpu.tolist()  # a row's input token sits at its length - 1
    eligible = []
    for i in det_index:
        req, p = batch.reqs[i], seq_lens[i] - 1
        fields = of(req)
        if fields.exact_kv is None:
            continue
        exact = min(fields.exact_kv, p)  # KV from p on is written by this step
        if inline and exact == p:
            eligible.append((i, req, p + 1 - len(req.origin_input_ids)))
            exact = p + 1
        fields.exact_kv = exact
    if eligible or riders is not None:
        _LAUNCH = InlineStep(batch, list(batch.reqs), [n - 1 for n in seq_lens], eligible,
                             riders)
        if runtime.TIMELINE is not None:
            runtime.TIMELINE.observe_inline()


def _abandon(step: _Step) -> None:
    global _LAUNCH
    _LAUNCH = None
    logger.warning("llm42: an inline step was planned but ran otherwise; its "
                   "requests are verified by passes")
    if getattr(step, "riders", None) is not None:
        fold_pass.missed(runtime.RUNTIME)
    for req, _, _ in step.claimed:
        fields = of(req)
        if fields is not None:
            fields.exact_kv = None


def model_forward_hook(original, model_runner, forward_batch, *args, **kwargs):
    """AROUND ModelRunner.forward: a decode step planned inline runs as a row pass, a prefill
    planned inline runs its prompt rows after SGLang's extend (their inner forwards come back
    here in pass mode); every forward then takes the fp32 logits hook. With a step timeline,
    the host time of each outermost call is counted (`runtime.FORWARD_S`): an iteration's
    `forward_s` tells its forward's launch apart from the rest of the loop."""
    if runtime.TIMELINE is None or _FORWARD_DEPTH[0]:
        return _model_forward(original, model_runner, forward_batch, *args, **kwargs)
    _FORWARD_DEPTH[0] += 1
    started = time.perf_counter()
    try:
        return _model_forward(original, model_runner, forward_batch, *args, **kwargs)
    finally:
        _FORWARD_DEPTH[0] -= 1
        runtime.FORWARD_S[0] += time.perf_counter() - started


_FORWARD_DEPTH = [0]  # nested forwards (a pass's, an inline prefill's rows) count in the outer


def _model_forward(original, model_runner, forward_batch, *args, **kwargs):
    step = take_launch(forward_batch)
    if isinstance(step, inline_prefill.PrefillStep):
        return inline_prefill.run_forward(step, original, model_runner, forward_batch, *args,
                                          **kwargs)
    if step is not None:
        return run_forward(step, original, model_runner, forward_batch, *args, **kwargs)
    return fp32_logits.model_forward_hook(original, model_runner, forward_batch, *args, **kwargs)


def take_launch(forward_batch) -> _Step | None:
    """The inline step planned for this forward (None: a normal forward)."""
    global _LAUNCH
    step = _LAUNCH
    if step is None or runtime.IN_VERIFY_PASS:
        return None
    mode = forward_batch.forward_mode
    kind_ok = (mode.is_extend() if isinstance(step, inline_prefill.PrefillStep)
               else mode.is_decode())
    if not kind_ok or forward_batch.batch_size != len(step.reqs):
        _abandon(step)
        return None
    _LAUNCH = None
    return step


def run_forward(step: InlineStep, original, model_runner, forward_batch, *args, **kwargs):
    """The step's forward as one row pass of R rows; the first N rows' logits for SGLang's
    sampler, the eligible rows' kept.

    A step that SGLang runs as R rows anyway (`own_forward`) is such a forward already: SGLang's
    own, run in pass mode (fixed KV splits for the eligible rows, fp32 logits), computes every
    eligible row as `row_pass.forward_rows` would, so no second batch is built (its host time
    is what a host-bound step pays for). Other steps run through `forward_rows`, padded to R
    rows."""
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput
    from sglang.srt.model_executor.model_runner import ModelRunnerOutput

    rt = runtime.RUNTIME
    started = time.perf_counter()
    rows, n = rt.row_pass_rows, len(step.reqs)
    riders = step.riders
    entries = riders.entries if riders is not None else []
    own = riders is None and own_forward(model_runner, forward_batch, n, rows)
    ids = forward_batch.input_ids
    kept = verifier.to_device([i for i, _, _ in step.eligible]
                              + list(range(n, n + len(entries))), torch.int64, ids.device)
    with row_pass.verified_rows(kept):  # the other rows keep SGLang's KV splits
        if own:
            runtime.IN_VERIFY_PASS = True
            try:
                result = fp32_logits.model_forward_hook(original, model_runner, forward_batch,
                                                        *args, **kwargs)
            finally:
                runtime.IN_VERIFY_PASS = False
            out, logits = result.logits_output, result.logits_output.next_token_logits
        else:  # the step's rows, a folded round's entries (`fold_pass`), padding
            tail = riders.tokens if riders is not None else []
            tail += [0] * (rows - n - len(tail))
            input_ids = torch.cat([ids, verifier.to_device(tail, ids.dtype, ids.device)])
            logits, graphed = row_pass.forward_rows(
                rt.scheduler, step.batch, step.reqs + [req for req, _, _ in entries],
                step.positions + [pos for _, pos, _ in entries], rows, input_ids)
            if riders is not None:
                fold_pass.keep(rt, riders, logits, n, graphed, time.perf_counter() - started)
            out = LogitsProcessorOutput(next_token_logits=logits[:n])
            result = ModelRunnerOutput(logits_output=out, can_run_graph=graphed)
    step.checked = inline_prefill.checked(step.eligible)
    if step.checked:
        index = verifier.to_device([step.eligible[j][0] for j in step.checked], torch.int64,
                                   logits.device)
        # copied before SGLang's sampler scales the rows in place and the next replay
        # overwrites them
        step.logits = logits.index_select(0, index).float()
    out.llm42_inline = step
    rt.stats.observe_inline_step(time.perf_counter() - started, own_forward=own)
    return result


def own_forward(model_runner, forward_batch, num_rows: int, rows: int) -> bool:
    """Whether SGLang's own forward of this decode step computes its rows at R = `rows` rows:
    a step of exactly R rows, or one that replays the decode CUDA graph SGLang captured for R
    rows (it pads to the smallest captured size that holds it) with the fp32 LM head inside the
    graph. Every GEMM then sees R rows, as in `row_pass.forward_rows`, and the padding rows
    (SGLang's, or the pass's) change no other row's bits. A graph whose fp32 logits are
    recomputed after the replay would recompute them at N rows, and an eager forward runs at N:
    those steps go through `forward_rows`."""
    if num_rows == rows:
        return True
    runner = getattr(model_runner, "decode_cuda_graph_runner", None)
    sizes = getattr(runner, "capture_bs", None) or ()
    if (rows not in sizes or any(num_rows <= size < rows for size in sizes)
            or getattr(model_runner, "device", None) != "cuda"):
        return False
    return (forward_batch.forward_mode.is_cuda_graph() and runner.can_run_graph(forward_batch)
            and fp32_logits.logits_at_graph_rows(num_rows))


def sample_step(rt, step: _Step, logits_ready: bool = False) -> None:
    """Before SGLang processes the step: the verifier's token for each eligible row whose
    request still waits for exactly that token (`Llm42Req.inline_result`).

    On CUDA its kernels run on a stream of their own. The overlap loop processes this step's
    result after launching the next forward, and fences the scheduler's stream behind that
    forward (SGLang's WAR barrier): sampled there, the verifier's tokens would reach the host
    only once the next forward ended, and the loop could not launch the one after it meanwhile.
    `logits_ready`: the host already waited for the step's forward (its copy-done event)."""
    started = time.perf_counter()
    try:
        with _sampling_stream(step, logits_ready):
            _sample_step(rt, step)
    finally:
        rt.stats.observe_inline_sample(time.perf_counter() - started)


_STREAMS: dict = {}  # device -> the side stream inline steps sample on


def _sampling_stream(step: _Step, logits_ready: bool):
    import contextlib

    logits = step.logits
    if logits is None or logits.device.type != "cuda":
        return contextlib.nullcontext()
    stream = _STREAMS.get(logits.device)
    if stream is None:
        stream = _STREAMS[logits.device] = torch.cuda.Stream(device=logits.device)
    if not logits_ready:  # SGLang's normal loop: nothing is queued behind the step
        stream.wait_stream(torch.cuda.current_stream(logits.device))
    return torch.cuda.stream(stream)


def _sample_step(rt, step: _Step) -> None:
    keep = []
    for j, (_, req, k) in enumerate(step.eligible):
        state = det_state(req)
        if (state is not None and not req.finished() and len(req.output_ids) == k
                and state.num_verified_tokens == k):
            keep.append((j, req, k))
    # rows nothing adjusts are the verifier's by construction (`inline_prefill.checked`); the
    # rest are sampled again with their penalties, grammar, bias or processor replayed
    where = {j: m for m, j in enumerate(step.checked)}  # eligible row -> its logits row
    checked = []
    for j, req, k in keep:
        if j in where:
            checked.append((j, req, k))
        else:
            of(req).inline_result = (k, BY_CONSTRUCTION, None, None, None)
    if not checked:
        return
    logits = step.logits
    if len(checked) < len(step.checked):
        logits = logits.index_select(
            0, verifier.to_device([where[j] for j, _, _ in checked], torch.int64, logits.device))
    positions = [step.positions[step.eligible[j][0]] for j, _, _ in checked]
    sampled = verifier.sample_entries(rt.scheduler, [req for _, req, _ in checked], logits,
                                      positions)
    for (_, req, k), entry in zip(checked, sampled):
        of(req).inline_result = (k, *entry)


# An inline result whose token is whatever SGLang sampled: the verifier's, and so are its
# logprobs (`_sample_step`)
BY_CONSTRUCTION = -1


def on_token(rt, req, state) -> None:
    """In Req.update_finish_state, the step's token just appended: verified on arrival when it
    is the verifier's token for that index."""
    fields = of(req)
    result = fields.inline_result
    if result is None:
        return
    fields.inline_result = None
    k, token, logprob, top_v, top_i = result
    if state.num_verified_tokens != k or len(req.output_ids) != k + 1:
        return
    verified = token == BY_CONSTRUCTION or req.output_ids[k] == token
    rt.stats.observe_inline_token(verified)
    if not verified:
        return
    if state.is_prompt_pending:  # o_0 of an inline prefill: its prompt KV is exact too
        state.verify_prompt_on_arrival()
        rt.stats.observe_inline_prompt()
        if prefix_cache.uses_cache(req):
            prefix_cache.publish_prompt(rt.scheduler, req)
    else:
        state.verify_on_arrival()  # no finish can be deferred: it had no candidate before
    tp_share.observe_inline(rt, req, k)
    if req.return_logprob and token != BY_CONSTRUCTION:
        if fields.inline_logprobs is None:
            fields.inline_logprobs = {}
        fields.inline_logprobs[k] = (logprob, top_v, top_i)


def write_logprobs(req) -> None:
    """Before a request's output is streamed: its inline-verified tokens carry the verifier's
    logprobs, written over the fast path's (SGLang appended those after `on_token`)."""
    fields = of(req)
    pending = fields.inline_logprobs if fields is not None else None
    if not pending:
        return
    fields.inline_logprobs = None
    for k, (logprob, top_v, top_i) in sorted(pending.items()):
        verifier.put_logprobs(req, k, logprob, top_v, top_i)


def after_decision(rt, req, state) -> None:
    """A pass decided `req`'s job: its KV holds the verifier's bits up to its last verified
    token, the next step's input (a prompt verified by prompt rows, or by a solo prefill's
    own computation only when prompt rows verified it)."""
    if active(rt) and state.verify_prompt:
        of(req).exact_kv = len(req.origin_input_ids) + state.num_verified_tokens - 1


def catching_up(rt, req, state, num_running: int, num_det: int,
                rolled_back: bool = False) -> bool:
    """Verify `req`'s candidates now, partial window or not: afterwards its next step (in a
    batch of `num_running` rows, `num_det` of them chained, if that is worth inline) verifies
    its rows inline again. Not worth it: its windows wait for passes as usual."""
    return (active(rt) and state.verify_prompt and not state.is_prompt_pending
            and state.num_candidate_tokens > 0
            and worth_inline(rt, num_running, num_det, rolled_back))


def forget(req) -> None:
    """A restart from the prompt: nothing of its KV is known exact any more."""
    fields = of(req)
    if fields is not None:
        fields.exact_kv = fields.inline_result = fields.inline_logprobs = None
