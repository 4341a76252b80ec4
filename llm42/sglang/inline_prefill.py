"""Inline prompt rows (`--llm42-inline-verify`): a prefill whose deterministic prompts are
verified by the same forward, with no prompt pass, no drain and no wait.

A prompt pass replays a prompt as decode rows of R-row forwards (`row_pass`) after its fast-path
prefill, whose KV and o_0 it verifies. It is launched from the scheduler, so it waits for the
result in flight (a drain) and stalls the batch, and until it runs the request's decode steps
cannot be inline. Here the prefill's forward runs those very rows itself, right after SGLang's
extend, on the same stream:

    launch   (`plan`, after SGLang built the prefill batch)  a deterministic request whose prompt
             is verified (`verify_prompt`) and whose KV before its chunk is exact
             (`Llm42Req.exact_kv`, or a verified prefix-cache match) gives its chunk's tokens as
             row entries; its exact KV becomes the chunk's end
    forward  (`run_forward`, ModelRunner.forward)  SGLang's extend, then the entries as row-pass
             forwards of R rows: they overwrite the chunk's KV with the verifier's bits, and the
             last prompt token's logits (the verifier's for o_0) replace the extend's for that
             request, so SGLang samples o_0 from them
    result   (`inline_verify.sample_step`, before SGLang processes the prefill)  the verifier's
             sampling of those logits
    arrival  (`inline_verify.on_token`)  o_0 equals it: prompt and o_0 verified
             (`DetRequestState.verify_prompt_on_arrival`); else a prompt pass decides as before

The entries are the ones a prompt pass would run (same tokens, positions and prefix KV, and a
row's bits do not depend on the other rows of its forward), so outputs do not change. The cost is
the prompt's rows once, as for a pass, without the pass's drain; the request's first decode step
(launched before its prefill's result is processed) is inline too, since its KV is exact.
`--no-llm42-inline-prefill` verifies prompts by passes again (switchable at runtime).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from llm42.sglang import fp32_logits, prefill_faults, row_pass, runtime, verifier, verify_logits
from llm42.sglang.request_state import of

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import ScheduleBatch

@dataclass(eq=False)
class PrefillStep:
    """One prefill whose deterministic prompt chunks run their rows inline."""

    batch: ScheduleBatch  # the prefill batch (the row forwards' template, as a pass's)
    reqs: list  # its requests at launch, in row order
    entries: list[tuple[object, int, int]]  # (request, position, token) row entries, in order
    claimed: list[tuple[object, int, int]]  # (request, start, end): the chunks it makes exact
    # (batch row, request, output index 0) of each request whose last prompt token is an entry
    eligible: list[tuple[int, object, int]] = field(default_factory=list)
    positions: dict[int, int] = field(default_factory=dict)  # batch row -> last entry's position
    last_entries: list[int] = field(default_factory=list)  # entry index of each eligible row
    # entry index of the last token of each batch row's chunk (claimed rows only)
    row_last: dict[int, int] = field(default_factory=dict)
    checked: list[int] = field(default_factory=list)  # eligible rows sampled again (`checked`)
    logits: torch.Tensor | None = None  # [len(checked), vocab] fp32: those rows' logits


def checked(eligible: list) -> list[int]:
    """Indices of the `eligible` rows (row, request, output index) that the verifier samples
    again: those whose logits something adjusts before the Sampler (`verify_logits.adjusts`).
    SGLang samples every eligible row from the verifier's logits with the Sampler the verifier
    uses (per-row kinds and seeds, `group_sampling`), so the others' tokens and logprobs are the
    verifier's by construction, and their logits need no copy."""
    return [j for j, (_, req, _) in enumerate(eligible) if verify_logits.adjusts(req)]


def plan(rt, batch) -> PrefillStep | None:
    """After SGLang built the prefill `batch`: the prompt chunks whose rows run in its forward.
    Every other deterministic request of the batch gets fast-path KV: its exact KV is unknown."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    inline = rt.config.inline_prefill and batch.forward_mode == ForwardMode.EXTEND
    step = PrefillStep(batch, list(batch.reqs), [], [])
    for i, req in enumerate(batch.reqs):
        fields = of(req)
        if fields is None or fields.det is None:
            continue
        state = fields.det
        start = batch.prefix_lens[i]
        end = start + batch.extend_lens[i]
        exact = fields.exact_kv
        if exact is None and start == state.num_cached_prompt_tokens:
            exact = start  # a verified prefix-cache match (or none): exact so far
        if not (inline and state.verify_prompt and state.num_output_tokens == 0
                and not req.output_ids and exact == start):
            fields.exact_kv = None
            continue
        if fields.exact_kv is None and start:
            rt.stats.observe_cached_prompt(start)  # verified rows the cache gave: not replayed
        tokens = req.full_untruncated_fill_ids[start:end]
        step.entries += [(req, p, t) for p, t in zip(range(start, end), tokens)]
        step.claimed.append((req, start, end))
        step.row_last[i] = len(step.entries) - 1
        fields.exact_kv = end
        if end == len(req.origin_input_ids):  # the last chunk: its last row predicts o_0
            step.eligible.append((i, req, 0))
            step.positions[i] = end - 1
            step.last_entries.append(len(step.entries) - 1)
    return step if step.entries else None


def rows_only(step: PrefillStep, forward_batch) -> bool:
    """Every request of the prefill runs its whole chunk as rows and nothing but next-token
    logits is asked of the forward (no prompt logprobs, no hidden states; output logprobs come
    from the sampler): SGLang's extend would only compute KV the rows overwrite."""
    mode = forward_batch.capture_hidden_mode
    if len(step.row_last) != len(step.reqs) or (mode is not None and mode.need_capture()):
        return False
    if not forward_batch.return_logprob:
        return True
    starts, lens = forward_batch.extend_logprob_start_lens_cpu, forward_batch.extend_seq_lens_cpu
    return starts is not None and lens is not None and all(
        s >= n for s, n in zip(starts, lens, strict=True))


def run_forward(step: PrefillStep, original, model_runner, forward_batch, *args, **kwargs):
    """SGLang's extend (unless `rows_only`), then the step's entries as row-pass forwards; o_0's
    logits of each eligible request replaced by the verifier's."""
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput
    from sglang.srt.model_executor.model_runner import ModelRunnerOutput

    out = None
    if not rows_only(step, forward_batch):
        out = fp32_logits.model_forward_hook(original, model_runner, forward_batch, *args,
                                             **kwargs)
    rt = runtime.RUNTIME
    started = time.perf_counter()
    if prefill_faults.enabled() and out is not None:  # tests: the rows must replace the
        for req, start, end in step.claimed:  # fast path's KV
            prefill_faults.perturb_kv(rt.scheduler, req, start, end)
    # the logits kept: each eligible row's o_0 (the verifier's), then, without the extend, the
    # last token's of every row (what SGLang samples from, a mid-prompt chunk's token unused)
    kept = step.last_entries + ([] if out is not None else
                                [step.row_last[i] for i in range(len(step.reqs))])
    logits = _run_rows(rt, step.batch, step.entries, kept, forward_batch.input_ids.device)
    rt.stats.observe_inline_prefill(len(step.entries), time.perf_counter() - started,
                                    rows_only=out is None)
    num_eligible = len(step.last_entries)
    o_0 = logits[:num_eligible] if num_eligible else None
    if out is None:
        logits_output = LogitsProcessorOutput(next_token_logits=logits[num_eligible:])
        out = ModelRunnerOutput(logits_output=logits_output, can_run_graph=False)
    elif num_eligible:
        logits_output = out.logits_output
        merged = logits_output.next_token_logits.to(torch.float32, copy=True)
        index = verifier.to_device([i for i, _, _ in step.eligible], torch.int64, merged.device)
        merged.index_copy_(0, index, o_0)
        logits_output.next_token_logits = merged
    if num_eligible:
        step.checked = checked(step.eligible)
        if step.checked:
            step.logits = o_0.index_select(
                0, verifier.to_device(step.checked, torch.int64, o_0.device))
        out.logits_output.llm42_inline = step
    return out


def _run_rows(rt, batch, entries: list, kept: list[int], device) -> torch.Tensor | None:
    """`entries` as the verifier's decode-row forwards of R rows; the fp32 logits of the
    entries at `kept`, in that order (None when none)."""
    logits, _ = row_pass.entry_logits(rt.scheduler, batch, entries, kept, rt.row_pass_rows,
                                      device)
    return logits
