"""Per-scheduler-process llm42 state: config, statistics, fault injector, metrics.

One SGLang scheduler runs per process (per TP rank / DP replica), so a module-level instance is
the simplest owner; hooks on frozen SGLang dataclasses (the batch result processor) reach it here.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from llm42.core.config import Llm42Config, ModeSwitchBusy, with_benchmark_mode
from llm42.core.injection import MismatchInjector
from llm42.core.rank_ledger import DecisionLedger
from llm42.core.stats import Llm42Stats
from llm42.core.timeline import StepTimeline
from llm42.sglang import hook_times, sync_sites

if TYPE_CHECKING:
    from sglang.srt.managers.scheduler import Scheduler

logger = logging.getLogger(__name__)

RUNTIME: Llm42Runtime | None = None
# --llm42-timeline-dir, with or without --enable-llm42: a baseline server (plain SGLang,
# --enable-deterministic-inference) records the same step timeline as an llm42 one.
TIMELINE: StepTimeline | None = None
# True only while the verification forward runs (read by the LogitsMetadata hook).
IN_VERIFY_PASS = False
# With a timeline: host seconds inside ModelRunner.forward since the last record closed
# (`inline_verify.model_forward_hook`, outermost calls only), a record's `forward_s`.
FORWARD_S = [0.0]


def take_forward_s() -> float:
    seconds, FORWARD_S[0] = FORWARD_S[0], 0.0
    return seconds


class Llm42Runtime:
    def __init__(self, scheduler: Scheduler, config: Llm42Config,
                 unproven_backend: str | None = None, row_pass_rows: int | None = None):
        self.scheduler = scheduler
        self.config = config
        # Rows of each row-invariant pass forward on this device (None: fixed-shape passes).
        self.row_pass_rows = row_pass_rows
        # --llm42-inline-verify in effect (`inline_verify`): not with speculative steps (their
        # verify forwards are not decode rows) nor DP attention (rows gathered across ranks).
        server_args = getattr(scheduler, "server_args", None)
        self.inline_verify = (config.uses_inline_verify and row_pass_rows is not None
                              and getattr(server_args, "speculative_algorithm", None) is None
                              and not getattr(server_args, "enable_dp_attention", False))
        # An attention backend without a determinism proof, started with
        # --llm42-allow-unproven-backend (see backend_gate); None: every backend is proven.
        self.unproven_backend = unproven_backend
        self.stats = Llm42Stats()
        # This rank's decisions, compared with its TP peers' in /llm42_stats (`tp_share`).
        self.ledger = DecisionLedger()
        ps = getattr(scheduler, "ps", None)
        self.tp_rank = getattr(ps, "tp_rank", 0)
        self.tp_size = getattr(server_args, "tp_size", 1) or 1
        self.dp_rank = getattr(ps, "dp_rank", None) or 0
        self.injector = MismatchInjector(config.inject_mismatch_rate, config.seed)
        self.vocab_size = scheduler.model_config.vocab_size
        self.prefer_det_prefill = True  # alternates deterministic and normal prefill batches
        self.decode_step = 0  # decode batches processed; measures how long full windows wait
        self.pass_paths: set[bool] = set()  # graphed (True) / eager (False) passes seen
        self.overlap = bool(getattr(scheduler, "enable_overlap", False))
        self.step_started: float | None = None  # when the running scheduler iteration began
        self.step_kind: str | None = None  # kind of the batch it launched (None: idle)
        self.mode_refusal: dict | None = None  # why the last benchmark-mode switch was refused
        # --llm42-fold-passes (`fold_pass`): a round offered to the decode step being built,
        # the round that rode in the last step (decided before the next is built), and whether
        # the last offer missed its step (its jobs then run as a pass)
        self.riders = None
        self.folded = None
        self.fold_missed = False
        self.metrics = None
        if getattr(scheduler, "enable_metrics", False):
            from llm42.sglang.metrics import Llm42Metrics

            self.metrics = Llm42Metrics()

    def switch_benchmark_mode(self, mode: dict, num_det_in_flight: int = 0) -> bool:
        """POST /llm42_benchmark_mode: the settings of `BENCHMARK_MODE_FIELDS` from the next
        decision on; the injector starts its seeded sequence again, so each run
        injects the same way. A refusal is logged and kept, with its reason, in
        `mode_refusal` (read back by the endpoint through the stats snapshot)."""
        try:
            config = with_benchmark_mode(
                self.config, mode, getattr(self.scheduler.model_config, "context_len", None),
                num_det_in_flight)
        except (ValueError, PermissionError, ModeSwitchBusy) as exc:
            logger.warning("llm42 benchmark mode %r refused: %s", mode, exc)
            self.mode_refusal = {"busy": isinstance(exc, ModeSwitchBusy), "message": str(exc)}
            return False
        if (config.window_size, config.verify_batch_size) != (self.config.window_size,
                                                               self.config.verify_batch_size):
            # Whether a pass replays a CUDA graph depends on its B x W tokens: a path per shape.
            self.pass_paths.clear()
        self.config, self.mode_refusal = config, None
        self.injector = MismatchInjector(config.inject_mismatch_rate, config.seed)
        logger.info("llm42 benchmark mode: skip compare %s, inject mismatch rate %.3f, window "
                    "%d, verify batch %d, max verify wait %d, overlap verify %s",
                    config.skip_compare, config.inject_mismatch_rate, config.window_size,
                    config.verify_batch_size, config.verify_wait_steps, config.overlap_verify)
        return True

    def snapshot(self) -> dict:
        snap = self.stats.snapshot()
        snap.update(self.config.echo())  # every setting, as resolved
        snap.update(
            enabled=True,
            overlap_schedule=self.overlap,
            benchmark_mode_refusal=self.mode_refusal,
            unproven_backend=self.unproven_backend,
            row_pass_rows=self.row_pass_rows,
            inline_verify=self.inline_verify,  # in effect (the flag, less what this server lacks)
            timeline=timeline_path(),
            rank_ledgers=[self.ledger_entry()],  # every TP rank's: `tp_share.gather_ledgers`
        )
        return snap

    def ledger_entry(self) -> dict:
        return {"dp_rank": self.dp_rank, "tp_rank": self.tp_rank, **self.ledger.snapshot()}


def install_timeline(folder: str | Path) -> StepTimeline:
    """One file per scheduler process: DP ranks and restarts never share a file."""
    global TIMELINE
    path = Path(folder) / f"timeline-{os.getpid()}.jsonl"
    logger.info("llm42 step timeline: %s", path)
    TIMELINE = StepTimeline(path)
    TIMELINE.add_counter("forward_s", take_forward_s)
    sites = sync_sites.install(folder)
    if sites is not None:  # LLM42_SYNC_DEBUG=1: a diagnostic, see sync_sites
        logger.info("llm42: counting synchronizing CUDA calls into %s", sites.path)
        TIMELINE.add_counter("syncs", sites.take)
        TIMELINE.on_flush.append(sites.write)
    if hook_times.enabled():  # LLM42_HOOK_TIMES=1: a diagnostic, see hook_times
        hooks_path = Path(folder) / f"hooks-{os.getpid()}.json"
        logger.info("llm42: hooks' own host time into %s", hooks_path)
        TIMELINE.add_counter("hook_s", hook_times.take)
        TIMELINE.on_close.append(hook_times.attribute)
        TIMELINE.on_flush.append(lambda: hook_times.write(hooks_path))
    return TIMELINE


def timeline_path() -> str | None:
    return str(TIMELINE.path) if TIMELINE is not None else None


def install(scheduler: Scheduler, config: Llm42Config,
            unproven_backend: str | None = None, row_pass_rows: int | None = None) -> Llm42Runtime:
    global RUNTIME
    RUNTIME = Llm42Runtime(scheduler, config, unproven_backend, row_pass_rows)
    if unproven_backend is not None:
        logger.warning("llm42 runs on attention backend %s, which has no determinism proof "
                       "(--llm42-allow-unproven-backend): deterministic requests may depend on "
                       "their batch mates", unproven_backend)
    logger.info(
        "llm42 enabled: window %d, verify batch %d, max verify wait %d, inject mismatch rate "
        "%.3f%s",
        config.window_size,
        config.verify_batch_size,
        config.verify_wait_steps,
        config.inject_mismatch_rate,
        ", skip compare" if config.skip_compare else "",
    )
    return RUNTIME
