"""Engine-wide llm42 counters, fed by ``observe_*()`` calls, read as a flat dict.

    stats.observe_pass(verify_pass.num_real_rows, verify_pass.num_pad_rows, seconds)
    stats.observe_decision(decision); stats.snapshot()["recompute_pct"]

Pad rows only ever reach ``padded_rows``: they never count as verified rows or tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llm42.core.decision import VerifyDecision

# Scheduler iterations by the batch they ran, for the step profile in /llm42_stats.
STEP_KINDS = ("decode", "prefill", "det_prefill")
TOP_K_ALL = 1 << 30  # SGLang's top_k for "no top-k" (its SamplingParams normalizes -1 to it)


def sampling_kind(temperature: float, top_p: float, top_k: int, min_p: float) -> str:
    """A request's sampling kind as the stats name it: "greedy", "temperature" (no truncation)
    or the truncations it uses joined by "+" ("top_k", "top_p", "min_p", "top_k+top_p", ...).

    Values as SGLang normalizes them: greedy is top_k <= 1 (temperature 0 becomes top_k 1)."""
    if top_k <= 1 or temperature <= 0:
        return "greedy"
    parts = [name for name, on in (("top_k", top_k < TOP_K_ALL), ("top_p", top_p < 1.0),
                                   ("min_p", min_p > 0)) if on]
    return "+".join(parts) or "temperature"


@dataclass(eq=False)
class KindStats:
    """Verification outcomes of one sampling kind's windows (prompt decisions included)."""

    decisions: int = 0
    rollbacks: int = 0
    verified_tokens: int = 0
    tokens_rolled_back: int = 0

    def observe(self, decision: VerifyDecision) -> None:
        self.decisions += 1
        self.verified_tokens += decision.num_committed
        if decision.is_rollback:
            self.rollbacks += 1
            self.tokens_rolled_back += decision.num_rejected

    def snapshot(self) -> dict[str, int | float]:
        return {"decisions": self.decisions, "rollbacks": self.rollbacks,
                "verified_tokens": self.verified_tokens,
                "tokens_rolled_back": self.tokens_rolled_back,
                "recompute_pct": recompute_pct(self.verified_tokens, self.tokens_rolled_back)}


def recompute_pct(verified_tokens: int, tokens_rolled_back: int) -> float:
    """Share of decoded candidates thrown away: rolled back / (verified + rolled back)."""
    return 100.0 * tokens_rolled_back / max(1, verified_tokens + tokens_rolled_back)


@dataclass(eq=False)
class Llm42Stats:
    verify_passes: int = 0
    graphed_passes: int = 0
    verify_rows: int = 0  # real rows only
    prompt_rows: int = 0  # of those, rows replaying a prompt (--llm42-batched-prefill)
    cached_prompt_tokens: int = 0  # prompt tokens whose verified KV came from the prefix cache
    padded_rows: int = 0
    verified_tokens: int = 0  # committed through verification: accepted + corrected tokens
    rollbacks: int = 0
    tokens_rolled_back: int = 0
    injected_mismatches: int = 0
    inconsistent_tokens: int = 0
    verify_time_s: float = 0.0
    det_requests_finished: int = 0
    retraction_restarts: int = 0  # deterministic requests retracted and restarted from the prompt
    early_results: int = 0  # overlap loop: in-flight results processed early so a pass could run
    overlapped_passes: int = 0  # passes queued before that result was processed (overlap_verify)
    drain_time_s: float = 0.0  # waiting for and processing those early results
    # --llm42-max-pass-rows-per-step: steps whose row budget held due jobs back, and those jobs
    # (a job held back over three steps counts three times).
    row_capped_steps: int = 0
    row_cap_deferred_jobs: int = 0
    # --llm42-inline-verify: decode steps run as one row-invariant forward, the tokens they
    # verified as they were made, and the inline tokens the verifier's sampling disagreed with
    # (left to a pass; on one server's forward this should never happen).
    inline_steps: int = 0
    inline_verified_tokens: int = 0
    inline_misses: int = 0
    # decode steps with such rows that decoded as usual: too much padding (--llm42-inline-pad-ratio)
    inline_declined_steps: int = 0
    # of the inline steps, ones SGLang runs at R rows (exactly R, or padded to R by its decode
    # graph): SGLang's own forward in pass mode, no second batch built
    inline_own_forward_steps: int = 0
    # host time of inline steps: launching the row-invariant forward (batch, metadata, graph
    # replay; the GPU runs on), and the verifier's sampling of their rows (waits for its kernels)
    inline_launch_time_s: float = 0.0
    inline_sample_time_s: float = 0.0
    # prefills whose deterministic prompts ran their rows in the same forward (`inline_prefill`):
    # those steps, the prompt rows they ran, the prompts (with o_0) verified on arrival and the
    # host time of launching their rows
    inline_prefill_steps: int = 0
    inline_prefill_rows: int = 0
    inline_prefill_prompts: int = 0
    inline_prefill_time_s: float = 0.0
    inline_prefill_rows_only: int = 0  # of those steps, ones whose every row was such a prompt's:
    # SGLang's extend skipped (the rows write all its KV)
    # --llm42-fold-passes: passes whose entries rode in a decode step's padding (counted in
    # verify_passes too), and rounds offered to the next step that it could not take (they ran
    # as passes a step later)
    folded_passes: int = 0
    fold_missed: int = 0
    # Time inside the scheduler's next-batch step, between the iterations the step profile
    # counts: verification passes, the results drained for them, SGLang building the batch.
    schedule_time_s: float = 0.0
    # Of it, SGLang's own get_next_batch_to_run, which plain SGLang pays too: the rest of the
    # step (schedule - passes - drains - this) is llm42's own host work around the passes.
    batch_build_time_s: float = 0.0
    # Wall time of scheduler iterations by batch kind, verification passes excluded (exact with
    # the normal loop; with the overlap loop an iteration also waits for the previous batch).
    steps: dict = field(default_factory=lambda: dict.fromkeys(STEP_KINDS, 0))
    step_time_s: dict = field(default_factory=lambda: dict.fromkeys(STEP_KINDS, 0.0))
    # Decisions by the sampling kind of their request (`sampling_kind`): where rollbacks come from.
    by_kind: dict[str, KindStats] = field(default_factory=dict)

    def observe_pass(self, num_real_rows: int, num_pad_rows: int, seconds: float,
                     num_prompt_rows: int = 0, graphed: bool = False) -> None:
        """`graphed`: the pass replayed a CUDA graph (SGLang's prefill graphs) instead of running
        eagerly; a pass's cost is mostly the eager forward's fixed overhead."""
        self.verify_passes += 1
        self.graphed_passes += int(graphed)
        self.verify_rows += num_real_rows
        self.prompt_rows += num_prompt_rows
        self.padded_rows += num_pad_rows
        self.verify_time_s += seconds

    def observe_decision(self, decision: VerifyDecision, kind: str | None = None) -> None:
        """`kind`: the request's `sampling_kind`, for the per-kind split."""
        if kind is not None:
            self.by_kind.setdefault(kind, KindStats()).observe(decision)
        self.verified_tokens += decision.num_committed
        self.inconsistent_tokens += decision.num_inconsistent
        if decision.is_rollback:
            self.rollbacks += 1
            self.tokens_rolled_back += decision.num_rejected
        if decision.injected:
            self.injected_mismatches += 1

    def observe_cached_prompt(self, num_tokens: int) -> None:
        self.cached_prompt_tokens += num_tokens

    def observe_finished(self) -> None:
        self.det_requests_finished += 1

    def observe_restart(self) -> None:
        self.retraction_restarts += 1

    def observe_early_result(self, seconds: float = 0.0) -> None:
        self.early_results += 1
        self.drain_time_s += seconds

    def observe_schedule(self, seconds: float, build_seconds: float = 0.0) -> None:
        self.schedule_time_s += seconds
        self.batch_build_time_s += build_seconds

    def observe_overlapped_passes(self, num_passes: int) -> None:
        self.overlapped_passes += num_passes

    def observe_row_cap(self, num_deferred_jobs: int) -> None:
        """A step's round ran with `num_deferred_jobs` due jobs held back by the row budget."""
        self.row_capped_steps += int(num_deferred_jobs > 0)
        self.row_cap_deferred_jobs += num_deferred_jobs

    def observe_inline_step(self, launch_seconds: float = 0.0, own_forward: bool = False) -> None:
        self.inline_steps += 1
        self.inline_own_forward_steps += int(own_forward)
        self.inline_launch_time_s += launch_seconds

    def observe_inline_sample(self, seconds: float) -> None:
        self.inline_sample_time_s += seconds

    def observe_inline_prefill(self, rows: int, launch_seconds: float,
                               rows_only: bool = False) -> None:
        self.inline_prefill_steps += 1
        self.inline_prefill_rows_only += int(rows_only)
        self.inline_prefill_rows += rows
        self.inline_prefill_time_s += launch_seconds

    def observe_inline_prompt(self) -> None:
        self.inline_prefill_prompts += 1

    def observe_fold(self, folded: bool) -> None:
        """A round offered to the next decode step: it rode there (`folded`) or missed it."""
        self.folded_passes += int(folded)
        self.fold_missed += int(not folded)

    def observe_inline_declined(self) -> None:
        self.inline_declined_steps += 1

    def observe_inline_token(self, verified: bool) -> None:
        self.inline_verified_tokens += int(verified)
        self.inline_misses += int(not verified)

    def observe_step(self, kind: str, seconds: float) -> None:
        self.steps[kind] += 1
        self.step_time_s[kind] += seconds

    @property
    def recompute_pct(self) -> float:
        return recompute_pct(self.verified_tokens, self.tokens_rolled_back)

    def snapshot(self) -> dict[str, int | float]:
        return {
            "verify_passes": self.verify_passes,
            "graphed_passes": self.graphed_passes,
            "verify_rows": self.verify_rows,
            "prompt_rows": self.prompt_rows,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "padded_rows": self.padded_rows,
            "verified_tokens": self.verified_tokens,
            "rollbacks": self.rollbacks,
            "tokens_rolled_back": self.tokens_rolled_back,
            "injected_mismatches": self.injected_mismatches,
            "inconsistent_tokens": self.inconsistent_tokens,
            "recompute_pct": self.recompute_pct,
            "verify_time_s": self.verify_time_s,
            "det_requests_finished": self.det_requests_finished,
            "retraction_restarts": self.retraction_restarts,
            "early_results": self.early_results,
            "overlapped_passes": self.overlapped_passes,
            "drain_time_s": self.drain_time_s,
            "row_capped_steps": self.row_capped_steps,
            "row_cap_deferred_jobs": self.row_cap_deferred_jobs,
            "inline_steps": self.inline_steps,
            "inline_verified_tokens": self.inline_verified_tokens,
            "inline_misses": self.inline_misses,
            "inline_declined_steps": self.inline_declined_steps,
            "inline_own_forward_steps": self.inline_own_forward_steps,
            "inline_launch_time_s": self.inline_launch_time_s,
            "inline_sample_time_s": self.inline_sample_time_s,
            "inline_prefill_steps": self.inline_prefill_steps,
            "inline_prefill_rows": self.inline_prefill_rows,
            "inline_prefill_prompts": self.inline_prefill_prompts,
            "inline_prefill_time_s": self.inline_prefill_time_s,
            "inline_prefill_rows_only": self.inline_prefill_rows_only,
            "folded_passes": self.folded_passes,
            "fold_missed": self.fold_missed,
            "schedule_time_s": self.schedule_time_s,
            "batch_build_time_s": self.batch_build_time_s,
            **{f"steps_{k}": v for k, v in self.steps.items()},
            **{f"step_time_{k}_s": v for k, v in self.step_time_s.items()},
            "by_sampling_kind": {k: v.snapshot() for k, v in sorted(self.by_kind.items())},
        }

    def reset(self) -> None:
        fresh = Llm42Stats()
        self.__dict__.update(fresh.__dict__)
