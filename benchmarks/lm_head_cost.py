"""What fp32 logits cost a decode step's LM head (issue 33), before and after they were limited to
deterministic rows.

    python -m benchmarks.lm_head_cost --out-dir DIR                       # Llama-3.1-8B shape
    python -m benchmarks.lm_head_cost --out-dir DIR --preset tiny --device cpu   # smoke test

Per decode batch size N, on the LM head alone ([N, hidden] @ [vocab, hidden]^T, bf16 weights):

  bf16          SGLang's LM head: a bf16 GEMM, the logits upcast to fp32 (what plain SGLang pays)
  fp32-all      fp32 logits for every row (llm42 before issue 33: one bf16 GEMM with fp32 output)
  fp32-det-P%   SGLang's bf16 head for every row, then the P % deterministic rows recomputed in
                fp32 and written over theirs (llm42 now: `llm42/sglang/fp32_logits.py`)
  one-gemm-P%   one GEMM with fp32 output for every row; the normal rows rounded to bf16, the P %
                deterministic rows kept in fp32 (a candidate: it reads the weights once)

Per N it also checks whether the one-GEMM layout gives normal rows SGLang's bits: SGLang's bf16
GEMM equal, bit for bit, to the fp32-output GEMM rounded to bf16 (`bf16_is_rounded_fp32`), and
then for every batch size N = 1 .. --check-rows (each decode graph size and eager batch a server
may run): `rounding.json` lists the N where it fails, and table.md says so in its header.

Each variant is a CUDA graph replay timed with events (`gemm_timing.timed`), like a decode step.
The extra ms over `bf16` is what a decode step pays for fp32 logits. Writes results.jsonl,
table.md and lm_head_cost.png.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections import defaultdict
from pathlib import Path

import torch
from tqdm import tqdm

from benchmarks import env_info, report
from benchmarks.gemm_timing import PRESETS, timed
from llm42.sglang.fp32_logits import bf16_is_rounded_fp32, fp32_matmul, one_gemm_exact


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.lm_head_cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--preset", default="llama-3.1-8b", choices=sorted(PRESETS))
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--batch-sizes", default="1,8,32,64,128,256")
    p.add_argument("--det-shares", default="0.1,1.0",
                   help="deterministic shares of the batch for the fp32-det variants")
    p.add_argument("--check-rows", type=int, default=256,
                   help="check bf16 == rounded fp32 for every N = 1 .. this (0: skip)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    return p


def variants(hidden: torch.Tensor, weight: torch.Tensor, shares: list[float]) -> dict:
    """name -> (callable, deterministic rows) over one batch of hidden states [N, H]."""
    n = hidden.shape[0]

    def bf16():
        return torch.matmul(hidden, weight.t()).float()

    out = {"bf16": (bf16, 0), "fp32-all": (lambda: fp32_matmul(hidden, weight), n)}
    for share in shares:
        k = max(1, round(n * share))
        index = torch.arange(0, n, max(1, n // k), device=hidden.device)[:k]

        def det_rows(index=index):
            logits = bf16()
            logits.index_copy_(0, index, fp32_matmul(hidden.index_select(0, index), weight))
            return logits
        out[f"fp32-det-{share:g}"] = (det_rows, int(index.numel()))

        def one_gemm(index=index):
            full = fp32_matmul(hidden, weight)
            logits = full.to(weight.dtype).float()
            logits.index_copy_(0, index, full.index_select(0, index))
            return logits
        out[f"one-gemm-{share:g}"] = (one_gemm, int(index.numel()))
    return out


def _random_head(shape: dict, device: torch.device, g: torch.Generator) -> torch.Tensor:
    """LM head weights [vocab, hidden], bf16, on `device`."""
    return (torch.randn(shape["vocab"], shape["hidden"], generator=g) * 0.02).to(
        device=device, dtype=torch.bfloat16)


def measure(args, shape: dict, device: torch.device, bar) -> list[dict]:
    g = torch.Generator(device="cpu").manual_seed(args.seed)
    weight = _random_head(shape, device, g)
    shares = [float(s) for s in args.det_shares.split(",") if s]
    rows = []
    for n in [int(b) for b in args.batch_sizes.split(",") if b]:
        hidden = torch.randn(n, shape["hidden"], generator=g).to(device=device,
                                                                 dtype=torch.bfloat16)
        base, rounded = None, bf16_is_rounded_fp32(hidden, weight)
        for name, (fn, det) in variants(hidden, weight, shares).items():
            ms, graphed, error = timed(fn, device, args.warmup, args.iters)
            base = ms if name == "bf16" else base
            rows.append({"batch_size": n, "variant": name, "det_rows": det, "ms": ms,
                         "extra_vs_bf16_ms": ms - base, "ratio_vs_bf16": ms / base,
                         "graphed": graphed, "graph_error": error,
                         "bf16_is_rounded_fp32": rounded})
            bar.update()
    return rows


def rounding_check(args, shape: dict, device: torch.device) -> dict:
    """The server's own check (`fp32_logits.one_gemm_exact`) for every N = 1 .. --check-rows."""
    weight = _random_head(shape, device, torch.Generator(device="cpu").manual_seed(args.seed + 1))
    unequal = [n for n in tqdm(range(1, args.check_rows + 1), desc="bf16 == rounded fp32, N")
               if not one_gemm_exact(weight, n)]
    return {"checked_rows": [1, args.check_rows], "unequal_rows": unequal,
            "all_equal": args.check_rows > 0 and not unequal}


def markdown(rows: list[dict], header: list[str]) -> str:
    cols = ["N", "variant", "fp32 rows", "ms", "extra ms vs bf16", "vs bf16", "graphed",
            "bf16 = rounded fp32"]
    lines = header + ["", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = [r["batch_size"], r["variant"], r["det_rows"], report._fmt(r["ms"], 4),
                 report._fmt(r["extra_vs_bf16_ms"], 4), f"{r['ratio_vs_bf16']:.3f}x",
                 report._fmt(r["graphed"]), report._fmt(r["bf16_is_rounded_fp32"])]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    series = defaultdict(list)
    for r in rows:
        series[r["variant"]].append((r["batch_size"], r["ms"]))
    plt = report._plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    report._plot_series(ax, series, "decode batch size N", "ms per LM head",
                        xscale={"value": "log", "base": 2})
    ax.set_title("LM head per decode step: bf16, fp32 for every row, fp32 for deterministic rows",
                 fontsize=9)
    report._save(plt, fig, path)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shape = PRESETS[args.preset]
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    name = (torch.cuda.get_device_name(device) if device.type == "cuda"
            else f"cpu: {env_info.cpu_model()}")
    num = len(args.batch_sizes.split(",")) * (2 + 2 * len(args.det_shares.split(",")))
    with tqdm(total=num, desc="(N, variant)") as bar:
        rows = measure(args, shape, device, bar)
    meta = {"device": name, "torch": torch.__version__, "git_commit": env_info.git_commit(),
            "preset": args.preset, "hidden": shape["hidden"], "vocab": shape["vocab"]}
    rounding = rounding_check(args, shape, device) if args.check_rows > 0 else None
    if rounding is not None:
        (out / "rounding.json").write_text(json.dumps({**meta, **rounding}, indent=1) + "\n")
    jsonl = out / "results.jsonl"
    jsonl.unlink(missing_ok=True)
    for row in rows:
        env_info.append_jsonl(jsonl, {**meta, **row})
    header = ["# LM head per decode step: what fp32 logits cost (issue 33)", "",
              f"`{shlex.join(['python', '-m', 'benchmarks.lm_head_cost', *argv])}`", "",
              f"- device: {name}, torch {torch.__version__}, commit {meta['git_commit']}",
              (f"- LM head [{shape['hidden']} -> {shape['vocab']}], bf16 weights; ms: median of "
               f"{args.iters} (CUDA graph replays on a GPU)")]
    if rounding is not None:
        bad = rounding["unequal_rows"]
        header.append(f"- bf16 GEMM == fp32-output GEMM rounded to bf16, N = 1 .. "
                      f"{args.check_rows}: " + ("**every N**" if not bad else
                                                f"**fails at {len(bad)} N** (first: {bad[:8]})"))
    table = markdown(rows, header)
    (out / "table.md").write_text(table)
    plot(rows, out / "lm_head_cost.png")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
