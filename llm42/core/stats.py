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

    def observe_decision(self, decision: VerifyDecision) -> None:
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

    def observe_step(self, kind: str, seconds: float) -> None:
        self.steps[kind] += 1
        self.step_time_s[kind] += seconds

    @property
    def recompute_pct(self) -> float:
        """Share of decoded candidates thrown away: rolled back / (verified + rolled back)."""
        total = max(1, self.verified_tokens + self.tokens_rolled_back)
        return 100.0 * self.tokens_rolled_back / total

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
            "schedule_time_s": self.schedule_time_s,
            "batch_build_time_s": self.batch_build_time_s,
            **{f"steps_{k}": v for k, v in self.steps.items()},
            **{f"step_time_{k}_s": v for k, v in self.step_time_s.items()},
        }

    def reset(self) -> None:
        fresh = Llm42Stats()
        self.__dict__.update(fresh.__dict__)
