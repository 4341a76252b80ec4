"""The whole soak against a running server: references alone, the load, the drain and its leak
checks, the rechecks; every failed check collected, none raised.

    result = run_soak(url, SoakConfig(), server=server)   # server: its SGLangServer, or None
    result.passed, result.failures, result.figures
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from benchmarks.env_info import host_load_avg
from benchmarks.server_state import (
    LoadPoller,
    get_json,
    is_idle,
    llm42_stats,
    server_load,
    wait_idle,
)
from benchmarks.soak.check import evaluate, leak_checks
from benchmarks.soak.client import run_requests, take_references
from benchmarks.soak.compare import compare_full
from benchmarks.soak.plan import DetSpec, SoakConfig, build_plan
from benchmarks.soak.responses import Outcome

STAT_KEYS = ("verify_passes", "verified_tokens", "rollbacks", "tokens_rolled_back",
             "injected_mismatches", "inconsistent_tokens", "det_requests_finished",
             "retraction_restarts")


@dataclass
class SoakResult:
    figures: dict
    failures: list[str]
    outcomes: list[Outcome]
    references: dict[int, dict]
    checks: dict = field(default_factory=dict)
    specs: list[DetSpec] = field(default_factory=list)
    stats_before: dict | None = None
    stats_after: dict | None = None

    @property
    def passed(self) -> bool:
        return not self.failures


def _check_ready(url: str, cfg: SoakConfig) -> dict | None:
    """Raises RuntimeError when the soak cannot start: server down, llm42 off, not idle."""
    code, _ = get_json(url + "/health", timeout=60)
    if code != 200:
        raise RuntimeError(f"{url}/health answered {code}; is the server up?")
    stats = llm42_stats(url)
    if not (stats or {}).get("enabled"):
        raise RuntimeError(f"{url}/llm42_stats says {stats}: start the server with "
                           "--enable-llm42")
    load = wait_idle(url, cfg.drain_timeout)
    if not is_idle(load):
        raise RuntimeError(f"server not idle before the soak ({load}): references would not "
                           "be taken alone")
    return stats


def _recheck(url: str, cfg: SoakConfig, specs: list[DetSpec],
             references: dict[int, dict]) -> tuple[int, list[str]]:
    """The specs alone again after the soak: the server is still deterministic."""
    rechecked = asyncio.run(take_references(url, specs, cfg.request_timeout,
                                            f"{cfg.run_tag}-recheck"))
    identical, failures = 0, []
    for spec, out in zip(specs, rechecked):
        diff = (compare_full(references[spec.spec_id], out.output) if out.completed
                else f"status {out.status} error {out.error!r}")
        if diff:
            failures.append(f"recheck {spec.label} after the soak: {diff}")
        else:
            identical += 1
    return identical, failures


def run_soak(url: str, cfg: SoakConfig, server=None, log=print) -> SoakResult:
    """The whole soak against a running server (`server`: its SGLangServer, whose process must
    still be alive at the end and whose log must not show leaks or tracebacks written during the
    soak). Raises RuntimeError only when the soak cannot start (server down, llm42 off, not
    idle); every failed check is in `.failures`."""
    url = url.rstrip("/")
    failures: list[str] = []
    t_start = time.perf_counter()
    load_avg_start = host_load_avg()
    stats_before = _check_ready(url, cfg)
    plan = build_plan(cfg)
    log_start = len(server.log_text()) if server is not None else 0

    t0 = time.perf_counter()
    refs_out = asyncio.run(take_references(url, plan.specs, cfg.request_timeout,
                                           f"{cfg.run_tag}-ref"))
    t_ref = time.perf_counter() - t0
    references: dict[int, dict] = {}
    for spec, ref in zip(plan.specs, refs_out):
        if ref.completed and ref.num_tokens() > 0:
            references[spec.spec_id] = ref.output
        else:
            finish = (ref.output or {}).get("finish")
            failures.append(f"reference {spec.label}: status {ref.status} error "
                            f"{ref.error_code} {ref.error!r} finish {finish}")
    log(f"[soak] {len(plan.specs)} references taken alone in {t_ref:.1f} s; "
        f"{len(plan.requests)} requests at concurrency {cfg.concurrency}")

    t0 = time.perf_counter()
    poller = LoadPoller(url)

    async def load_phase():
        poll = asyncio.create_task(poller.run())
        try:
            return await run_requests(url, plan.requests, cfg.concurrency, cfg.request_timeout,
                                      progress=cfg.progress)
        finally:
            poller.stop()
            await poll

    outcomes = asyncio.run(load_phase())
    t_load = time.perf_counter() - t0

    # drain, then the leak checks
    t0 = time.perf_counter()
    idle = wait_idle(url, cfg.drain_timeout)
    t_drain = time.perf_counter() - t0
    time.sleep(cfg.idle_settle_s)  # idle scheduler iterations, each running the leak check
    health, _ = get_json(url + "/health", timeout=60)
    load_idle = server_load(url)
    stats_after = llm42_stats(url)
    checks = {"idle_after_drain": is_idle(idle), "load_at_idle": load_idle,
              "health_after_drain": health,
              "server_process_alive": server.is_running() if server is not None else None,
              "kv_used_tokens_at_idle": (load_idle or {}).get("used_tokens"),
              "drain_s": round(t_drain, 2),
              "host_load_avg_1m": [load_avg_start, host_load_avg()]}
    new_log = server.log_text()[log_start:] if server is not None else None
    leaks = checks["leaks"] = leak_checks(checks, cfg.drain_timeout, new_log)
    failures += [f"leak: {x}" for x in leaks]

    recheck_specs = [s for s in plan.specs if s.spec_id in references][: cfg.recheck]
    t0 = time.perf_counter()
    recheck_identical = 0
    if recheck_specs and health == 200:
        recheck_identical, recheck_failures = _recheck(url, cfg, recheck_specs, references)
        failures += recheck_failures
    t_recheck = time.perf_counter() - t0
    final_health, _ = get_json(url + "/health", timeout=60)
    if final_health != 200:
        failures.append(f"/health answered {final_health} after the recheck")

    figures, request_failures = evaluate(plan, outcomes, references)
    failures = request_failures + failures
    delta = {k: (stats_after or {}).get(k, 0) - (stats_before or {}).get(k, 0)
             for k in STAT_KEYS if k in (stats_after or {})}
    if delta.get("inconsistent_tokens", 0):
        failures.append(f"llm42 counted {delta['inconsistent_tokens']} inconsistent tokens "
                        "(re-verified entries that disagree with committed ones)")
    figures.update(
        rollbacks=delta.get("rollbacks"), tokens_rolled_back=delta.get("tokens_rolled_back"),
        injected_mismatches=delta.get("injected_mismatches"),
        verify_passes=delta.get("verify_passes"),
        inconsistent_tokens=delta.get("inconsistent_tokens"),
        leaks=len(leaks), kv_used_tokens_at_idle=checks["kv_used_tokens_at_idle"],
        recheck=len(recheck_specs), recheck_identical=recheck_identical,
        peak_running_reqs=poller.peak["running"], peak_waiting_reqs=poller.peak["waiting"],
        peak_kv_used_tokens=poller.peak["used_tokens"],
        reference_s=round(t_ref, 2), load_s=round(t_load, 2), recheck_s=round(t_recheck, 2),
        duration_s=round(time.perf_counter() - t_start, 2),
        failures=len(failures))
    figures["requests_per_s"] = round(len(outcomes) / max(t_load, 1e-9), 2)
    return SoakResult(figures, failures, outcomes, references, checks, plan.specs, stats_before,
                      stats_after)
