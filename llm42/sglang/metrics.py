"""Prometheus counters for llm42 (exported with SGLang's own metrics under --enable-metrics)."""

from __future__ import annotations


class Llm42Metrics:
    def __init__(self):
        from prometheus_client import Counter

        self.passes = Counter("llm42_verify_passes", "Verification passes run")
        self.rows = Counter("llm42_verify_rows", "Real rows verified")
        self.padded_rows = Counter("llm42_padded_rows", "Dummy rows padding verification passes")
        self.verify_seconds = Counter("llm42_verify_seconds", "Time spent in verification passes")
        self.verified_tokens = Counter("llm42_verified_tokens", "Tokens committed by verification")
        self.rollbacks = Counter("llm42_rollbacks", "Windows that ended in a rollback")
        self.rolled_back = Counter("llm42_tokens_rolled_back", "Candidate tokens discarded")

    def observe_pass(self, num_real_rows: int, num_pad_rows: int, seconds: float) -> None:
        self.passes.inc()
        self.rows.inc(num_real_rows)
        self.padded_rows.inc(num_pad_rows)
        self.verify_seconds.inc(seconds)

    def observe_decision(self, decision) -> None:
        self.verified_tokens.inc(decision.num_committed)
        if decision.is_rollback:
            self.rollbacks.inc()
            self.rolled_back.inc(decision.num_rejected)
