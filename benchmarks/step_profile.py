"""Summarize a torch.profiler Chrome trace of a few decode steps: where a step's time goes.

    python -m benchmarks.step_profile TRACE.trace.json.gz [--out-dir D] [--match llm42 ...]

Reads the trace SGLang's `/start_profile` writes (`benchmarks.driver --profile-steps N` asks
for one mid-run; gzip or plain JSON, `traceEvents` of complete `ph == "X"` events, `ts`/`dur`
in microseconds) and reports, over the window from the first event's start to the last one's
end:

- GPU busy time: the union of every kernel / memcpy / memset interval, all streams merged, and
  its fraction of the window; the 10 longest GPU idle gaps between busy intervals, each with
  what the host launch thread (the thread with the most `cuda_runtime` events) was doing: the
  5 events (python functions, ops, CUDA runtime calls) with the most self time during the gap,
  i.e. time on top of that thread's stack, and the innermost python function spanning it;
- the step count: `ProfilerStep#N` annotations if any, else the outermost python calls of
  SGLang's `model_runner.py(LINE): forward`; wall and GPU busy time per step, the median period
  between step starts;
- host synchronizations: `cuda_runtime` / `cuda_driver` calls that block the host
  (`*Synchronize*`, a `cudaMemcpy*` / `cuMemcpy*` that is not `Async`), grouped by call and
  innermost enclosing python function of the same thread, with the chain of up to 4
  enclosing python functions naming llm42 or sglang (innermost first);
- python functions whose name contains each `--match` pattern, by inclusive time (a recursive
  function's time counted at its outermost call only) and call count;
- the 15 GPU kernels with the most total time.

Torch names a python function `FILE(LINE): NAME`, FILE relative to the `sys.path` entry it was
imported from (`sglang/srt/model_executor/model_runner.py(2112): forward`). Writes `profile.md`
and `profile.json` into `--out-dir` (default: the trace's folder). One pass over the events plus
sorts, so a trace of 1-2 million events takes seconds.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import bisect
import gzip
import itertools
import json
import re
import statistics
from collections import Counter, defaultdict

DEFAULT_MATCH = ("llm42", "sglang/srt/managers", "sglang/srt/model_executor")
GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver"})
HOST_CATS = frozenset({"python_function", "cpu_op", "user_annotation"}) | RUNTIME_CATS
PYTHON = "python_function"
FORWARD = re.compile(r"model_runner\.py\(\d+\): forward$")
CHAIN_WORDS = ("llm42", "sglang")
TOP_GAPS, GAP_HOST_NAMES, TOP_SYNCS, TOP_PYTHON, TOP_KERNELS = 10, 5, 15, 25, 15


def load(path: str | Path) -> dict:
    """The trace as a dict (a bare event list becomes {"traceEvents": list})."""
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)  # EOFError while the server is still writing it
    try:
        import orjson
        data = orjson.loads(raw)
    except ImportError:
        data = json.loads(raw)
    return {"traceEvents": data} if isinstance(data, list) else data


def is_sync(name: str) -> bool:
    """A CUDA runtime / driver call that blocks the host until the GPU catches up."""
    return "Synchronize" in name or (
        name.startswith(("cudaMemcpy", "cuMemcpy")) and "Async" not in name)


class _Thread:
    """One host thread's events sorted by start (outer before inner at equal starts), with each
    one's parent: the innermost event still open when it started."""

    def __init__(self, events: list[tuple]):
        events.sort(key=lambda ev: (ev[0], -ev[1]))
        self.starts = [ev[0] for ev in events]
        self.ends = [ev[1] for ev in events]
        self.names = [ev[2] for ev in events]
        self.cats = [ev[3] for ev in events]
        self.parent = [-1] * len(events)

    def innermost_python(self, j: int) -> int:
        while j >= 0 and self.cats[j] != PYTHON:
            j = self.parent[j]
        return j

    def chain(self, j: int, limit: int = 4) -> list[str]:
        """Up to `limit` python functions naming llm42 or sglang from j outward."""
        out = []
        while j >= 0 and len(out) < limit:
            if self.cats[j] == PYTHON and any(w in self.names[j] for w in CHAIN_WORDS):
                out.append(self.names[j])
            j = self.parent[j]
        return out

    def open_at(self, t0: float, t1: float) -> list[int]:
        """Every event overlapping [t0, t1]: those starting inside, and the ancestors of the
        last one started before t0 that are still open at t0."""
        lo, hi = bisect.bisect_right(self.starts, t0), bisect.bisect_left(self.starts, t1)
        out, j = list(range(lo, hi)), lo - 1
        while j >= 0:
            if self.ends[j] > t0:
                out.append(j)
            j = self.parent[j]
        return out


def summarize(trace: str | Path | dict, match: tuple[str, ...] | list[str] = DEFAULT_MATCH
              ) -> dict:
    """The summary of a trace file (or an already loaded trace dict); see the module doc."""
    data = trace if isinstance(trace, dict) else load(trace)
    t_min, t_max = float("inf"), float("-inf")
    gpu: list[tuple[float, float]] = []
    kernels: dict[str, list] = defaultdict(lambda: [0, 0.0])
    gpu_by_cat: Counter = Counter()
    host: dict[tuple, list[tuple]] = defaultdict(list)
    profiler_steps = 0
    for ev in data.get("traceEvents") or []:
        if ev.get("ph") != "X" or "ts" not in ev:
            continue
        s = float(ev["ts"])
        e = s + float(ev.get("dur") or 0.0)
        t_min, t_max = min(t_min, s), max(t_max, e)
        cat = ev.get("cat") or ""
        if cat in GPU_CATS:
            gpu.append((s, e))
            gpu_by_cat[cat] += e - s
            if cat == "kernel":
                k = kernels[ev.get("name", "?")]
                k[0] += 1
                k[1] += e - s
        elif cat in HOST_CATS:
            name = str(ev.get("name", "?"))
            host[(ev.get("pid"), ev.get("tid"))].append((s, e, name, cat))
            if cat != PYTHON and name.startswith("ProfilerStep#"):
                profiler_steps += 1
    if t_min == float("inf"):
        raise ValueError("no complete (ph X) events in the trace")

    # one stack sweep per host thread: parents, inclusive python time, steps, syncs
    inclusive: dict[str, list] = defaultdict(lambda: [0, 0.0])  # name -> [calls, us]
    forwards: list[tuple[float, float]] = []
    syncs: list[tuple] = []  # (thread key, event index)
    threads: dict[tuple, _Thread] = {}
    for key, events in host.items():
        th = threads[key] = _Thread(events)
        stack: list[int] = []
        open_names: Counter = Counter()
        open_forwards = 0
        for i, s in enumerate(th.starts):
            while stack and th.ends[stack[-1]] <= s:
                j = stack.pop()
                if th.cats[j] == PYTHON:
                    open_names[th.names[j]] -= 1
                    open_forwards -= bool(FORWARD.search(th.names[j]))
            th.parent[i] = stack[-1] if stack else -1
            name, cat, e = th.names[i], th.cats[i], th.ends[i]
            if cat == PYTHON:
                agg = inclusive[name]
                agg[0] += 1
                if not open_names[name]:
                    agg[1] += e - s
                open_names[name] += 1
                if FORWARD.search(name):
                    if not open_forwards:
                        forwards.append((s, e))
                    open_forwards += 1
            elif cat in RUNTIME_CATS and is_sync(name):
                syncs.append((key, i))
            stack.append(i)

    host.clear()
    # GPU busy: the union of every GPU interval
    gpu.sort()
    merged: list[list[float]] = []
    for s, e in gpu:
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    busy = sum(e - s for s, e in merged)
    window = t_max - t_min

    launch_key = _launch_thread(threads)
    gaps = sorted(((merged[i][1], merged[i + 1][0]) for i in range(len(merged) - 1)),
                  key=lambda g: g[0] - g[1])[:TOP_GAPS]
    gap_rows = [_gap_row(g0, g1, t_min, threads.get(launch_key)) for g0, g1 in gaps]

    sync_groups: dict[tuple, dict] = {}
    python_threads = {k: th for k, th in threads.items() if PYTHON in th.cats}
    for key, i in syncs:
        th = threads[key]
        j, owner = th.innermost_python(th.parent[i]), th
        if j < 0:  # no python on this thread: the python-richest thread of the same process
            owner, j = _python_elsewhere(python_threads, key, th.starts[i], th.ends[i])
        fn = owner.names[j] if j >= 0 else "(no python function)"
        g = sync_groups.get((th.names[i], fn))
        if g is None:
            cpu_op = th.parent[i]
            while cpu_op >= 0 and th.cats[cpu_op] != "cpu_op":
                cpu_op = th.parent[cpu_op]
            g = sync_groups[(th.names[i], fn)] = {
                "sync": th.names[i], "function": fn, "count": 0, "total_ms": 0.0,
                "op": th.names[cpu_op] if cpu_op >= 0 else None,
                "chain": owner.chain(j) if j >= 0 else []}
        g["count"] += 1
        g["total_ms"] += (th.ends[i] - th.starts[i]) / 1e3

    if profiler_steps:
        steps, step_source, starts = profiler_steps, "ProfilerStep# annotations", sorted(
            th.starts[i] for th in threads.values() for i, n in enumerate(th.names)
            if n.startswith("ProfilerStep#") and th.cats[i] != PYTHON)
    else:
        forwards.sort()
        steps, step_source = len(forwards), "model_runner.py forward calls"
        starts = [s for s, _ in forwards]
    periods = [b - a for a, b in itertools.pairwise(starts)]

    python = {}
    for pattern in match:
        rows = [{"name": n, "calls": c, "total_ms": us / 1e3}
                for n, (c, us) in inclusive.items() if pattern in n]
        python[pattern] = sorted(rows, key=lambda r: -r["total_ms"])[:TOP_PYTHON]
    top_syncs = sorted(sync_groups.values(), key=lambda g: -g["total_ms"])
    return {
        "window_ms": window / 1e3,
        "gpu_busy_ms": busy / 1e3,
        "gpu_busy_fraction": busy / window if window > 0 else 0.0,
        "gpu_span_ms": (merged[-1][1] - merged[0][0]) / 1e3 if merged else 0.0,
        "gpu_ms_by_category": {k: v / 1e3 for k, v in sorted(gpu_by_cat.items())},
        "steps": steps,
        "step_source": step_source,
        "wall_per_step_ms": window / 1e3 / steps if steps else None,
        "gpu_busy_per_step_ms": busy / 1e3 / steps if steps else None,
        "step_period_median_ms": statistics.median(periods) / 1e3 if periods else None,
        "host_thread": list(launch_key) if launch_key else None,
        "gaps": gap_rows,
        "syncs_total": {"count": sum(g["count"] for g in top_syncs),
                        "total_ms": sum(g["total_ms"] for g in top_syncs)},
        "syncs": top_syncs[:TOP_SYNCS],
        "python": python,
        "kernels": [{"name": n[:80], "count": c, "total_ms": us / 1e3} for n, (c, us) in
                    sorted(kernels.items(), key=lambda kv: -kv[1][1])[:TOP_KERNELS]],
        "events": {"gpu": len(gpu), "host": sum(len(t.starts) for t in threads.values())},
    }


def _launch_thread(threads: dict[tuple, _Thread]) -> tuple | None:
    """The host thread that launches the GPU work: the most CUDA runtime calls, else (a CPU
    trace) the most events."""
    if not threads:
        return None
    return max(threads, key=lambda k: (sum(c in RUNTIME_CATS for c in threads[k].cats),
                                       len(threads[k].cats)))


def _python_elsewhere(python_threads: dict, key: tuple, s: float, e: float
                      ) -> tuple[_Thread | None, int]:
    """The innermost python function spanning [s, e] on the python-richest thread of key's
    process (CUDA runtime calls recorded under another thread id than their python)."""
    same = [k for k in python_threads if k[0] == key[0]]
    if not same:
        return None, -1
    th = python_threads[max(same, key=lambda k: len(python_threads[k].cats))]
    j = bisect.bisect_right(th.starts, s) - 1
    while j >= 0 and not (th.cats[j] == PYTHON and th.ends[j] >= e):
        j = th.parent[j]
    return th, j


def _gap_row(g0: float, g1: float, t_min: float, th: _Thread | None) -> dict:
    """A GPU idle gap and what the launch thread did meanwhile: per name, the time its events
    spent on top of the thread's stack (self time) within the gap."""
    row = {"start_ms": (g0 - t_min) / 1e3, "length_ms": (g1 - g0) / 1e3, "host": [],
           "host_untraced_ms": (g1 - g0) / 1e3, "inside": None, "chain": []}
    if th is None:
        return row
    cands = th.open_at(g0, g1)
    overlap = {j: max(0.0, min(th.ends[j], g1) - max(th.starts[j], g0)) for j in cands}
    own = dict(overlap)
    roots = 0.0
    for j, ov in overlap.items():
        p = th.parent[j]
        if p in own:
            own[p] -= ov
        else:
            roots += ov
    per_name: Counter = Counter()
    for j, t in own.items():
        if t > 0:
            per_name[th.names[j]] += t
    row["host"] = [{"name": n, "ms": t / 1e3} for n, t in per_name.most_common(GAP_HOST_NAMES)]
    row["host_untraced_ms"] = max(0.0, (g1 - g0) - roots) / 1e3
    spanning = [j for j in cands if th.cats[j] == PYTHON and th.starts[j] <= g0
                and th.ends[j] >= g1]
    if spanning:
        inner = min(spanning, key=lambda j: th.ends[j] - th.starts[j])
        row["inside"], row["chain"] = th.names[inner], th.chain(th.parent[inner], 3)
    return row


def one_line(summary: dict) -> str:
    """The summary in one line (the driver prints it)."""
    steps = summary["steps"]
    per = (f"{summary['wall_per_step_ms']:.2f} ms wall, {summary['gpu_busy_per_step_ms']:.2f} ms "
           "GPU busy per step" if steps else "no steps found")
    sync = summary["syncs_total"]
    return (f"{steps} steps ({summary['step_source']}), {per}; GPU busy "
            f"{summary['gpu_busy_fraction']:.0%} of {summary['window_ms']:.1f} ms; "
            f"{sync['count']} host syncs, {sync['total_ms']:.2f} ms")


def _ms(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|")


def markdown(summary: dict, title: str = "") -> str:
    s, steps = summary, summary["steps"] or None
    lines = [f"# Step profile{': ' + title if title else ''}", "",
             f"- window: {s['window_ms']:.3f} ms; GPU busy {s['gpu_busy_ms']:.3f} ms "
             f"({s['gpu_busy_fraction']:.1%}; all streams merged; first to last GPU event "
             f"{s['gpu_span_ms']:.3f} ms); by category: "
             + (", ".join(f"{k} {v:.3f} ms" for k, v in s["gpu_ms_by_category"].items())
                or "none"),
             f"- steps: {s['steps']} ({s['step_source']}); per step: wall "
             f"{_ms(s['wall_per_step_ms'])} ms, GPU busy {_ms(s['gpu_busy_per_step_ms'])} ms; "
             f"median period between step starts {_ms(s['step_period_median_ms'])} ms",
             f"- host syncs: {s['syncs_total']['count']} calls, "
             f"{s['syncs_total']['total_ms']:.3f} ms"
             + (f" ({s['syncs_total']['total_ms'] / steps:.3f} ms per step)" if steps else ""),
             f"- host launch thread (pid, tid): {s['host_thread']}", ""]
    lines += ["## GPU idle gaps (longest first)", "",
              "Host: self time of the launch thread's events during the gap (untraced: no "
              "event open). Inside: the innermost python function spanning the gap, then its "
              "llm42/sglang callers.", "",
              "| at ms | length ms | host (self ms) | untraced ms | inside |",
              "|---:|---:|---|---:|---|"]
    for g in s["gaps"]:
        host = "<br>".join(f"{_cell(_short(h['name']))} {h['ms']:.3f}" for h in g["host"])
        inside = " < ".join(_cell(_short(n)) for n in
                            ([g["inside"]] if g["inside"] else []) + g["chain"])
        lines.append(f"| {g['start_ms']:.3f} | {g['length_ms']:.3f} | {host} | "
                     f"{g['host_untraced_ms']:.3f} | {inside} |")
    lines += ["", "## Host synchronizations", "",
              "| call | count | total ms | per step ms | op | innermost python function | "
              "llm42/sglang chain (innermost first) |", "|---|---:|---:|---:|---|---|---|"]
    for g in s["syncs"]:
        per = f"{g['total_ms'] / steps:.3f}" if steps else "-"
        lines.append(f"| {_cell(g['sync'])} | {g['count']} | {g['total_ms']:.3f} | {per} | "
                     f"{_cell(g['op'] or '')} | {_cell(_short(g['function']))} | "
                     + " < ".join(_cell(_short(n)) for n in g["chain"]) + " |")
    for pattern, rows in s["python"].items():
        lines += ["", f"## Python functions naming `{pattern}` (inclusive time)", "",
                  "| function | calls | total ms | per step ms |", "|---|---:|---:|---:|"]
        for r in rows:
            per = f"{r['total_ms'] / steps:.3f}" if steps else "-"
            lines.append(f"| {_cell(_short(r['name']))} | {r['calls']} | {r['total_ms']:.3f} "
                         f"| {per} |")
    lines += ["", "## GPU kernels (total time)", "",
              "| kernel | count | total ms | per step ms |", "|---|---:|---:|---:|"]
    for k in s["kernels"]:
        per = f"{k['total_ms'] / steps:.3f}" if steps else "-"
        lines.append(f"| {_cell(k['name'])} | {k['count']} | {k['total_ms']:.3f} | {per} |")
    return "\n".join(lines) + "\n"


def _short(name: str) -> str:
    """A python function's name without an install prefix torch left on it."""
    return re.sub(r"^.*?/(?:site|dist)-packages/", "", name)


def write(summary: dict, out_dir: str | Path, title: str = "") -> list[Path]:
    """profile.md and profile.json in out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md, js = out / "profile.md", out / "profile.json"
    md.write_text(markdown(summary, title), encoding="utf-8")
    js.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    return [md, js]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", help="a torch.profiler Chrome trace (.json or .json.gz)")
    p.add_argument("--out-dir", default=None, help="default: the trace's folder")
    p.add_argument("--match", action="append", default=None,
                   help="python function tables: names containing this (repeatable; default: "
                        + ", ".join(DEFAULT_MATCH) + ")")
    args = p.parse_args(argv)
    trace = Path(args.trace)
    summary = summarize(trace, tuple(args.match or DEFAULT_MATCH))
    for path in write(summary, args.out_dir or trace.parent, trace.name):
        print(f"wrote {path}")
    print(one_line(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
