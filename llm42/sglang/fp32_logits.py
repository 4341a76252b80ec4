"""`--llm42-fp32-logits`: fp32 logits for the rows that are verified, SGLang's bf16 for the rest.

SGLang rounds the LM head's output to the model dtype before it becomes float32. bf16 keeps 8
bits of mantissa: logits around 15 are quantized in steps of 0.06, so many tokens tie, and a
last-bit difference between the decode batch and the verification pass moves a logit across a
rounding boundary and flips the argmax. Measured on SmolLM2 real weights (CPU, W = 16, B = 32):
greedy recompute 18.2 % with bf16 logits, 6.0 % with fp32 logits.

Only two kinds of row need them: every row of a verification pass, and the deterministic rows
of a fast-path batch (their candidates must agree with the pass). Normal rows keep SGLang's
bf16 LM head bits, so their outputs equal plain SGLang's (issue 33: fp32 logits for every row of
an 8B decode batch cost normal traffic). Per forward:

    pass (runtime.IN_VERIFY_PASS); an eager forward whose rows are all deterministic, or
    tokens rather than requests (input logprobs)     -> every row fp32 in the LM head hook
    rows of both kinds, where one GEMM is exact      -> one GEMM with fp32 output for every
                                                        row; normal rows rounded to bf16 (then
                                                        upcast, as SGLang does), deterministic
                                                        rows kept in fp32
    otherwise (recompute)                            -> SGLang's bf16 for every row; after the
                                                        forward, the deterministic rows' logits
                                                        are recomputed in fp32 from their
                                                        hidden states and written over theirs

One GEMM for every row reads the weights once; the recompute reads them a second time (H100,
8B shape: +0.37-0.39 ms on every decode step with a deterministic row, `benchmarks.lm_head_cost`).
It is exact only where SGLang's bf16 GEMM equals the fp32-output GEMM rounded to bf16, bit for
bit: the same kernel, accumulation and rounding, which depends on the device, the library and
the row count N. So each N is checked once on the device, on the loaded weights with random
inputs (`one_gemm_exact`), before it is used; an N that fails (or a head with a logit scale,
applied before SGLang's upcast) keeps the recompute. H100, torch 2.11 cu130: exact for every
N = 1 .. 256. `LLM42_FP32_LOGITS_LAYOUT=recompute` turns the one-GEMM layout off.

The decode CUDA graph holds the LM head, so Python does not run when it replays: while a graph
is captured, the hook copies the LM head's input into a persistent buffer (one small copy per
step), and the recompute reads it there. Eager forwards (extend batches: SGLang's prefill graphs
stop before the LM head) keep a reference instead. The recompute goes through SGLang's own
`LogitsProcessor._get_logits` (logit scale, TP gather, vocabulary cut, soft-capping), like a
pass's rows.

The GEMM reads the bf16 weights once and writes fp32 (`torch.mm(..., out_dtype=torch.float32)`
on CUDA, fp32 accumulation as in any bf16 GEMM); where that overload is missing (CPU) the inputs
are upcast, as SGLang's `--enable-fp32-lm-head` does on every forward. Whether the flag is on is
read from the server arguments, not from llm42's runtime: SGLang captures its decode CUDA graphs
before llm42's scheduler hook runs.
"""

from __future__ import annotations

import logging
import os
import threading

import torch

from llm42.sglang import det_rows, runtime

logger = logging.getLogger(__name__)
_ENABLED: bool | None = None
_SPECULATIVE = False  # set with _ENABLED (see `_fast_path_forward`)
_MM_OUT_DTYPE: dict[str, bool] = {}  # device type -> torch.mm(out_dtype=...) works there
_DEFAULT_GRAPH_ROWS = 1024  # graph buffer rows when SGLang's decode graph size is unknown
# Test / proof runs: check on the device, without a sync, that each recomputed row is the row
# SGLang computed, only less rounded (`recompute_rows`).
CHECK_ROWS_ENV = "LLM42_TEST_CHECK_FP32_ROWS"
# auto (default): one GEMM for the rows of both kinds where `one_gemm_exact`; recompute: never.
LAYOUT_ENV = "LLM42_FP32_LOGITS_LAYOUT"
_EXACT: dict[tuple, bool] = {}  # (device, weight shape, dtype, N) -> one GEMM is exact
_GRAPH_ONE_GEMM: dict[int, bool] = {}  # decode graph rows -> captured with the one-GEMM layout


class _Forward(threading.local):
    """What the LM head hook needs to know about the forward it runs in (set around
    `ModelRunner.forward`; a CUDA graph capture runs outside it and sees the defaults)."""

    all_rows = False  # every row needs fp32 (see the module docstring)
    det_rows: tuple | None = None  # (index on the device, rows) of a forward of both kinds
    in_forward = False  # inside ModelRunner.forward (a graph's warm-up and capture are not)
    computed = False  # the LM head hook gave every row fp32 in this forward (it ran eagerly)
    forced = False  # inside the recompute: fp32 whatever else holds
    eager_hidden: torch.Tensor | None = None  # [rows, H] the LM head's input of this forward
    head: tuple | None = None  # (LogitsProcessor, lm_head) last seen with a plain LM head


_FWD = _Forward()
_GRAPH_HIDDEN: torch.Tensor | None = None  # [capacity, H] written by every decode graph replay
_GRAPH_MASK: torch.Tensor | None = None  # [capacity] bool, written before every decode forward


def enabled() -> bool:
    global _ENABLED, _SPECULATIVE
    if _ENABLED is None:
        from sglang.srt.runtime_context import get_server_args

        from llm42.sglang import speculation
        from llm42.sglang.server_args import config_from_server_args

        server_args = get_server_args()
        config = config_from_server_args(server_args)
        _ENABLED = config is not None and config.fp32_logits
        _SPECULATIVE = speculation.is_speculative(server_args)
    return _ENABLED


def _fast_path_forward(model_runner, forward_batch) -> bool:
    """Whether a fast-path forward gives its deterministic rows fp32 logits. On a speculative
    server only the target's prefills do (a solo prefill's o_0 is verified as it is made): its
    verify steps may replay a CUDA graph of draft-token rows and its draft model shares the LM
    head hook, so their candidates keep bf16 (more rollbacks, same outputs)."""
    if not _SPECULATIVE:
        return True
    mode = forward_batch.forward_mode
    return (not getattr(model_runner, "is_draft_worker", False) and mode.is_extend()
            and not mode.is_target_verify())


def fp32_matmul(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """hidden [n, H] @ weight [V, H]^T -> [n, V] float32."""
    hidden = hidden.to(weight.dtype)
    device = hidden.device.type
    if _MM_OUT_DTYPE.get(device, True):
        try:
            out = torch.mm(hidden, weight.t(), out_dtype=torch.float32)
        except (RuntimeError, TypeError, NotImplementedError):
            _MM_OUT_DTYPE[device] = False
            logger.info("llm42: fp32 logits on %s by upcasting (no torch.mm out_dtype)", device)
        else:
            if device not in _MM_OUT_DTYPE:
                logger.info("llm42: fp32 logits on %s from a bf16 GEMM (torch.mm out_dtype)",
                            device)
            _MM_OUT_DTYPE[device] = True
            return out
    return torch.matmul(hidden.float(), weight.float().t())


def compute_lm_head_hook(original, processor, hidden_states, lm_head, embedding_bias=None):
    """AROUND LogitsProcessor._compute_lm_head: fp32 logits for every row where the forward
    needs them all; otherwise SGLang's path, remembering the input for the deterministic rows'
    recompute. Quantized, LoRA and SGLang's own fp32 heads keep SGLang's path."""
    if not enabled() or not _is_plain(processor, lm_head):
        return original(processor, hidden_states, lm_head, embedding_bias)
    _FWD.head = (processor, lm_head)
    if _FWD.forced:
        return fp32_matmul(hidden_states, lm_head.weight)
    if runtime.IN_VERIFY_PASS:
        _FWD.computed = True
        return fp32_matmul(hidden_states, lm_head.weight)
    rows = hidden_states.shape[0]
    if _capturing(hidden_states):
        if _SPECULATIVE:  # graphs of verify steps and draft models (`_fast_path_forward`)
            return original(processor, hidden_states, lm_head, embedding_bias)
        _graph_buffer(hidden_states)[:rows].copy_(hidden_states)  # the recompute's input
        # checked in the warm-up forward SGLang runs before each capture (no sync here)
        _GRAPH_ONE_GEMM[rows] = _one_gemm_usable(processor, lm_head, rows, check=False)
        if _GRAPH_ONE_GEMM[rows]:
            return _one_gemm(hidden_states, lm_head.weight, _graph_mask(hidden_states)[:rows])
    elif _FWD.all_rows:
        _FWD.computed = True
        return fp32_matmul(hidden_states, lm_head.weight)
    elif _FWD.det_rows is not None and _one_gemm_usable(processor, lm_head, rows):
        _FWD.computed = True
        index, num_rows = _FWD.det_rows
        mask = torch.zeros(num_rows, dtype=torch.bool, device=index.device)
        return _one_gemm(hidden_states, lm_head.weight, mask.index_fill_(0, index, True))
    else:
        _FWD.eager_hidden = hidden_states
        if hidden_states.is_cuda and not _FWD.in_forward:
            # a decode graph's warm-up forward (SGLang runs two before each capture, outside
            # ModelRunner.forward): check its N now, the capture cannot
            _one_gemm_usable(processor, lm_head, rows)
    return original(processor, hidden_states, lm_head, embedding_bias)


def _capturing(hidden: torch.Tensor) -> bool:
    """A CUDA graph (SGLang's decode graph) is being captured: Python will not run at replay."""
    return hidden.is_cuda and torch.cuda.is_current_stream_capturing()


def _one_gemm(hidden: torch.Tensor, weight: torch.Tensor, det_mask: torch.Tensor) -> torch.Tensor:
    """fp32 logits [N, V] for the `det_mask` rows, SGLang's bf16 logits (upcast) for the others,
    from one GEMM with fp32 output."""
    full = fp32_matmul(hidden, weight)
    return torch.where(det_mask.unsqueeze(1), full, full.to(weight.dtype).float())


def _one_gemm_usable(processor, lm_head, rows: int, check: bool = True) -> bool:
    """Whether a forward of `rows` LM head rows may use the one-GEMM layout: not turned off, no
    logit scale (SGLang applies it before its upcast), and `one_gemm_exact` for this N (run
    now if `check`, else only a past check counts: inside a CUDA graph capture)."""
    if os.environ.get(LAYOUT_ENV, "auto") == "recompute" or getattr(
            processor, "logit_scale", None) is not None:
        return False
    weight = lm_head.weight
    key = (str(weight.device), tuple(weight.shape), weight.dtype, rows)
    if key not in _EXACT:
        if not check:
            return False
        _EXACT[key] = one_gemm_exact(weight, rows)
        logger.info("llm42: fp32 logits for %d rows by %s", rows,
                    "one GEMM" if _EXACT[key] else "recompute (bf16 != rounded fp32 here)")
    return _EXACT[key]


def one_gemm_exact(weight: torch.Tensor, rows: int) -> bool:
    """`bf16_is_rounded_fp32` for `rows` random inputs (a seeded generator of its own: the global
    RNG is untouched): the check each N passes before the one-GEMM layout serves it
    (`benchmarks.lm_head_cost` runs the same one over N = 1 .. 256)."""
    g = torch.Generator(device=weight.device).manual_seed(rows)
    hidden = torch.randn(rows, weight.shape[1], generator=g, device=weight.device,
                         dtype=torch.float32).to(weight.dtype)
    return bf16_is_rounded_fp32(hidden, weight)


def bf16_is_rounded_fp32(hidden: torch.Tensor, weight: torch.Tensor) -> bool:
    """SGLang's bf16 LM head [N, H] @ [V, H]^T equals the fp32-output GEMM rounded to bf16, bit
    for bit."""
    return torch.equal(torch.matmul(hidden.to(weight.dtype), weight.T),
                       fp32_matmul(hidden, weight).to(weight.dtype))


def model_forward_hook(original, model_runner, forward_batch, *args, **kwargs):
    """AROUND ModelRunner.forward: decide which rows get fp32 logits, run the forward, then
    recompute the deterministic rows' logits in fp32 (see the module docstring)."""
    if enabled() and runtime.IN_VERIFY_PASS:
        return _pass_forward(original, model_runner, forward_batch, *args, **kwargs)
    if (not enabled() or not _fast_path_forward(model_runner, forward_batch)
            or getattr(model_runner.server_args, "enable_dp_attention", False)):
        # DP attention gathers other ranks' rows into the LM head: its deterministic rows keep
        # bf16 on the fast path (more rollbacks, same outputs: passes stay fp32)
        return original(model_runner, forward_batch, *args, **kwargs)
    det_index, num_rows = deterministic_rows(forward_batch)
    _FWD.all_rows = det_index is not None and (
        len(det_index) == num_rows or _rows_are_tokens(forward_batch))
    _FWD.computed, _FWD.eager_hidden, _FWD.det_rows = False, None, None
    _FWD.in_forward = True
    decode = forward_batch.forward_mode.is_decode()
    graph_mask = decode and _GRAPH_MASK is not None  # a decode graph may read it
    device = _GRAPH_MASK.device if _GRAPH_MASK is not None else _forward_device(model_runner)
    # one host-to-device copy of the rows per forward, for the graph mask, the eager one-GEMM
    # mask and the recompute; none where every row is fp32 and no graph mask needs them
    index = None
    if det_index is not None and device is not None and (graph_mask or not _FWD.all_rows):
        index = _index(det_index, device)
    if graph_mask:  # this batch's rows
        _GRAPH_MASK.zero_()
        if index is not None:
            _GRAPH_MASK.index_fill_(0, index, True)
    if index is not None and not _FWD.all_rows:
        _FWD.det_rows = (index, num_rows)  # the hook builds the mask if it runs eagerly
    try:
        out = original(model_runner, forward_batch, *args, **kwargs)
        if det_index is not None and not _FWD.computed:
            # a decode graph replayed (its LM head input is in the graph buffer, unless it
            # computed the one-GEMM layout itself), or rows of both kinds ran eagerly
            hidden = _FWD.eager_hidden
            if hidden is None and decode:
                if _graph_used_one_gemm(num_rows):
                    _check_graph_rows(out.logits_output, det_index)
                    return out
                hidden = _GRAPH_HIDDEN
            recompute_rows(out.logits_output, det_index, hidden, index)
    finally:
        _FWD.all_rows, _FWD.computed, _FWD.eager_hidden = False, False, None
        _FWD.det_rows, _FWD.in_forward = None, False
    return out


def _pass_forward(original, model_runner, forward_batch, *args, **kwargs):
    """A verification pass's forward: fp32 logits for every row, whichever way it runs.

    Eagerly the LM head hook computes them. A row-invariant pass is a decode forward and may
    replay one of SGLang's decode CUDA graphs, captured for the fast path: one captured with the
    one-GEMM layout gets a mask of every row (reset after, so no later fast-path replay reads
    it), one captured for the recompute has every row recomputed from its LM head input."""
    decode = forward_batch.forward_mode.is_decode()
    if decode and _GRAPH_MASK is not None:
        _GRAPH_MASK.fill_(True)
    _FWD.computed, _FWD.in_forward = False, True
    try:
        out = original(model_runner, forward_batch, *args, **kwargs)
        logits = getattr(out.logits_output, "next_token_logits", None)
        if decode and not _FWD.computed and logits is not None and _FWD.head is not None:
            rows = logits.shape[0]
            if not _graph_used_one_gemm(rows):
                if _GRAPH_HIDDEN is None:
                    raise RuntimeError("llm42 fp32 logits: a pass replayed a decode graph that "
                                       "kept no LM head input")
                recompute_rows(out.logits_output, list(range(rows)), _GRAPH_HIDDEN)
    finally:
        if decode and _GRAPH_MASK is not None:
            _GRAPH_MASK.zero_()
        _FWD.computed, _FWD.in_forward = False, False
    return out


def _index(det_index: list[int], device) -> torch.Tensor:
    from llm42.sglang.verifier import to_device  # pinned: no host wait on the overlap loop

    return to_device(det_index, torch.int64, device)


def _forward_device(model_runner):
    device = getattr(model_runner, "device", None)
    return torch.device(device) if device is not None else None


def logits_at_graph_rows(num_rows: int) -> bool:
    """Whether a pass forward of `num_rows` rows that replays a decode graph computes its
    logits at the graph's rows: bf16 logits, or fp32 ones from the one-GEMM layout inside the
    graph (`_pass_forward` recomputes the others from `num_rows` LM head inputs)."""
    return not enabled() or _graph_used_one_gemm(num_rows)


def _graph_used_one_gemm(num_rows: int) -> bool:
    """Whether the decode graph a batch of `num_rows` replays (SGLang pads to the smallest
    captured size that holds it) was captured with the one-GEMM layout."""
    sizes = [n for n in _GRAPH_ONE_GEMM if n >= num_rows]
    return bool(sizes) and _GRAPH_ONE_GEMM[min(sizes)]


def _check_graph_rows(logits_output, det_index: list[int]) -> None:
    """LLM42_TEST_CHECK_FP32_ROWS=1: the one-GEMM graph's deterministic rows are fp32 logits of
    their own hidden states (recomputed from the graph buffer), only less rounded."""
    if os.environ.get(CHECK_ROWS_ENV) != "1" or _FWD.head is None or _GRAPH_HIDDEN is None:
        return
    logits = logits_output.next_token_logits
    index = _index(det_index, logits.device)
    processor, lm_head = _FWD.head
    rows = fp32_matmul(_GRAPH_HIDDEN.index_select(0, index), lm_head.weight)
    check_same_rows(logits.index_select(0, index), rows[:, : logits.shape[1]])


def deterministic_rows(forward_batch) -> tuple[list[int] | None, int]:
    """Indices of the batch's deterministic rows (None: there are none), and its rows."""
    info = getattr(forward_batch, "sampling_info", None)
    if info is None or forward_batch.forward_mode.is_idle():
        return None, 0
    flags = det_rows.of(info)
    index = [i for i, is_det in enumerate(flags) if is_det]
    return index or None, len(flags)


def _rows_are_tokens(forward_batch) -> bool:
    """The LM head's rows are not one per request (input logprobs of an extend batch: every
    prompt token); then every row gets fp32."""
    return (not forward_batch.forward_mode.is_decode()) and bool(forward_batch.return_logprob)


def recompute_rows(logits_output, det_index: list[int], hidden,
                   index: torch.Tensor | None = None) -> None:
    """Overwrite the deterministic rows of `next_token_logits` [rows, V] (fp32: SGLang's bf16
    logits upcast) with fp32 logits computed from the LM head's input `hidden` [>= rows, H]."""
    logits = getattr(logits_output, "next_token_logits", None)
    if logits is None or _FWD.head is None or hidden is None:
        return  # no LM head of ours ran (LoRA / quantized head): SGLang's logits stand
    if hidden.shape[0] < logits.shape[0] or logits.dtype != torch.float32:
        raise RuntimeError(f"llm42 fp32 logits: {hidden.shape[0]} hidden rows for "
                           f"{tuple(logits.shape)} {logits.dtype} logits")
    processor, lm_head = _FWD.head
    if index is None or index.device != logits.device:
        index = _index(det_index, logits.device)
    _FWD.forced = True
    try:
        rows = processor._get_logits(hidden.index_select(0, index), lm_head, None,
                                     use_logits_buffer=False)
    finally:
        _FWD.forced = False
    if os.environ.get(CHECK_ROWS_ENV) == "1":
        check_same_rows(rows, logits.index_select(0, index))
    logits.index_copy_(0, index, rows)


def check_same_rows(fp32_rows: torch.Tensor, bf16_rows: torch.Tensor) -> None:
    """Device-side assert (no host sync) that fp32 logits [k, V] and SGLang's upcast bf16 logits
    of the same rows differ only by bf16 rounding: a row recomputed from the wrong hidden state
    (a stale or misaligned graph buffer) differs by about the logits' own size."""
    scale = bf16_rows.abs()
    limit = 0.01 * scale + 1e-3 * scale.amax(dim=1, keepdim=True) + 1e-6
    torch._assert_async(((fp32_rows - bf16_rows).abs() <= limit).all())


def _graph_buffer(hidden: torch.Tensor) -> torch.Tensor:
    """The one buffer every decode graph writes its LM head input into (sized for SGLang's
    largest decode graph, so no capture ever needs another)."""
    global _GRAPH_HIDDEN
    rows = hidden.shape[0]
    if _GRAPH_HIDDEN is None:
        capacity = max(rows, _decode_graph_rows())
        _GRAPH_HIDDEN = hidden.new_zeros((capacity, hidden.shape[1]))
    if rows > _GRAPH_HIDDEN.shape[0] or _GRAPH_HIDDEN.shape[1:] != hidden.shape[1:]:
        raise RuntimeError(f"llm42 fp32 logits: a decode graph of {tuple(hidden.shape)} rows "
                           f"exceeds the buffer {tuple(_GRAPH_HIDDEN.shape)}")
    return _GRAPH_HIDDEN


def _graph_mask(hidden: torch.Tensor) -> torch.Tensor:
    """The deterministic-row mask every one-GEMM decode graph reads, written by
    `model_forward_hook` before each decode forward (sized like `_graph_buffer`)."""
    global _GRAPH_MASK
    if _GRAPH_MASK is None:
        capacity = max(hidden.shape[0], _decode_graph_rows())
        _GRAPH_MASK = torch.zeros(capacity, dtype=torch.bool, device=hidden.device)
    if hidden.shape[0] > _GRAPH_MASK.shape[0]:
        raise RuntimeError(f"llm42 fp32 logits: a decode graph of {hidden.shape[0]} rows "
                           f"exceeds the mask {tuple(_GRAPH_MASK.shape)}")
    return _GRAPH_MASK


def _decode_graph_rows() -> int:
    try:
        from sglang.srt.runtime_context import get_server_args

        return int(get_server_args().cuda_graph_config.decode.max_bs)
    except (AttributeError, TypeError, ValueError, RuntimeError):
        return _DEFAULT_GRAPH_ROWS


def _is_plain(processor, lm_head) -> bool:
    from sglang.srt.layers.logits_processor import should_apply_lm_head_quant_method

    quant_method = getattr(lm_head, "quant_method", None)
    return (hasattr(lm_head, "weight") and not processor.use_fp32_lm_head
            and not (hasattr(lm_head, "set_lora") and hasattr(lm_head, "apply_lora"))
            and not should_apply_lm_head_quant_method(lm_head, quant_method)
            and getattr(processor, "rl_on_policy_target", None) is None)
