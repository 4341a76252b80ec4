"""Results JSONL -> `table.md`, `throughput_vs_ratio.png`, `latency.png` (+ window sweep plot).

    python -m benchmarks.report results.jsonl --out-dir out/     # also: driver --report-only

Throughput is normalised per workload to the `nondet` row (plain SGLang, like-for-like flags) and
to `sglang-det` (SGLang's batch-invariant mode) of the same workload, and where a `nondet-defaults`
row (plain SGLang with its own defaults), a `nondet-no-overlap` or a `nondet-spec` row (plain SGLang
with speculative decoding) exists, to that too; runs on speculative servers show their accept
length (tokens per speculative step); skipped rows stay in the table with their reason. Runs
at a finite request rate (online serving) also get a table of the *normal* requests' latency
against nondet's at the same rate (what llm42 costs the traffic that did not ask for
determinism), and, with several rates, `latency_vs_rate.png`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

LAT_COLUMNS = [(f"{lat} p50/p99 (ms)", f"{lat.lower()}_p50_ms", f"{lat.lower()}_p99_ms")
               for lat in ("TTFT", "ITL", "E2E")]


def load_rows(path: str | Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def workload_of(row: dict) -> str:
    """The driver's workload label, else one built from the run's shape."""
    if row.get("workload"):
        return row["workload"]
    name = row.get("dataset", "?")
    if name == "random":
        name += f"-{row.get('random_input_len')}x{row.get('random_output_len')}"
    return f"{name} n={row.get('num_prompts')} rate={row.get('request_rate')}"


def variant_of(row: dict) -> str:
    """What the server ran (nondet, sglang-det, or llm42 with its knobs), and which of the
    driver's `--repeats` runs on that server this row is."""
    run = f" (run {row['repeat'] + 1})" if row.get("repeat") is not None else ""
    return _server_variant(row) + run


def _server_variant(row: dict) -> str:
    spec = f" {row['speculative_algorithm']}" if row.get("speculative_algorithm") else ""
    if row.get("config") != "llm42":
        return row.get("config", "?") + spec
    label = f"llm42 W{row.get('window_size')} B{row.get('verify_batch_size')}"
    if spec:
        label += " spec" + spec
    if row.get("overlap_schedule") is False:
        label += " no-overlap"
    if row.get("batched_prefill"):
        label += " batched-prefill"
    if row.get("skip_compare"):
        label += " skip-compare"
    if row.get("inject_mismatch_rate"):
        label += f" inject={row['inject_mismatch_rate']:g}"
    stats = row.get("llm42_stats") or {}
    if not stats and row.get("llm42_args"):  # a run that did not complete: its flags
        return f"{label} {row['llm42_args']}"
    return label + _verifier_label(stats) + _scheduling_label(stats, row.get("window_size"))


def _verifier_label(stats: dict) -> str:
    """The verifier where not the default, and inline verification's pad ratio where not."""
    from llm42.core.config import Llm42Config

    defaults = Llm42Config()
    label = ""
    if stats.get("verifier") and stats["verifier"] != defaults.verifier:
        label += f" {stats['verifier']}"
    ratio = stats.get("inline_pad_ratio")
    if stats.get("inline_verify") and ratio is not None and ratio != defaults.inline_pad_ratio:
        label += f" inline-pad{ratio:g}"
    return label


def _scheduling_label(stats: dict, window: int | None) -> str:
    """Knobs of when passes run (from the server's /llm42_stats), where not the defaults."""
    label = ""
    from llm42.core.config import Llm42Config

    wait = stats.get("max_verify_wait")
    verifier = stats.get("verifier") or Llm42Config().verifier
    if wait is not None and window and wait != Llm42Config(
            window_size=window, verifier=verifier).verify_wait_steps:
        label += f" wait{wait}"
    if stats.get("max_passes_per_step"):
        label += f" cap{stats['max_passes_per_step']}"
    if stats.get("defer_verify_on_prefill"):
        label += " defer-on-prefill"
    fold = stats.get("fold_passes")
    if fold is not None and fold != Llm42Config().fold_passes:
        label += " fold" if fold else " no-fold"
    if stats.get("overlap_verify"):
        label += " overlap-verify"
    if stats.get("fp32_logits"):
        label += " fp32-logits"
    return label


BASELINES = ("nondet", "nondet-defaults", "nondet-no-overlap", "nondet-spec", "sglang-det")
OPTIONAL_BASELINES = ("nondet-defaults", "nondet-no-overlap", "nondet-spec")  # columns if run


def _baselines(rows: list[dict]) -> dict[tuple[str, str], float]:
    """(workload, config) -> output throughput of the last completed nondet / sglang-det row,
    or the mean of its server's runs when the driver repeated it (`repeat`)."""
    runs: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        if row.get("config") in BASELINES and not row.get("skipped") and (
                row.get("output_throughput")):
            key = (workload_of(row), row["config"])
            if not row.get("repeat"):  # a first run (or an unrepeated one)
                runs[key] = []  # a later server (or call) of the same baseline replaces it
            runs.setdefault(key, []).append(row)
    return {key: sum(r["output_throughput"] for r in same) / len(same)
            for key, same in runs.items()}


def _fmt(value, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _ratio(value, base) -> str:
    return f"{value / base:.3f}x" if value and base else "-"


def _accept_length(row: dict) -> str:
    """Tokens per speculative step; with deterministic and normal requests both, each's too."""
    text = _fmt(row.get("spec_accept_length"), 2)
    det, normal = row.get("det_spec_accept_length"), row.get("normal_spec_accept_length")
    return f"{text} (det {det:.2f}, normal {normal:.2f})" if det and normal else text


def _passes(row: dict) -> str:
    """Verification passes, and how many replayed a CUDA graph and how many rode in a decode
    step (`--llm42-fold-passes`) where the server counted them."""
    stats = row.get("llm42_stats") or {}
    graphed, folded = stats.get("graphed_passes"), stats.get("folded_passes")
    passes = row.get("verify_passes")
    if graphed is None or not passes:
        return _fmt(passes)
    return f"{passes} ({graphed} graphed{f', {folded} folded' if folded else ''})"


def markdown_table(rows: list[dict]) -> str:
    base = _baselines(rows)
    measured = {config for _, config in base}
    optional = [c for c in OPTIONAL_BASELINES if c in measured]  # columns only if measured
    accept = any(row.get("spec_accept_length") is not None for row in rows)
    header = (["workload", "config", "det ratio", "done", "out tok/s", "vs nondet"]
              + [f"vs {c}" for c in optional] + ["vs sglang-det"]
              + ["spec accept length"] * accept + [c[0] for c in LAT_COLUMNS]
              + ["recompute %", "rollbacks", "verify passes", "note"])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        wl, out = workload_of(row), row.get("output_throughput")
        note = row.get("skip_reason") or ""
        if row.get("failed"):
            note = (note + f" {row['failed']} failed").strip()
        if "synthetic" in str(row.get("dataset_source", "")):
            note = (note + " ArXiv-like synthetic data").strip()
        if row.get("load_format") == "dummy":
            note = (note + " dummy weights").strip()
        cells = [wl, variant_of(row), _fmt(row.get("det_ratio"), 2),
                 f"{row.get('completed', 0)}/{row.get('num_prompts', '?')}",
                 _fmt(out), _ratio(out, base.get((wl, "nondet")))]
        cells += [_ratio(out, base.get((wl, c))) for c in optional]
        cells += [_ratio(out, base.get((wl, "sglang-det")))]
        cells += [_accept_length(row)] * accept
        cells += [f"{_fmt(row.get(p50))} / {_fmt(row.get(p99))}" for _, p50, p99 in LAT_COLUMNS]
        cells += [_fmt(row.get("recompute_pct"), 3), _fmt(row.get("rollbacks")),
                  _passes(row), note.replace("|", "/")[:200]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# Online rows: normal requests' latency, and its ratio to nondet's at the same workload and rate.
ONLINE_COLUMNS = [("normal ITL p99", "normal_itl_p99_ms"),
                  ("normal TTFT p99", "normal_ttft_p99_ms"),
                  ("normal E2E p99", "normal_e2e_p99_ms")]


def _online(rows: list[dict]) -> list[dict]:
    return [r for r in rows if isinstance(r.get("request_rate"), (int, float))
            and not r.get("skipped") and r.get("completed")]


def online_table(rows: list[dict]) -> str:
    """Normal requests' latency per online run, as ratios to nondet (issue 5's third target)."""
    online = _online(rows)
    if not online:
        return ""
    base = {workload_of(r): r for r in online if r.get("config") == "nondet"}
    header = ["workload", "config", "det ratio", "out tok/s", "normal ITL p50 (ms)"]
    for name, _ in ONLINE_COLUMNS:
        header += [f"{name} (ms)", "vs nondet"]
    header += ["det ITL p99 (ms)", "det E2E p99 (ms)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in online:
        ref = base.get(workload_of(row), {})
        cells = [workload_of(row), variant_of(row), _fmt(row.get("det_ratio"), 2),
                 _fmt(row.get("output_throughput")), _fmt(row.get("normal_itl_p50_ms"))]
        for _, key in ONLINE_COLUMNS:
            cells += [_with_interval(row, key), _ratio(row.get(key), ref.get(key))]
        cells += [_fmt(row.get("det_itl_p99_ms")), _fmt(row.get("det_e2e_p99_ms"))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _with_interval(row: dict, key: str) -> str:
    """A p99 with its bootstrap interval where the run recorded one (ITL)."""
    ci = row.get(key.replace("_p99_ms", "_p99_ci_ms"))
    text = _fmt(row.get(key))
    return f"{text} [{ci[0]:.1f}, {ci[1]:.1f}]" if ci else text


def step_profile_table(rows: list[dict]) -> str:
    """Where an llm42 server's time went during each run, from its /llm42_stats step profile:
    seconds per kind of scheduler iteration, the next-batch step in between (verification
    passes, in-flight results drained for them, SGLang building the batch, which plain SGLang
    pays too, and llm42's own host work around the passes), and what none of them holds (client
    start and ramp); inline steps' host time, launching and sampling (inside the decode and
    prefill iterations). Servers older than a timing show `-`."""
    runs = [r for r in rows if not r.get("skipped") and r.get("duration")
            and "step_time_decode_s" in (r.get("llm42_stats") or {})]
    if not runs:
        return ""
    header = ["workload", "config", "det ratio", "run (s)", "decode", "prefill", "det prefill",
              "next-batch step", "of it: passes", "drains", "SGLang batch build", "llm42 other",
              "outside all", "inline steps: launch / sample"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in runs:
        st = row["llm42_stats"]
        steps = [st.get(f"step_time_{k}_s") or 0.0 for k in ("decode", "prefill", "det_prefill")]
        schedule = st.get("schedule_time_s")
        inside = sum(steps) + (schedule if schedule is not None else st.get("verify_time_s", 0.0))
        cells = [workload_of(row), variant_of(row), _fmt(row.get("det_ratio"), 2),
                 _fmt(row["duration"])] + [_fmt(x) for x in steps]
        build, other = st.get("batch_build_time_s"), None
        if build is not None and schedule is not None:
            other = schedule - build - st.get("verify_time_s", 0.0) - st.get("drain_time_s", 0.0)
        cells += [_fmt(schedule), _fmt(st.get("verify_time_s")), _fmt(st.get("drain_time_s")),
                  _fmt(build), _fmt(other), _fmt(row["duration"] - inside)]
        inline = "-"
        if st.get("inline_steps") and "inline_launch_time_s" in st:
            inline = (f"{st['inline_steps']}: {_fmt(st['inline_launch_time_s'])} / "
                      f"{_fmt(st['inline_sample_time_s'])}")
        lines.append("| " + " | ".join(cells + [inline]) + " |")
    return "\n".join(lines) + "\n"


def plot_latency_vs_rate(rows: list[dict], path: Path) -> bool:
    """Normal requests' ITL and TTFT p99 against request rate, one series per server variant,
    when online rows hold several rates: where llm42's extra work starts to queue."""
    online = _online(rows)
    if len({r["request_rate"] for r in online}) < 2:
        return False
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (name, key) in zip(axes, ONLINE_COLUMNS[:2]):
        series: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for r in online:
            shape = workload_of(r).split(" rate=")[0]
            series[f"{shape} {variant_of(r)} r={r['det_ratio']:g}"].append(
                (r["request_rate"], r.get(key) or math.nan))
        _plot_series(ax, series, "request rate (req/s, Poisson)", f"{name} (ms)", yscale="log")
    _save(plt, fig, path)
    return True


def _plot_series(ax, series: dict[str, list[tuple[float, float]]], xlabel: str, ylabel: str,
                 *, xscale: dict | None = None, yscale: str | None = None) -> None:
    """One line per label through its (x, y) points, sorted by x."""
    for label, points in sorted(series.items()):
        xs, ys = zip(*sorted(points))
        ax.plot(xs, ys, marker="o", label=label)
    if xscale:
        ax.set_xscale(**xscale)
    if yscale:
        ax.set_yscale(yscale)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _save(plt, fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_throughput_vs_ratio(rows: list[dict], path: Path) -> None:
    plt = _plt()
    base = _baselines(rows)
    workloads = sorted({workload_of(r) for r in rows})
    fig, axes = plt.subplots(1, len(workloads), figsize=(5.5 * len(workloads), 4), squeeze=False)
    for ax, wl in zip(axes[0], workloads):
        nondet = base.get((wl, "nondet"))
        series: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for r in rows:
            if workload_of(r) == wl and r.get("config") == "llm42" and not r.get("skipped") and (
                    r.get("output_throughput")):
                y = r["output_throughput"] / nondet if nondet else r["output_throughput"]
                series[variant_of(r)].append((r["det_ratio"], y))
        for label, points in sorted(series.items()):
            xs, ys = zip(*sorted(points))
            ax.plot(xs, ys, marker="o", label=label)
        if nondet:
            ax.axhline(1.0, color="black", linestyle="--", label="nondet (SGLang)")
        if (wl, "nondet-defaults") in base:
            user = base[(wl, "nondet-defaults")]
            ax.axhline(user / nondet if nondet else user, color="grey", linestyle="-.",
                       label="nondet-defaults (SGLang's defaults)")
        if (wl, "sglang-det") in base:
            det = base[(wl, "sglang-det")]
            ax.axhline(det / nondet if nondet else det, color="red", linestyle=":",
                       label="sglang-det")
        ax.set_xlabel("fraction of deterministic requests")
        ax.set_ylabel("output throughput / nondet" if nondet else "output tok/s")
        ax.set_title(wl, fontsize=9)
        ax.set_ylim(bottom=0)
        ax.set_xlim(-0.03, 1.03)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    _save(plt, fig, path)


def plot_latency(rows: list[dict], path: Path) -> None:
    plt = _plt()
    done = [r for r in rows if not r.get("skipped") and r.get("completed")]
    workloads = sorted({workload_of(r) for r in done}) or ["(no completed runs)"]
    fig, axes = plt.subplots(len(workloads), 3, figsize=(15, 3.8 * len(workloads)),
                             squeeze=False)
    for axrow, wl in zip(axes, workloads):
        mine = [r for r in done if workload_of(r) == wl]
        labels = [f"{variant_of(r)}\nr={r['det_ratio']:g}" for r in mine]
        for ax, (title, p50, p99) in zip(axrow, LAT_COLUMNS):
            xs = range(len(mine))
            ax.bar([x - 0.2 for x in xs], [r.get(p50) or 0 for r in mine], 0.4, label="p50")
            ax.bar([x + 0.2 for x in xs], [r.get(p99) or 0 for r in mine], 0.4, label="p99")
            ax.set_xticks(list(xs), labels, rotation=60, ha="right", fontsize=6)
            ax.set_title(f"{title.split()[0]}: {wl}", fontsize=8)
            ax.set_ylabel("ms")
            ax.grid(axis="y", alpha=0.3)
            ax.legend(fontsize=7)
    _save(plt, fig, path)


def window_sweep_series(rows: list[dict]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """Per measure (output tok/s, recompute %), one series per (workload, ratio) over window
    sizes; empty unless the plain llm42 rows hold several windows. Recompute % is what a real
    model's mismatches cost at each W: the other half of choosing W."""
    runs = [r for r in rows if r.get("config") == "llm42" and not r.get("skipped")
            and r.get("output_throughput") and not r.get("skip_compare")
            and not r.get("inject_mismatch_rate")]
    if len({r.get("window_size") for r in runs}) < 2:
        return {}
    out: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for name, key in (("output tok/s", "output_throughput"), ("recompute %", "recompute_pct")):
        series: dict[str, list[tuple[int, float]]] = defaultdict(list)
        for r in runs:
            if r.get(key) is not None:
                series[f"{workload_of(r)} r={r['det_ratio']:g}"].append((r["window_size"], r[key]))
        if series:
            out[name] = dict(series)
    return out


def plot_window_sweep(rows: list[dict], path: Path) -> bool:
    """Output throughput and recompute % against window size, when rows hold several windows."""
    measures = window_sweep_series(rows)
    if not measures:
        return False
    plt = _plt()
    fig, axes = plt.subplots(1, len(measures), figsize=(6 * len(measures), 4), squeeze=False)
    for ax, (name, series) in zip(axes[0], measures.items()):
        _plot_series(ax, series, "llm42 window size W", name, xscale={"value": "log", "base": 2})
    _save(plt, fig, path)
    return True


_CONFIG_ORDER = {"nondet": 0, "nondet-defaults": 1, "nondet-no-overlap": 1, "nondet-spec": 1,
                 "sglang-det": 2, "llm42": 3}


def sort_rows(rows: list[dict]) -> list[dict]:
    """Per workload: nondet, sglang-det, then llm42 variants by ratio (stable otherwise)."""
    return sorted(rows, key=lambda r: (
        workload_of(r), _CONFIG_ORDER.get(r.get("config"), 9), r.get("window_size") or 0,
        r.get("overlap_schedule") is False, bool(r.get("batched_prefill")),
        bool(r.get("skip_compare")),
        r.get("inject_mismatch_rate") or 0.0, r.get("det_ratio") or 0.0))


def _same_run(skipped: dict, done: dict) -> bool:
    """Whether a completed row ran what a skipped row stands for: the same workload, config and
    ratio on the same server (its label; rows older than the label compare its knobs)."""
    if (workload_of(skipped), skipped.get("config"), skipped.get("det_ratio")) != (
            workload_of(done), done.get("config"), done.get("det_ratio")):
        return False
    if skipped.get("server_label"):
        return skipped["server_label"] == done.get("server_label")
    return all(skipped.get(k) == done.get(k) for k in (
        "window_size", "verify_batch_size", "skip_compare", "inject_mismatch_rate"))


def drop_superseded(rows: list[dict]) -> tuple[list[dict], int]:
    """Rows without the skipped ones that a later call ran after all (results merged from
    several budget-limited calls), and how many were dropped."""
    done = [r for r in rows if not r.get("skipped")]
    kept = [r for r in rows if not r.get("skipped") or not any(_same_run(r, d) for d in done)]
    return kept, len(rows) - len(kept)


def write_report(jsonl: str | Path, out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows, superseded = drop_superseded(sort_rows(load_rows(jsonl)))
    note = (f" Skipped rows that another call ran left out: {superseded}." if superseded
            else "")
    table = out / "table.md"
    table.write_text(f"# Results ({Path(jsonl).name}, {len(rows)} rows)\n\n" + markdown_table(rows)
                     + "\nOutput throughput normalised per workload; `-` where the baseline "
                     f"configuration has no completed run.{note}\n")
    online = online_table(rows)
    if online:
        with table.open("a", encoding="utf-8") as f:
            f.write("\n## Online runs: normal requests' latency against nondet at the same rate\n\n"
                    + online + "\nIn brackets: a 95 % bootstrap interval of the p99 (requests "
                    "resampled whole), where the run recorded one.\n")
    profile = step_profile_table(rows)
    if profile:
        with table.open("a", encoding="utf-8") as f:
            f.write("\n## Where llm42's time went (seconds, from /llm42_stats)\n\n" + profile
                    + "\nScheduler iterations by the batch they launched; the next-batch step "
                    "holds the verification passes, the in-flight results drained for them, "
                    "SGLang building the batch (plain SGLang pays that too) and llm42's own host "
                    "work around the passes (without `schedule_time_s`, older servers: the "
                    "passes only). 'Outside all' "
                    "is the client's start and ramp, and with older servers the rest of the "
                    "next-batch step.\n")
    written = [table, out / "throughput_vs_ratio.png", out / "latency.png"]
    plot_throughput_vs_ratio(rows, written[1])
    plot_latency(rows, written[2])
    if plot_window_sweep(rows, out / "throughput_vs_window.png"):
        written.append(out / "throughput_vs_window.png")
    if plot_latency_vs_rate(rows, out / "latency_vs_rate.png"):
        written.append(out / "latency_vs_rate.png")
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("jsonl")
    p.add_argument("--out-dir", default=None, help="default: the JSONL's folder")
    args = p.parse_args(argv)
    for path in write_report(args.jsonl, args.out_dir or Path(args.jsonl).parent):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
