"""`row_invariance`'s table and plot, and what its timings say a pass costs per verified token.

    costs = pass_costs(rows, layers=32, buckets=[192, 256, 512], max_rows=512, fills=FILL_LEVELS)
    table = write(rows, out_dir, argv, ctx, fills)   # table.md and row_invariance.png

A pass of M real rows costs, in GEMMs, layers x (qkv + o + gate_up + down) + the fp32 lm_head
(`--llm42-fp32-logits`, the default) at the M it runs with (attention, norms and the rest
excluded). Policies, per kernel:

  fixed        today's pass: always --max-rows rows (512 = B x W), real or padding
  bucket       the smallest bucket >= M at which every linear gave the rows of the 512-row GEMM
               in every case (only such buckets can serve a row-invariant verifier)
  exact        M rows (the next measured M), only for a kernel invariant at every measured M
  bucket-mixed per linear the cheapest kernel invariant at every bucket, at the bucket as above

`vs today` divides by cuBLAS at fixed, the pass llm42 runs now.
"""

from __future__ import annotations

import shlex
from collections import defaultdict
from pathlib import Path

from benchmarks import report as bench_report

# Share of a full pass's rows that are real (issue 34: ShareGPT 10 %: 7,692 of 11,082 pass rows
# were padding, H100, current defaults; ArXiv 10 %: 59 % padded, H200, previous defaults)
FILL_LEVELS = {"sharegpt-10%": 0.31, "sharegpt-100%": 1.0, "arxiv-10%": 0.41}
PER_LAYER = ("qkv", "o", "gate_up", "down")
HEAD = "lm_head-fp32"
TIME_AT = (1, 16, 64, 128)


def parse_fills(text: str) -> dict[str, float]:
    out = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, _, share = item.partition("=")
        out[name] = float(share)
    return out


def gemm_index(rows: list[dict]) -> tuple[dict, dict]:
    """(kernel, linear, M) -> ms, and -> whether every case held (None: not measured)."""
    ms, ok = {}, defaultdict(lambda: True)
    for r in rows:
        if r.get("kind") != "gemm" or r["skipped"]:
            continue
        key = (r["kernel"], r["linear"], r["m"])
        ms[key] = r["ms"]
        if r["bitwise"] is not None:
            ok[key] = ok[key] and r["bitwise"]
    return ms, {k: ok[k] for k in ms}


def pass_ms(ms: dict, kernel: str | dict, m: int, layers: int) -> float | None:
    """GEMM ms of one pass of m rows; `kernel` may name one kernel per linear."""
    def at(linear):
        return ms.get((kernel if isinstance(kernel, str) else kernel[linear], linear, m))
    parts = [at(name) for name in (*PER_LAYER, HEAD)]
    if any(p is None for p in parts):
        return None
    return layers * sum(parts[:-1]) + parts[-1]


def pass_costs(rows: list[dict], layers: int, buckets: list[int], max_rows: int,
               fills: dict[str, float]) -> list[dict]:
    ms, ok = gemm_index(rows)
    kernels = sorted({k for k, _, _ in ms})
    measured = sorted({m for _, _, m in ms})
    linears = (*PER_LAYER, HEAD)
    buckets = sorted({b for b in buckets if b <= max_rows} | {max_rows})
    today = pass_ms(ms, "cublas", max_rows, layers)

    def invariant(kernel, m):
        return all(ok.get((kernel, lin, m)) for lin in linears)

    def cost(fill, real, kernel, policy, m, note=None):
        total = pass_ms(ms, kernel, m, layers) if m else None
        per = total / real if total is not None else None
        return {"fill_level": fill, "real_rows": real,
                "kernel": kernel if isinstance(kernel, str) else "mixed", "policy": policy,
                "pass_rows": m, "pass_ms": total, "ms_per_verified_token": per,
                "vs_today": per / (today / real) if per is not None and today else None,
                "kernels_per_linear": None if isinstance(kernel, str) else kernel,
                "note": note}
    out = []
    for fill, share in fills.items():
        real = max(1, round(share * max_rows))
        bucket = next(b for b in buckets if b >= real)
        for kernel in kernels:
            out.append(cost(fill, real, kernel, "fixed", max_rows))
            usable = [b for b in buckets if b == max_rows or invariant(kernel, b)]
            out.append(cost(fill, real, kernel, "bucket", next(b for b in usable if b >= real),
                            f"invariant buckets: {usable}"))
            if measured and all(invariant(kernel, m) for m in measured):
                out.append(cost(fill, real, kernel, "exact",
                                next((m for m in measured if m >= real), None)))
        choice = {}
        for lin in linears:
            fine = [k for k in kernels if (k, lin, bucket) in ms
                    and all(ok.get((k, lin, b)) for b in buckets)]
            if fine:
                choice[lin] = min(fine, key=lambda k, lin=lin: ms[(k, lin, bucket)])
        if len(choice) == len(linears):
            out.append(cost(fill, real, choice, "bucket-mixed", bucket))
    return out


def ranges(grid: list[int], ms: set[int]) -> str:
    """Runs of consecutive grid members: grid 1..8, {1,2,3,6,7} -> "1-3, 6-7"."""
    runs, start, prev = [], None, None
    for m in grid:
        if m in ms and start is None:
            start = m
        if m not in ms and start is not None:
            runs.append((start, prev))
            start = None
        prev = m
    if start is not None:
        runs.append((start, prev))
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs) or "none"


def gemm_table(rows: list[dict], grid: list[int]) -> list[str]:
    cases = ("prefix", "permuted", "offset")
    held = defaultdict(lambda: defaultdict(set))
    failed, replay_differs, skipped, keys = defaultdict(set), defaultdict(set), {}, []
    graphed = set()
    for r in rows:
        if r.get("kind") != "gemm":
            continue
        key = (r["kernel"], r["linear"])
        if key not in keys:
            keys.append(key)
        if r["skipped"]:
            skipped.setdefault(key, r["skip_reason"])
        elif r["bitwise"]:
            held[key][r["case"]].add(r["m"])
        elif r["bitwise"] is False:
            failed[key].add(r["m"])
        if r.get("graph_matches_eager") is not None:
            graphed.add(key)
            if not r["graph_matches_eager"]:
                replay_differs[key].add(r["m"])
    lines = ["| kernel | linear | " + " | ".join(cases) + " | all three | not invariant at "
             "| graph replay = eager |", "|---|---|---|---|---|---|---|---|"]
    for key in keys:
        if key in skipped and not held[key] and not failed[key]:
            lines.append(f"| {key[0]} | {key[1]} | skipped: {_cell(skipped[key])} ||||||")
            continue
        every = set(grid) - failed[key]
        every &= held[key]["prefix"] & held[key]["permuted"]
        cells = [ranges(grid, held[key][c]) for c in cases]
        replay = ("not graphed" if key not in graphed else
                  f"no at {ranges(grid, replay_differs[key])}" if replay_differs[key] else "yes")
        lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(cells) +
                     f" | {ranges(grid, every)} | {ranges(grid, failed[key])} | {replay} |")
    return lines


def time_table(rows: list[dict], buckets: list[int], max_rows: int, layers: int) -> list[str]:
    ms, _ = gemm_index(rows)
    at = sorted({*TIME_AT, *buckets, max_rows} & {m for _, _, m in ms})
    kernels = sorted({k for k, _, _ in ms})
    lines = ["| kernel | linear | " + " | ".join(f"M={m}" for m in at) + " |",
             "|---|---|" + "---|" * len(at)]
    for kernel in kernels:
        for lin in (*PER_LAYER, "lm_head", HEAD):
            lines.append(f"| {kernel} | {lin} | " + " | ".join(
                bench_report._fmt(ms.get((kernel, lin, m)), 4) for m in at) + " |")
        lines.append(f"| {kernel} | **pass** | " + " | ".join(
            bench_report._fmt(pass_ms(ms, kernel, m, layers), 3) for m in at) + " |")
    return lines


def cost_table(rows: list[dict]) -> list[str]:
    lines = [("| fill level | real rows | kernel | policy | pass rows | pass ms | ms per verified "
              "token | vs today | note |"), "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("kind") != "pass-cost":
            continue
        note = r["note"] or (", ".join(f"{k}: {v}" for k, v in r["kernels_per_linear"].items())
                             if r["kernels_per_linear"] else "")
        ratio = f"{r['vs_today']:.3f}x" if r["vs_today"] is not None else "-"
        lines.append(f"| {r['fill_level']} | {r['real_rows']} | {r['kernel']} | {r['policy']} | "
                     f"{r['pass_rows'] or '-'} | {bench_report._fmt(r['pass_ms'], 3)} | "
                     f"{bench_report._fmt(r['ms_per_verified_token'], 4)} | {ratio} | "
                     f"{_cell(note)} |")
    return lines


def attention_table(rows: list[dict]) -> list[str]:
    lines = ["| kernel | case | what | bitwise | max diff | max err vs fp32 | note |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("kind") != "attention":
            continue
        flag = "-" if r["bitwise"] is None else ("yes" if r["bitwise"] else "no")
        lines.append(f"| {r['kernel']} | {r['case']} | {r['what']} | {flag} | "
                     f"{bench_report._fmt(r['max_abs_diff'], 5)} | "
                     f"{bench_report._fmt(r['max_abs_err_vs_fp32'], 4)} | "
                     f"{_cell(r['skip_reason'] or '')} |")
    return lines


def _cell(text: str) -> str:
    return str(text).replace("|", "/").replace("\n", " ")


def header(argv: list[str], ctx: dict) -> list[str]:
    meta, timing, shape = ctx["meta"], ctx["timing"], ctx["shape"]
    how = (f"CUDA graph replays, median of {timing['iters']} (CUDA events)"
           if meta["timing"] == "cuda-graph" else f"eager, median of {timing['iters']}")
    return [f"# Row invariance (issue 34 step 1): {meta['preset']} GEMMs and attention", "",
            f"`{shlex.join(['python', '-m', 'benchmarks.row_invariance', *argv])}`", "",
            (f"- device: {meta['device']}, torch {meta['torch']} (CUDA {meta['cuda']}), commit "
             f"{meta['git_commit']}"),
            (f"- M measured: {ranges(ctx['grid'], set(ctx['grid']))} ({len(ctx['grid'])} values;"
             f" a range spans consecutive measured M); reference: the same kernel's "
             f"{meta['max_rows']}-row GEMM; bf16 inputs N(0, 1), weights N(0, 0.02^2)"),
            ("- cases: prefix = the first M rows alone; permuted = those rows shuffled; offset = "
             "those rows at another offset of a batch whose other rows differ"),
            (f"- time: {how}, per GEMM over copies of the weight (read from HBM, not L2); pass = "
             f"{shape['layers']} x (qkv + o + gate_up + down) + lm_head-fp32")]


def plot(rows: list[dict], grid: list[int], path: Path) -> None:
    ms, ok = gemm_index(rows)
    linears = sorted({lin for _, lin, _ in ms}, key=lambda x: (*PER_LAYER, "lm_head",
                                                              HEAD).index(x))
    plt = bench_report._plt()
    fig, axes = plt.subplots(2, 3, figsize=(13, 7), squeeze=False)
    for ax, lin in zip(axes.flat, linears):
        for kernel in sorted({k for k, _, _ in ms}):
            pts = [(m, ms[(kernel, lin, m)]) for m in grid if (kernel, lin, m) in ms]
            if not pts:
                continue
            xs, ys = zip(*pts)
            (line,) = ax.plot(xs, ys, label=kernel, linewidth=1)
            bad = [(m, t) for m, t in pts if ok.get((kernel, lin, m)) is False]
            if bad:
                ax.scatter(*zip(*bad), marker="x", color=line.get_color(), s=14, zorder=3)
        ax.set_title(f"{lin} (x: not row-invariant at that M)", fontsize=8)
        ax.set_xlabel("rows M")
        ax.set_ylabel("ms per GEMM")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(linears):]:
        ax.axis("off")
    bench_report._save(plt, fig, path)


def write(rows: list[dict], out_dir: Path, argv: list[str], ctx: dict,
          fills: dict[str, float]) -> str:
    """table.md and row_invariance.png from the rows so far; returns the table."""
    layers = ctx["shape"]["layers"]
    max_rows = ctx["meta"]["max_rows"]
    parts = [*header(argv, ctx), "",
             f"## GEMMs: M at which the rows equal the {max_rows}-row GEMM's, bitwise", "",
             *gemm_table(rows, ctx["grid"]), "", "## GEMM time (ms per GEMM)", "",
             *time_table(rows, ctx["buckets"], max_rows, layers), "",
             "## Pass cost per verified token (GEMMs only)", "",
             (f"Fill levels: {', '.join(f'{k} = {v:.0%} real rows' for k, v in fills.items())}."
              " Policies: `benchmarks/row_invariance_report.py`."), "", *cost_table(rows)]
    if any(r.get("kind") == "attention" for r in rows):
        parts += ["", "## Attention: the target's 16 rows against its reference layout", "",
                  *attention_table(rows)]
    table = "\n".join(parts) + "\n"
    (out_dir / "table.md").write_text(table)
    if any(r.get("kind") == "gemm" and not r["skipped"] for r in rows):
        plot(rows, ctx["grid"], out_dir / "row_invariance.png")
    return table
