"""`--llm42-fold-passes`: a due pass's entries ride in the padding of the next decode step.

Under the row-invariant verifier a pass entry is one decode row of an R-row forward
(`row_pass.forward_rows`), and so is every row of an inline step (`inline_verify`). A decode step
of N < R rows has R - N rows to spare once it runs as that forward, and a pass run apart costs
a whole R-row forward that stalls the batch (about 10.7 ms on the 8B shape, H100, against the
few milliseconds of padding a 40-row step to 256 rows): online, those stalls set normal
requests' ITL p99. So the jobs due now go into the next decode step instead:

    offer    (`offer`, in `hooks_verify.verify_due`, before SGLang builds the batch)  the round's
             jobs, when the coming step looks like a decode step with room for their entries:
             no prefill coming, len(running) + entries <= R
    launch   (`attach`, in `inline_verify.plan_step`, once it is built)  a decode batch that
             still has room and holds every job's request takes them; it becomes an inline step
             with riders. Otherwise nothing rides and the jobs run as a pass at the next step
             (`Llm42Runtime.fold_missed`)
    forward  (`inline_verify.run_forward`)  rows: the step's N, then the entries, then padding;
             the compared entries' logits copied out (`keep`)
    decide   (`hooks_verify.decide_folded`, at the top of the next `verify_due`)  the step's
             result processed first (`in_flight.drain`), then each job decided as after a
             pass (`verify_passes`)

An entry's bits are the same wherever it sits in the forward (rows are checked permutable at
startup), and each entry keeps its own static KV split: outputs do not change. A step with
riders is R rows anyway, so its deterministic rows whose KV is exact are verified inline too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from llm42.core.verify_round import PassPlan, job_rows, range_is_fixed, round_plans
from llm42.sglang import row_pass, runtime, verifier
from llm42.sglang.request_state import det_state


@dataclass(eq=False)
class Riders:
    """A round's jobs waiting to ride in (then riding in) a decode step."""

    reqs: list  # the jobs' requests, in the round's order
    plans: list[PassPlan]  # the round's passes (one under the row-invariant verifier)
    entries: list  # (request, position, token) of every real entry, plan after plan
    sampled: list[list]  # per plan: ((row, entry), index into entries) of its compared entries
    launched: list = field(default_factory=list)  # per plan, a `verifier.LaunchedPass`

    @property
    def tokens(self) -> list[int]:
        return [row_pass.pad_token(t) for _, _, t in self.entries]


def active(rt) -> bool:
    return bool(getattr(rt, "inline_verify", False)) and rt.config.fold_passes


def offer(rt, batch, reqs: list, prefill_coming: bool) -> bool:
    """Hold the round of `reqs` (due now) for the next decode step instead of running it as a
    pass: True when it was taken (`attach` decides whether it rides). Only a round whose every
    compared range is fixed, and not after a miss: those jobs run as a pass now, so none waits
    more than a step."""
    if rt.fold_missed:
        rt.fold_missed = False
        return False
    # the step it rides in appends a token before the decision: a range that would grow with
    # it (a partial window catching up) must be decided first, by a pass
    if not active(rt) or prefill_coming or not all(range_is_fixed(det_state(r)) for r in reqs):
        return False
    jobs = [job_rows(det_state(r), r.origin_input_ids, r.output_ids) for r in reqs]
    plans = round_plans(jobs, rt.config)
    entries, sampled = [], []
    for plan in plans:
        mine, keys = row_pass.pass_entries(plan.vpass, plan.row_owners(reqs))
        sampled.append([(key, len(entries) + i) for key, i in keys])
        entries += mine
    if len(batch.reqs) + len(entries) > rt.row_pass_rows:
        return False
    rt.riders = Riders(list(reqs), plans, entries, sampled)
    return True


def attach(rt, batch) -> Riders | None:
    """After SGLang built `batch` (None: no batch): the riders offered for it when it can take
    them: a decode batch holding each job's request, unfinished, with room for the entries, and
    each request's decode row past its entries (the step writes that row's KV apart from
    theirs). Otherwise a miss: the jobs run as a pass at the next step."""
    riders = rt.riders
    if riders is None:
        return None
    rt.riders = None
    fits = (batch is not None and batch.forward_mode.is_decode()
            and len(batch.reqs) + len(riders.entries) <= rt.row_pass_rows)
    if fits:
        rows = {id(r): i for i, r in enumerate(batch.reqs)}
        seq_lens = batch.seq_lens_cpu
        last = {}
        for req, pos, _ in riders.entries:
            last[id(req)] = max(last.get(id(req), -1), pos)
        fits = all(id(r) in rows and not r.finished()
                   and int(seq_lens[rows[id(r)]]) - 1 > last[id(r)] for r in riders.reqs)
    if not fits:
        missed(rt)
        return None
    if runtime.TIMELINE is not None:
        runtime.TIMELINE.observe_fold(len(riders.entries))
    return riders


def missed(rt) -> None:
    """An inline step planned with riders ran otherwise: its jobs run as a pass next step."""
    rt.fold_missed = True
    rt.stats.observe_fold(False)


def keep(rt, riders: Riders, logits: torch.Tensor, first: int, graphed: bool,
         seconds: float) -> None:
    """After the step's forward: the compared entries' logits (its rows from `first` on),
    copied before the next forward or SGLang's sampler touches the buffer; the jobs are decided
    at the next `verify_due`, once this step's result is processed (`Llm42Runtime.folded`)."""
    for plan, sampled in zip(riders.plans, riders.sampled):
        logits_of = None
        if sampled:
            index = verifier.to_device([first + i for _, i in sampled], torch.int64,
                                       logits.device)
            logits_of = logits.index_select(0, index).float()
        riders.launched.append(verifier.LaunchedPass(
            plan.vpass, plan.row_owners(riders.reqs), [key for key, _ in sampled], logits_of,
            graphed, seconds))
    for req in riders.reqs:
        state = det_state(req)
        if state.is_prompt_pending:
            rt.stats.observe_cached_prompt(state.num_cached_prompt_tokens)
    rt.stats.observe_fold(True)
    rt.folded = riders
