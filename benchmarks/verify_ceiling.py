"""Ceiling for issue 24: what a verifier that shares the decode step's weight read could gain.

    python -m benchmarks.verify_ceiling --out-dir DIR
    python -m benchmarks.verify_ceiling --out-dir DIR --preset tiny --device cpu   # smoke test

Today a verification pass is its own forward over B x W rows after the decode step, so each step
that runs one reads every weight twice. Decode at small batch is bound by that read; folding the
pass rows into the decode GEMMs (one read) could hide most of the pass, but only if the GEMM gives
the pass rows the same bits as a pass alone (batch invariance). This times Llama-3.1-8B's linear
layers (no attention, norms or activations) per decode batch size N with P pass rows:

  decode                 the stack over N rows: a step without a pass
  decode+pass            then the stack over P rows: today's design, a second weight read
  fused-cublas           one stack over N+P rows with F.linear: one read, not batch-invariant
                         (the lower bound)
  fused-batch-invariant  the same with SGLang's batch-invariant `matmul_persistent`
  two-gemms              per GEMM, the N rows then the P rows: two launches on one weight
  two-streams            the N-row stack and the P-row stack on two CUDA streams at once

and whether a fused run gives the pass rows the bits of a P-rows-alone run. On CUDA each variant
is replayed as a CUDA graph (as SGLang replays decode) and timed with events. Set
SGLANG_BATCH_INVARIANT_OPS_ENABLE_MM_DEEPGEMM=0 for `matmul_persistent`'s Triton kernel instead of
DeepGEMM. Writes results.jsonl (one row per N and variant, appended as each N ends), table.md and
ceiling.png.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from benchmarks import env_info, report
from benchmarks.gemm_timing import PRESETS, batch_invariant_linear, gemm_shapes, timed

VARIANTS = ("decode", "decode+pass", "fused-cublas", "fused-batch-invariant", "two-gemms",
            "two-streams")
BITWISE = ("fused-cublas", "fused-batch-invariant")
# Per layer: (weight, input, whether the output becomes the residual stream x). o and down read
# fixed stand-ins for the attention output and SiLU(gate) * up, whose ops are excluded.
LAYER_GEMMS = (("qkv", "x", False), ("o", "attn", True), ("gate_up", "x", False),
               ("down", "act", True))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out-dir", required=True,
                   help="results.jsonl (rewritten), table.md, ceiling.png")
    p.add_argument("--preset", choices=PRESETS, default="llama-3.1-8b")
    for name in PRESETS["tiny"]:
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=None,
                       help="overrides the preset's")
    p.add_argument("--decode-rows", default="32,64,128,256", help="decode batch sizes N")
    p.add_argument("--pass-rows", type=int, default=512, help="P: B x W of one pass (32 x 16)")
    p.add_argument("--iters", type=int, default=30, help="timed replays per variant (median)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--seed", type=int, default=0)
    return p


def make_model(s: dict, device: torch.device, seed: int) -> tuple[list[dict], torch.Tensor]:
    torch.manual_seed(seed)

    def weight(k: int, n: int) -> torch.Tensor:
        return torch.randn(n, k, dtype=torch.bfloat16, device=device).mul_(0.02)

    layers = [{name: weight(k, n) for name, (k, n) in gemm_shapes(s).items()}
              for _ in range(s["layers"])]
    return layers, weight(s["hidden"], s["vocab"])


def make_inputs(s: dict, rows: int, device: torch.device, seed: int) -> dict[str, torch.Tensor]:
    """Contiguous inputs, as the excluded ops would write them (DeepGEMM wants contiguous rows)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dims = {"x": s["hidden"], "attn": s["heads"] * s["head_dim"], "act": s["intermediate"]}
    return {k: torch.randn(rows, d, generator=gen, device=device).to(torch.bfloat16)
            for k, d in dims.items()}


def stack(parts: list[dict], layers: list[dict], lm_head: torch.Tensor, linear,
          keep: list | None = None) -> None:
    """Every GEMM over each row group in turn: one group reads each weight once, two groups run
    two launches on the same weight back to back. `keep` collects the outputs (bitwise check)."""
    def gemm(x, w):
        out = linear(x, w)
        if keep is not None:
            keep.append(out)
        return out

    xs = [part["x"] for part in parts]
    for layer in layers:
        for name, src, to_x in LAYER_GEMMS:
            for i, part in enumerate(parts):
                out = gemm(xs[i] if src == "x" else part[src], layer[name])
                xs[i] = out if to_x else xs[i]
    for x in xs:
        gemm(x, lm_head)


def on_two_streams(first, second):
    """`second` on a side stream alongside `first`; fork and join are captured into the graph."""
    side = torch.cuda.Stream()

    def run():
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        first()
        with torch.cuda.stream(side):
            second()
        main.wait_stream(side)
    return run


def variant_fns(model, dec: dict, pas: dict, fused: dict, bi, cuda: bool) -> dict:
    """Each variant as a no-argument callable, or the reason it cannot run here."""
    def run(*parts, linear=F.linear):
        return lambda: stack(list(parts), *model, linear)

    def decode_then_pass():
        run(dec)()
        run(pas)()
    return {"decode": run(dec), "decode+pass": decode_then_pass, "fused-cublas": run(fused),
            "fused-batch-invariant": run(fused, linear=bi) if callable(bi) else bi,
            "two-gemms": run(dec, pas),
            "two-streams": on_two_streams(run(dec), run(pas)) if cuda else "needs CUDA streams"}


def pass_rows_bitwise(model, fused: dict, pas: dict, n: int, linear) -> bool:
    """Whether every GEMM gives the pass rows the same bits inside the N+P batch as alone: what
    lets one fused forward stand in for the verification pass."""
    both, alone = [], []
    stack([fused], *model, linear, keep=both)
    stack([pas], *model, linear, keep=alone)
    return all(torch.equal(b[n:], a) for b, a in zip(both, alone))


def add_ratios(rows: list[dict]) -> None:
    """Against decode alone (what the pass rows cost a step) and against decode+pass (what sharing
    the weight read saves)."""
    ms = {r["variant"]: r["ms"] for r in rows}
    decode, both = ms.get("decode"), ms.get("decode+pass")
    for r in rows:
        has = r["ms"] is not None
        r["ratio_vs_decode"] = r["ms"] / decode if has and decode else None
        r["extra_vs_decode_ms"] = r["ms"] - decode if has and decode else None
        r["ratio_vs_decode_plus_pass"] = r["ms"] / both if has and both else None


def measure_n(n: int, args, ctx: dict, bar) -> list[dict]:
    """One row per variant at N decode rows (the P pass rows' values are the same for every N)."""
    dev, model, pas = ctx["device"], ctx["model"], ctx["pass"]
    dec = make_inputs(ctx["shape"], n, dev, args.seed + 2 + n)
    fused = {k: torch.cat([dec[k], pas[k]]) for k in dec}
    rows = []
    for name, fn in variant_fns(model, dec, pas, fused, ctx["bi"], dev.type == "cuda").items():
        bar.set_postfix_str(f"N={n} {name}")
        skip = fn if isinstance(fn, str) else None
        row = dict(ctx["meta"], decode_rows=n, variant=name, ms=None, graphed=None,
                   graph_error=None, skipped=skip is not None, skip_reason=skip,
                   pass_rows_bitwise_vs_alone=None,
                   kernel=ctx["bi_kernel"] if name == "fused-batch-invariant" else None)
        if skip is None:
            try:
                row["ms"], row["graphed"], row["graph_error"] = timed(fn, dev, args.warmup,
                                                                      args.iters)
                if name in BITWISE:
                    linear = ctx["bi"] if name == "fused-batch-invariant" else F.linear
                    row["pass_rows_bitwise_vs_alone"] = pass_rows_bitwise(model, fused, pas, n,
                                                                          linear)
            except Exception as e:  # noqa: BLE001 - a failed variant is a skipped row
                reason = f"failed: {type(e).__name__}: {e}"[:300]
                row.update(ms=None, skipped=True, skip_reason=reason)
                if name == "fused-batch-invariant":
                    ctx["bi"] = row["skip_reason"]  # fails the same way at every N
        rows.append(row)
        bar.update()
    add_ratios(rows)
    return rows


def markdown(rows: list[dict], header: list[str]) -> str:
    cols = ["N", "P", "variant", "ms", "vs decode", "extra ms", "vs decode+pass", "graphed",
            "pass rows bitwise vs alone", "note"]
    lines = header + ["", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]

    def ratio(v):
        return f"{v:.3f}x" if v is not None else "-"
    for r in rows:
        flag = r["pass_rows_bitwise_vs_alone"]
        note = r["skip_reason"] or (f"eager: {r['graph_error']}" if r["graph_error"] else "")
        note = (f"{r['kernel']} " if r["kernel"] else "") + note
        cells = [r["decode_rows"], r["pass_rows"], r["variant"], report._fmt(r["ms"], 3),
                 ratio(r["ratio_vs_decode"]), report._fmt(r["extra_vs_decode_ms"], 3),
                 ratio(r["ratio_vs_decode_plus_pass"]), report._fmt(r["graphed"]),
                 "-" if flag is None else ("yes" if flag else "no"), note.replace("|", "/")]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    series = defaultdict(list)
    for r in rows:
        if r["ms"] is not None:
            series[r["variant"]].append((r["decode_rows"], r["ms"]))
    plt = report._plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    report._plot_series(ax, series, "decode rows N", "ms per step (linear layers only)",
                        xscale={"value": "log", "base": 2})
    ax.set_title(f"decode step with a {rows[0]['pass_rows']}-row verification pass", fontsize=9)
    report._save(plt, fig, path)


def setup(args) -> dict:
    """Weights, the pass rows (the same for every N), the batch-invariant linear and the facts
    every row records."""
    shape = {k: v if getattr(args, k) is None else getattr(args, k)
             for k, v in PRESETS[args.preset].items()}
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = device.type == "cuda"
    name = torch.cuda.get_device_name(device) if cuda else f"cpu: {env_info.cpu_model()}"
    bi, bi_kernel = batch_invariant_linear() if cuda else ("Triton kernel: needs CUDA", None)
    return {"shape": shape, "device": device, "bi": bi, "bi_kernel": bi_kernel,
            "model": make_model(shape, device, args.seed),
            "pass": make_inputs(shape, args.pass_rows, device, args.seed + 1),
            "meta": {"pass_rows": args.pass_rows, "device": name, "torch": torch.__version__,
                     "git_commit": env_info.git_commit(), "preset": args.preset, **shape}}


def header(argv: list[str], ctx: dict) -> list[str]:
    shape, meta = ctx["shape"], ctx["meta"]
    gemms = ", ".join(f"{k} [{i} -> {o}]" for k, (i, o) in gemm_shapes(shape).items())
    return [f"# Verify ceiling (issue 24): linear layers only, {shape['layers']} layers + lm_head",
            "", f"`{shlex.join(['python', '-m', 'benchmarks.verify_ceiling', *argv])}`", "",
            f"- device: {meta['device']}, torch {meta['torch']}, commit {meta['git_commit']}",
            f"- per layer: {gemms}; lm_head [{shape['hidden']} -> {shape['vocab']}]; bf16",
            ("- attention, norms, activations and embeddings excluded: o and down read fixed "
             "stand-ins for their inputs"),
            ("- ms: median per step; graphed: timed as CUDA graph replays; bitwise: every GEMM "
             "output of the pass rows equal, fused N+P run vs P rows alone")]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ctx = setup(args)
    jsonl = out / "results.jsonl"
    jsonl.unlink(missing_ok=True)
    ns = [int(n) for n in args.decode_rows.split(",") if n]
    rows = []
    with tqdm(total=len(ns) * len(VARIANTS), desc="(N, variant)") as bar:
        for n in ns:
            for row in measure_n(n, args, ctx, bar):
                env_info.append_jsonl(jsonl, row)  # kept if a deadline stops the run
                rows.append(row)
    table = markdown(rows, header(argv, ctx))
    (out / "table.md").write_text(table)
    plot(rows, out / "ceiling.png")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
