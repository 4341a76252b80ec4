"""Step timelines (`--llm42-timeline-dir`) -> where the time between decode steps goes.

    python -m benchmarks.timeline DIR_OR_FILES... --out-dir out/    # timeline.md/.json/.png

A running request gets one token per decode step, so its inter-token latency is the gap between
two decode launches. Each gap is classed by what ran inside it: nothing but the decode step
(`decode`), a prefill batch (`prefill`), verification passes (`verify`), or both. The table gives
each class's share of gaps and of time and its gap percentiles; `gap - verify` is the gap with its
passes' time taken out, a first-order estimate of the latency without verification. Each file
(one per scheduler process) is split into segments at its "reset" events (the benchmark client
resets llm42's stats after its warmup, once per run).
"""

from __future__ import annotations

import argparse
import collections
import gzip
import itertools
import json
import sys
from pathlib import Path

import numpy as np

# "folded": the gap held the decision of a pass that rode in the decode step before it
# (`--llm42-fold-passes`): that step ran at the row pass's rows, no pass forward of its own
CLASSES = ("decode", "prefill", "verify", "prefill+verify", "folded")
PREFILL_KINDS = ("prefill", "det_prefill")
# Decode steps by the requests they hold: a step's cost depends on its batch, and two servers
# under the same arrivals run different batch sizes (a slower one holds more requests).
BATCH_BUCKETS = (1, 32, 64, 128, 257)
# Per-iteration counts some recorders add (`StepTimeline.add_counter`), averaged per kind of
# iteration: (record key, mean's key, scale, digits, table title).
PER_RECORD = (
    ("syncs", "syncs_mean", 1, 2, "synchronizing CUDA calls per iteration"),  # LLM42_SYNC_DEBUG
    ("hook_s", "hook_mean_ms", 1000, 3, "llm42 hooks' own host time (ms)"),  # LLM42_HOOK_TIMES
    # host time inside ModelRunner.forward (passes' included), every recorder since issue 34's
    # sixteenth session
    ("forward_s", "forward_mean_ms", 1000, 3, "host time in the model forward (ms)"),
)


def load_segments(path: Path) -> list[list[dict]]:
    """Iteration records of one timeline file, split at its events (empty segments dropped)."""
    segments: list[list[dict]] = [[]]
    opener = gzip.open if str(path).endswith(".gz") else open  # recorded results are gzipped
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            rec = json.loads(line)
            if "event" in rec:
                segments.append([])
            else:
                segments[-1].append(rec)
    return [sorted(s, key=lambda r: r["t"]) for s in segments if s]


def decode_gaps(records: list[dict]) -> list[dict]:
    """One entry per pair of consecutive decode launches: its length and what ran inside.

    Passes at the top of the later decode's iteration ran before it launched, so they are inside
    the gap; those of the earlier one ran before the gap began. The gap runs from launch to
    launch: an iteration launches after its passes (`launch`; timelines written before that
    field existed: `t + verify_s`, the same up to building the batch)."""
    decodes = [i for i, r in enumerate(records) if r.get("kind") == "decode"]
    gaps = []
    for a, b in itertools.pairwise(decodes):
        inside = records[a + 1 : b + 1]
        prefill = any(r.get("kind") in PREFILL_KINDS for r in inside[:-1])
        verify_s = sum(r.get("verify_s", 0.0) for r in inside)
        passes = sum(r.get("passes", 0) for r in inside)
        overlapped = sum(r.get("overlapped", 0) for r in inside)
        folded = sum(r.get("folded", 0) for r in inside)
        cls = "prefill+verify" if prefill and passes else (
            "prefill" if prefill else "verify" if passes else "folded" if folded else "decode")
        gap_s = launch_time(records[b]) - launch_time(records[a])
        gaps.append({"t": records[a]["t"], "gap_s": gap_s, "verify_s": verify_s,
                     "passes": passes, "folded": folded, "overlapped": overlapped,
                     "class": cls, "waited_on": _longest_wait(records[a:b])})
    return gaps


def _longest_wait(records: list[dict]) -> str | None:
    """The kind of batch whose GPU work the host waited on longest within a gap, None without
    a wait of 1 ms or more (or in timelines without result timing). A gap's class says what
    launched inside it; a batch launched just before the gap (a long deterministic prefill, whose
    rows run as passes do) is waited on inside it, and only this names it."""
    waits = [(r.get("result_wait", 0.0), r.get("result_kind")) for r in records]
    wait, kind = max(waits, key=lambda w: w[0], default=(0.0, None))
    return kind if kind is not None and wait >= 0.001 else None


def launch_time(rec: dict) -> float:
    return rec["t"] + rec.get("launch", rec.get("verify_s", 0.0))


def _ms(values, q) -> float | None:
    return round(float(np.percentile(values, q)) * 1000, 2) if len(values) else None


def tail(gaps: list[dict], threshold_s: float | None = None) -> dict:
    """What the slow gaps held: those at or over `threshold_s`, by default the gaps' own p99.

    A p99 hides 1 % of gaps; what makes up the slowest ones says which lever moves it (several
    passes in one step: a pass cap; a pass next to a prefill: deferral; a lone pass: its cost)."""
    if threshold_s is None:
        threshold_s = float(np.percentile([g["gap_s"] for g in gaps], 99)) if gaps else 0.0
    slow = [g for g in gaps if g["gap_s"] >= threshold_s]
    return {
        "threshold_ms": round(threshold_s * 1000, 2),
        "gaps": len(slow),
        "by_class": {cls: sum(1 for g in slow if g["class"] == cls) for cls in CLASSES},
        "waited_on": dict(sorted(collections.Counter(
            g.get("waited_on") or "nothing" for g in slow).items())),
        "several_passes": sum(1 for g in slow if g["passes"] > 1),
        "one_pass_alone": sum(1 for g in slow if g["class"] == "verify" and g["passes"] == 1),
    }


def _lone_pass_gaps(gaps: list[dict]) -> dict:
    """Gaps holding one pass and nothing but a decode step, by whether the pass was queued
    before the in-flight result was processed (--llm42-overlap-verify) or after: the same
    server, the same load, the saving measured directly."""
    out = {}
    for name, overlapped in (("overlapped", True), ("drained_first", False)):
        mine = [g["gap_s"] for g in gaps if g["class"] == "verify" and g["passes"] == 1
                and bool(g.get("overlapped")) is overlapped]
        out[name] = {"gaps": len(mine), "p50_ms": _ms(mine, 50), "p90_ms": _ms(mine, 90)}
    return out


def summarize(records: list[dict], tail_s: float | None = None) -> dict:
    gaps = decode_gaps(records)
    total_gap = sum(g["gap_s"] for g in gaps)
    classes = {}
    for cls in CLASSES:
        mine = [g["gap_s"] for g in gaps if g["class"] == cls]
        classes[cls] = {
            "gaps": len(mine),
            "gap_share": round(len(mine) / len(gaps), 4) if gaps else None,
            "time_share": round(sum(mine) / total_gap, 4) if total_gap else None,
            "p50_ms": _ms(mine, 50), "p90_ms": _ms(mine, 90), "p99_ms": _ms(mine, 99),
        }
    kinds = {}
    for rec in records:
        k = kinds.setdefault(rec.get("kind") or "none",
                             {"iterations": 0, "seconds": 0.0, "launch_s": 0.0})
        k["iterations"] += 1
        k["seconds"] += rec.get("dt", 0.0)
        k["launch_s"] += rec.get("launch") or 0.0
        for key, *_ in PER_RECORD:
            if key in rec:
                k[key] = k.get(key, 0) + rec[key]
    all_gaps = [g["gap_s"] for g in gaps]
    passes = sum(r.get("passes", 0) for r in records)
    verify_s = sum(r.get("verify_s", 0.0) for r in records)
    span = (records[-1]["t"] + records[-1].get("dt", 0.0) - records[0]["t"]) if records else 0.0
    return {
        "span_s": round(span, 3),
        "decode_gaps": len(gaps),
        "gap_p50_ms": _ms(all_gaps, 50), "gap_p90_ms": _ms(all_gaps, 90),
        "gap_p99_ms": _ms(all_gaps, 99),
        "gap_minus_verify_p99_ms": _ms([g["gap_s"] - g["verify_s"] for g in gaps], 99),
        "classes": classes,
        "iterations": {k: {"iterations": v["iterations"], "seconds": round(v["seconds"], 3),
                           "mean_ms": round(v["seconds"] / v["iterations"] * 1000, 2),
                           "launch_mean_ms": round(v["launch_s"] / v["iterations"] * 1000, 2),
                           **{mean: round(v[key] / v["iterations"] * scale, digits)
                              for key, mean, scale, digits, _ in PER_RECORD if key in v}}
                       for k, v in sorted(kinds.items())},
        "decode_by_batch": decode_by_batch(records),
        "prefill_split": prefill_split(records),
        "results": results_by_kind(records),
        "verify_passes": passes,
        "folded_passes": sum(r.get("folded", 0) for r in records),
        "folded_rows": sum(r.get("folded_rows", 0) for r in records),
        "verify_s": round(verify_s, 3),
        "verify_pass_mean_ms": round(verify_s / passes * 1000, 2) if passes else None,
        "verify_share_of_span": round(verify_s / span, 4) if span else None,
        "drained_iterations": sum(1 for r in records if r.get("drained")),
        "several_pass_gaps": sum(1 for g in gaps if g["passes"] > 1),
        "lone_pass_gaps": _lone_pass_gaps(gaps),
        "tail": tail(gaps, tail_s),
        "max_running": max((r.get("running", 0) for r in records), default=0),
        "max_queued": max((r.get("queued", 0) for r in records), default=0),
    }


def decode_by_batch(records: list[dict]) -> dict:
    """Plain decode iterations (no pass, no folded rows, no inline verification) by the
    requests in the batch: each
    bucket's count, mean length and mean host time to launch."""
    out = {}
    for lo, hi in itertools.pairwise(BATCH_BUCKETS):
        mine = [r for r in records if r.get("kind") == "decode" and not r.get("passes")
                and not r.get("folded_rows") and not r.get("inline")
                and lo <= (r.get("reqs") or 0) < hi]
        if mine:
            out[f"{lo}-{hi - 1}"] = {
                "iterations": len(mine),
                "mean_ms": round(1000 * sum(r.get("dt", 0.0) for r in mine) / len(mine), 2),
                "launch_mean_ms": round(
                    1000 * sum(r.get("launch") or 0.0 for r in mine) / len(mine), 2)}
    return out


PREFILL_TOKEN_BUCKETS = (0, 64, 256, 1024, 1 << 40)


def prefill_split(records: list[dict]) -> dict:
    """Prefill iterations without a pass, by the tokens they launched: the mean iteration split
    into building the batch (`launch`), waiting for the GPU's previous work (`result_wait`),
    processing that result (`result_s`), the host time inside the model forward (`forward_s`,
    recorders since issue 34's sixteenth session) and the rest of the loop. A prefill iteration
    is host-bound on the H100 (`h100-2026-12-07-diagnostics`): this says which part of the host
    time llm42 adds to, and whether it grows with the prompt."""
    out = {}
    for lo, hi in itertools.pairwise(PREFILL_TOKEN_BUCKETS):
        mine = [r for r in records if r.get("kind") in PREFILL_KINDS and not r.get("passes")
                and lo <= (r.get("tokens") or 0) < hi]
        if not mine:
            continue
        parts = {name: sum(r.get(key) or 0.0 for r in mine) / len(mine)
                 for name, key in (("dt", "dt"), ("launch", "launch"), ("wait", "result_wait"),
                                   ("process", "result_s"), ("forward", "forward_s"))}
        parts["other"] = parts["dt"] - sum(parts[k] for k in ("launch", "wait", "process",
                                                                 "forward"))
        label = f"{lo}-{hi - 1}" if hi < PREFILL_TOKEN_BUCKETS[-1] else f"{lo}+"
        out[label] = {"iterations": len(mine),
                      **{f"{k}_ms": round(v * 1000, 2) for k, v in parts.items()},
                      "has_forward": all("forward_s" in r for r in mine)}
    return out


def results_by_kind(records: list[dict]) -> dict:
    """Batch results processed by the kind of batch they came from (recorders since issue 34's
    fifteenth session; older lines have none): how long the host waited for the GPU to finish
    that batch and how long it then processed it. A run of prefills is GPU-bound where the wait
    dominates, host-bound where the processing or the launch does."""
    out = {}
    for rec in records:
        kind = rec.get("result_kind")
        if kind is None:
            continue
        k = out.setdefault(kind, {"results": 0, "wait_s": 0.0, "process_s": 0.0})
        k["results"] += 1
        k["wait_s"] += rec.get("result_wait", 0.0)
        k["process_s"] += rec.get("result_s", 0.0)
    return {kind: {"results": k["results"],
                   "wait_mean_ms": round(1000 * k["wait_s"] / k["results"], 2),
                   "process_mean_ms": round(1000 * k["process_s"] / k["results"], 2)}
            for kind, k in sorted(out.items())}


def _fmt(v) -> str:
    return "-" if v is None else f"{v:g}" if isinstance(v, float) else str(v)


def markdown(summaries: dict[str, dict]) -> str:
    out = ["# Step timelines", ""]
    for name, s in summaries.items():
        out += [f"## {name}", "",
                (f"span {s['span_s']} s, {s['decode_gaps']} decode gaps: p50 / p90 / p99 "
                 f"{_fmt(s['gap_p50_ms'])} / {_fmt(s['gap_p90_ms'])} / {_fmt(s['gap_p99_ms'])} ms "
                 f"(p99 without the passes' time: {_fmt(s['gap_minus_verify_p99_ms'])} ms); "
                 f"{s['verify_passes']} verification passes and "
                 f"{s['folded_passes']} folded into decode steps "
                 f"({s['folded_rows']} rows), {s['verify_s']} s "
                 f"({_fmt(s['verify_pass_mean_ms'])} ms each, "
                 f"{_fmt(s['verify_share_of_span'])} of the span), "
                 f"{s['drained_iterations']} early result drains; running up to "
                 f"{s['max_running']}, queued up to {s['max_queued']}."), "",
                "| gap holds | gaps | share of gaps | share of time | p50 / p90 / p99 (ms) |",
                "|---|---|---|---|---|"]
        for cls, c in s["classes"].items():
            out.append(f"| {cls} | {c['gaps']} | {_fmt(c['gap_share'])} | "
                       f"{_fmt(c['time_share'])} | {_fmt(c['p50_ms'])} / {_fmt(c['p90_ms'])} / "
                       f"{_fmt(c['p99_ms'])} |")
        t = s["tail"]
        held = ", ".join(f"{n} {cls}" for cls, n in t["by_class"].items() if n)
        out += ["", (f"Gaps of {_fmt(t['threshold_ms'])} ms or more: {t['gaps']} "
                     f"({held or 'none'}); {t['several_passes']} of them ran several passes "
                     f"in one step, {t['one_pass_alone']} a single pass and no prefill "
                     f"({s['several_pass_gaps']} gaps with several passes in all).")]
        if any(k != "nothing" for k in t.get("waited_on", {})):
            waited = ", ".join(f"{n} on a {kind} result" for kind, n in t["waited_on"].items())
            out += ["", f"Of those gaps, the longest wait for the GPU: {waited}."]
        lone = s["lone_pass_gaps"]
        if lone["overlapped"]["gaps"]:
            o, d = lone["overlapped"], lone["drained_first"]
            out += ["", (f"Gaps with one pass alone: overlapped {o['gaps']}, p50 / p90 "
                         f"{_fmt(o['p50_ms'])} / {_fmt(o['p90_ms'])} ms; in-flight result "
                         f"processed first {d['gaps']}, p50 / p90 {_fmt(d['p50_ms'])} / "
                         f"{_fmt(d['p90_ms'])} ms.")]
        extra = [(mean, title) for _, mean, _, _, title in PER_RECORD
                 if any(mean in k for k in s["iterations"].values())]
        out += ["", "| iteration launched | iterations | seconds | mean (ms) | launch mean (ms) |"
                + "".join(f" {title} |" for _, title in extra),
                "|---|---|---|---|---|" + "---|" * len(extra)]
        for kind, k in s["iterations"].items():
            out.append(f"| {kind} | {k['iterations']} | {k['seconds']} | {k['mean_ms']} | "
                       f"{k.get('launch_mean_ms', '-')} |"
                       + "".join(f" {_fmt(k.get(key))} |" for key, _ in extra))
        if s.get("decode_by_batch"):
            out += ["", "| plain decode step, requests | iterations | mean (ms) | "
                        "launch mean (ms) |", "|---|---|---|---|"]
            for bucket, b in s["decode_by_batch"].items():
                out.append(f"| {bucket} | {b['iterations']} | {b['mean_ms']} | "
                           f"{b['launch_mean_ms']} |")
        if s.get("prefill_split"):
            out += ["", "| prefill without a pass, tokens | iterations | mean (ms) | batch build | "
                        "GPU wait | result processing | model forward (host) | rest |",
                    "|---|---|---|---|---|---|---|---|"]
            for bucket, b in s["prefill_split"].items():
                fwd = b["forward_ms"] if b["has_forward"] else "-"  # older recorders: in rest
                out.append(f"| {bucket} | {b['iterations']} | {b['dt_ms']} | {b['launch_ms']} | "
                           f"{b['wait_ms']} | {b['process_ms']} | {fwd} | {b['other_ms']} |")
        if s.get("results"):
            out += ["", "| result of a | results | GPU wait mean (ms) | processing mean (ms) |",
                    "|---|---|---|---|"]
            for kind, r in s["results"].items():
                out.append(f"| {kind} | {r['results']} | {r['wait_mean_ms']} | "
                           f"{r['process_mean_ms']} |")
        out.append("")
    return "\n".join(out)


def sync_sites_markdown(paths: list[Path], top: int = 15) -> str:
    """The `syncs-<pid>.json` files of `llm42.sglang.sync_sites` (LLM42_SYNC_DEBUG=1): each
    server process's synchronizing CUDA calls by site, over its whole life (warm-up included)."""
    out = []
    for path in paths:
        body = json.loads(path.read_text())
        out += [f"## synchronizing CUDA calls: {path.stem}", "",
                f"{body['total']} in all; the {top} most frequent sites (the line that made "
                "the call < the llm42 / SGLang frames around it):", "",
                "| calls | site |", "|---|---|"]
        out += [f"| {s['count']} | `{s['site']}` |" for s in body["sites"][:top]]
        out.append("")
    return "\n".join(out)


def hook_times_markdown(paths: list[Path], top: int = 15) -> str:
    """The `hooks-<pid>.json` files of `llm42.sglang.hook_times` (LLM42_HOOK_TIMES=1): each
    hook's own host time over the scheduler process's life (warm-up included)."""
    from llm42.sglang.hook_times import BY_ITERATION

    out = []
    for path in paths:
        body = json.loads(path.read_text())
        by_class = body.pop(BY_ITERATION, {})
        out += [f"## llm42 hooks' own host time: {path.stem}", "",
                f"The {top} hooks with the most (an AROUND hook's time less SGLang's original "
                "inside it):", "", "| hook | calls | own (s) | own per call (us) |",
                "|---|---|---|---|"]
        out += [f"| `{name}` | {h['calls']} | {h['own_s']} | {_fmt(h['own_us_per_call'])} |"
                for name, h in list(body.items())[:top]]
        out.append("")
        if by_class:
            out += ["Per timeline iteration, by what it launched ('pass': it also ran a pass or "
                    "drained a result for one; 'inline': an inline verification):", "",
                    "| iteration | iterations | own per iteration (us) | the three largest (us) |",
                    "|---|---|---|---|"]
            for cls, entry in by_class.items():
                hooks = entry["own_us_per_iteration"]
                largest = ", ".join(f"`{n}` {v}" for n, v in list(hooks.items())[:3])
                out.append(f"| {cls} | {entry['iterations']} | "
                           f"{round(sum(hooks.values()), 2)} | {largest} |")
            out.append("")
    return "\n".join(out)


def plot(named_records: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(named_records), 1, figsize=(10, 3.2 * len(named_records)),
                             squeeze=False)
    for ax, (name, records) in zip(axes[:, 0], named_records.items()):
        gaps = decode_gaps(records)
        for cls in CLASSES:
            mine = [g for g in gaps if g["class"] == cls]
            if mine:
                ax.scatter([g["t"] for g in mine], [g["gap_s"] * 1000 for g in mine], s=4,
                           label=f"{cls} ({len(mine)})")
        ax.set_yscale("log")
        ax.set_xlabel("time (s)")
        ax.set_ylabel("gap between decode steps (ms)")
        ax.set_title(name, fontsize=9)
        ax.legend(fontsize=7, markerscale=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _beside(inputs: list[str], pattern: str) -> list[Path]:
    """Files matching `pattern` in the inputs' folders (the diagnostics' per-process files)."""
    return sorted({p for item in map(Path, inputs)
                   for p in (item if item.is_dir() else item.parent).glob(pattern)})


def _files(inputs: list[str]) -> list[Path]:
    files: list[Path] = []
    for item in map(Path, inputs):
        files += sorted(item.glob("timeline-*.jsonl*")) if item.is_dir() else [item]
    return files


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("inputs", nargs="+", help="timeline files or directories holding them")
    p.add_argument("--out-dir", default=None, help="write timeline.md/.json/.png here")
    p.add_argument("--tail-ms", type=float, default=None,
                   help="break down the gaps of at least this length (e.g. 1.15 x a baseline's "
                        "gap p99); default: each segment's own p99")
    args = p.parse_args(argv)
    named: dict[str, list[dict]] = {}
    for path in _files(args.inputs):
        for i, segment in enumerate(load_segments(path)):
            named[f"{path.name.split('.')[0]} segment {i}"] = segment
    if not named:
        print(f"no timeline records in {args.inputs}", file=sys.stderr)
        return 1
    tail_s = args.tail_ms / 1000 if args.tail_ms is not None else None
    summaries = {name: summarize(recs, tail_s) for name, recs in named.items()}
    text = markdown(summaries)
    for pattern, table in (("syncs-*.json", sync_sites_markdown),
                           ("hooks-*.json", hook_times_markdown)):
        beside = _beside(args.inputs, pattern)
        if beside:
            text += "\n" + table(beside)
    print(text)
    if args.out_dir:
        out = Path(args.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "timeline.md").write_text(text, encoding="utf-8")
        (out / "timeline.json").write_text(json.dumps(summaries, indent=1), encoding="utf-8")
        plot(named, out / "timeline.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
