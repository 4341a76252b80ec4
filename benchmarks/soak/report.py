"""The soak's summary: one JSONL row (config, figures, checks, llm42 counters, failures) and
its Markdown figures table.

    row = result_row(result, cfg, url, model, server_args, command)
    Path("soak.md").write_text(markdown(row))
"""

from __future__ import annotations

import dataclasses
import datetime

from benchmarks import env_info
from benchmarks.soak.plan import SoakConfig
from benchmarks.soak.run import SoakResult

MAX_FAILURES_KEPT = 200
FIGURE_ROWS = [
    ("requests", "requests"), ("completed", "completed"), ("aborted", "aborted"),
    ("  by /abort_request", "aborts_by_rid"), ("  by closing the stream", "aborts_by_disconnect"),
    ("abort attempts", "abort_attempts"), ("streamed", "streamed"),
    ("deterministic", "det"), ("det completed", "det_completed"),
    ("det identical to solo reference", "det_identical"), ("det mismatched", "det_mismatched"),
    ("det aborted", "det_aborted"), ("det aborted with partial output", "det_aborted_partial"),
    ("det aborted, prefix of reference", "det_prefix_ok"),
    ("5xx", "status_5xx"), ("4xx", "status_4xx"), ("transport errors", "transport_errors"),
    ("rollbacks (server)", "rollbacks"), ("tokens rolled back", "tokens_rolled_back"),
    ("injected mismatches", "injected_mismatches"), ("verify passes", "verify_passes"),
    ("inconsistent tokens", "inconsistent_tokens"),
    ("rollbacks (native det meta_info)", "native_det_rollbacks"),
    ("det chat streams: logprob entries SGLang dropped", "chat_stream_logprobs_dropped"),
    ("det chat streams: wrong top_logprobs from SGLang", "chat_stream_top_logprobs_wrong"),
    ("retractions (native meta_info)", "retractions"),
    ("leaks", "leaks"), ("KV tokens in use at idle", "kv_used_tokens_at_idle"),
    ("recheck identical after soak", "recheck_identical"),
    ("peak running requests", "peak_running_reqs"),
    ("peak KV tokens in use", "peak_kv_used_tokens"),
    ("output tokens", "output_tokens"), ("references (s)", "reference_s"),
    ("load (s)", "load_s"), ("requests/s", "requests_per_s"), ("duration (s)", "duration_s"),
    ("failures", "failures"),
]


def figures_table(figures: dict) -> str:
    lines = ["| figure | value |", "|---|---|"]
    for label, key in FIGURE_ROWS:
        value = figures.get(key)
        if key == "recheck_identical":
            value = f"{value}/{figures.get('recheck')}"
        lines.append(f"| {label} | {'-' if value is None else value} |")
    ends = ", ".join(f"{k} {v}" for k, v in figures.get("by_endpoint", {}).items())
    lines.append(f"| by endpoint | {ends} |")
    return "\n".join(lines)


def markdown(row: dict) -> str:
    verdict = "PASSED" if row["passed"] else f"FAILED ({len(row['failures'])} failures)"
    cfg = row["config"]
    lines = [f"# Soak {verdict} ({row['timestamp']})", "",
             f"- server: `{row['url']}`, model {row['model']}", f"- server args: "
             f"`{row['server_args']}`" if row.get("server_args") else "- server args: (not "
             "launched here)",
             f"- plan: {cfg['num_requests']} requests, {cfg['det_fraction']:g} deterministic "
             f"({cfg['pool_size']} specs, each with a solo reference), {cfg['abort_fraction']:g} "
             f"aborted, concurrency {cfg['concurrency']}, {cfg['min_new_tokens']}-"
             f"{cfg['max_new_tokens']} new tokens, seed {cfg['seed']}",
             f"- commit {row['git_commit']}; CPU {row['cpu']}; host load average (1 min) at "
             f"start / end {row['checks'].get('host_load_avg_1m')}",
             f"- command `{row['command']}`", "",
             figures_table(row["figures"]), ""]
    if row["failures"]:
        lines += ["## Failures", ""] + [f"- {x}" for x in row["failures"]] + [""]
    return "\n".join(lines)


def result_row(result: SoakResult, cfg: SoakConfig, url: str, model: str | None,
               server_args: str | None, command: str) -> dict:
    return {"timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "passed": result.passed, "url": url, "model": model, "server_args": server_args,
            "command": command, "git_commit": env_info.git_commit(), "cpu": env_info.cpu_model(),
            "gpu": env_info.gpu_name(), "config": dataclasses.asdict(cfg),
            "figures": result.figures, "checks": result.checks,
            "llm42_stats_before": result.stats_before, "llm42_stats_after": result.stats_after,
            "specs": [dataclasses.asdict(s) for s in result.specs],
            "failures": result.failures[:MAX_FAILURES_KEPT],
            "num_failures": len(result.failures)}
