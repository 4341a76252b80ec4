"""Issue 34 step 1: does a row's result depend only on the row? GEMMs and attention, bitwise.

    python -m benchmarks.row_invariance --out-dir DIR                       # 8B shape, GPU
    python -m benchmarks.row_invariance --out-dir DIR --preset tiny --device cpu --quick

A row-invariant verifier could size each pass to the rows that are ready (padded to a few bucket
sizes for CUDA graphs) instead of always computing B x W = 512 rows, if every row's bits depend
on the row alone. For each linear layer of the shape (qkv, o, gate_up, down, lm_head with bf16
and with fp32 output) and each GEMM kernel, for every M of the grid (default: every M from 1 to
64, then every 8 up to 512), three cases against the rows of the same kernel's 512-row GEMM:

  prefix    the first M rows alone
  permuted  the same M rows in a shuffled order
  offset    the M rows at another offset of a 512-row batch whose other rows differ
            (n/a at M = 512)

Kernels: `cublas` (F.linear; fp32 output from torch.mm(out_dtype=float32) where torch has it,
else upcast inputs), `batch-invariant` (SGLang's `matmul_persistent`; its fp32 output is its
bf16 output upcast, as SGLang's mm(out_dtype) compat does), `row-invariant` (this repository's
fixed-tile Triton GEMM, `row_invariant_mm`). Each M is timed as a CUDA graph replay (CUDA
events, median) over enough copies of the weight to exceed L2 (`--weight-mib`), so the weight is
read from HBM as in a model; graph_matches_eager says whether the replay's rows equal eager's.

Attention (`row_invariance_attention`): per backend, a request's 16 query rows alone against
batched with other requests and split differently into prefix and extend.

Writes row_invariance.jsonl (one row per kernel, linear, M and case; then the pass-cost rows,
the attention rows and a summary row with the seconds each phase took), table.md (invariant M
per kernel and linear, time at the bucket sizes, the pass cost per verified token at issue 34's
fill levels, attention) and row_invariance.png, rewritten after each phase. Set
SGLANG_BATCH_INVARIANT_OPS_ENABLE_MM_DEEPGEMM=0 for SGLang's Triton kernel.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from benchmarks import env_info
from benchmarks import row_invariance_attention as attention
from benchmarks import row_invariance_report as report
from benchmarks.gemm_timing import PRESETS, batch_invariant_linear, gemm_shapes, timed

KERNELS = ("cublas", "batch-invariant", "row-invariant")
LINEARS = ("qkv", "o", "gate_up", "down", "lm_head", "lm_head-fp32")
CASES = ("prefix", "permuted", "offset")
DEFAULT_GRID = "1-64,72-512/8"
QUICK_GRID = "1,3,16,64"
DEFAULT_BUCKETS = "192,256,320,384,448,512"
JSONL = "row_invariance.jsonl"
OFFSET = 37  # odd: the moved rows straddle every tile boundary


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out-dir", required=True,
                   help="row_invariance.jsonl (rewritten), table.md, row_invariance.png")
    p.add_argument("--preset", choices=PRESETS, default="llama-3.1-8b")
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--m-grid", default=None,
                   help=f"rows M to check: a,b-c,d-e/step (default {DEFAULT_GRID}; --quick "
                        f"{QUICK_GRID}); the buckets and --max-rows are always added")
    p.add_argument("--max-rows", type=int, default=512, help="the reference GEMM's rows (B x W)")
    p.add_argument("--buckets", default=DEFAULT_BUCKETS, help="pass sizes a bucketed pass uses")
    p.add_argument("--fill-levels", default=",".join(f"{k}={v}" for k, v in
                                                     report.FILL_LEVELS.items()),
                   help="name=share of a full pass's rows that are real")
    p.add_argument("--kernels", default=",".join(KERNELS))
    p.add_argument("--attention", default=",".join(attention.KERNELS),
                   help="attention kernels to check ('' for none)")
    p.add_argument("--iters", type=int, default=None, help="timed replays per M (default 10)")
    p.add_argument("--warmup", type=int, default=None, help="default 3")
    p.add_argument("--weight-mib", type=float, default=256.0,
                   help="time over copies of each weight totalling at least this (beats L2)")
    p.add_argument("--quick", action="store_true",
                   help="a few M, 3 replays, short attention sequences: a smoke test")
    p.add_argument("--budget-s", type=float, default=None,
                   help="stop starting work after this many seconds (skipped rows say so)")
    p.add_argument("--seed", type=int, default=0)
    return p


def parse_grid(text: str) -> list[int]:
    """"1-4,8-16/4,20" -> [1, 2, 3, 4, 8, 12, 16, 20]."""
    out = set()
    for item in filter(None, (s.strip() for s in text.split(","))):
        span, _, step = item.partition("/")
        lo, _, hi = span.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1, int(step or 1)))
    return sorted(out)


def linear_specs(shape: dict) -> dict[str, tuple[int, int, torch.dtype]]:
    """(K, N, output dtype) of every linear checked."""
    specs = {name: (k, n, torch.bfloat16) for name, (k, n) in gemm_shapes(shape).items()}
    specs["lm_head"] = (shape["hidden"], shape["vocab"], torch.bfloat16)
    specs["lm_head-fp32"] = (shape["hidden"], shape["vocab"], torch.float32)
    return specs


def fp32_mm(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, str]:
    """x @ w^T in fp32 from bf16 operands, as `--llm42-fp32-logits` computes its logits, and the
    path taken."""
    try:
        return torch.mm(x, w.t(), out_dtype=torch.float32), "mm-out-dtype"
    except (RuntimeError, TypeError, NotImplementedError):
        return torch.matmul(x.float(), w.float().t()), "upcast"


def kernel_fns(device: torch.device) -> dict:
    """Each kernel as (x [M, K], w [N, K], out_dtype) -> [M, N] with a note, or why it cannot
    run here."""
    cuda = device.type == "cuda"

    def cublas(x, w, out_dtype):
        return F.linear(x, w) if out_dtype == torch.bfloat16 else fp32_mm(x, w)[0]

    path = fp32_mm(torch.ones(1, 1, dtype=torch.bfloat16, device=device),
                   torch.ones(1, 1, dtype=torch.bfloat16, device=device))[1]
    fns = {"cublas": (cublas, f"fp32 output: {path}")}
    bi, bi_kernel = batch_invariant_linear() if cuda else ("Triton kernel: needs CUDA", None)
    fns["batch-invariant"] = bi if isinstance(bi, str) else (
        lambda x, w, out_dtype: bi(x, w).to(out_dtype),
        f"{bi_kernel}; fp32 output: bf16 upcast")
    if not cuda:
        fns["row-invariant"] = "Triton kernel: needs CUDA"
    else:
        try:
            import triton  # noqa: F401

            from benchmarks.row_invariant_mm import row_invariant_linear
            fns["row-invariant"] = (row_invariant_linear, "fixed tiles per (N, K), no split-K")
        except ImportError as e:
            fns["row-invariant"] = f"Triton unavailable: {e}"[:300]
    return fns


def diff(got: torch.Tensor, want: torch.Tensor) -> dict:
    """Bitwise equality of two row blocks, how many rows differ and by how much."""
    same_rows = (got.view(got.shape[0], -1) == want.view(want.shape[0], -1)).all(dim=1)
    bad = int((~same_rows).sum())
    max_abs = float((got.float() - want.float()).abs().max()) if bad else 0.0
    return {"bitwise": bad == 0, "rows_differing": bad, "max_abs_diff": max_abs}


def check_linear(fn, weights: list[torch.Tensor], x: torch.Tensor, mates: torch.Tensor,
                 ms: list[int], out_dtype: torch.dtype, timing: dict, seed: int,
                 on_m=None) -> list[dict]:
    """One row per (M, case) for one kernel and linear: x [R, K] are the reference rows (R =
    --max-rows), mates [R, K] the other rows of the offset case; weights are copies of one
    weight (timing reads them all). `timing`: device, warmup, iters, deadline. A kernel that
    raises at one M is not run at the next ones (their rows say why)."""
    gen = torch.Generator().manual_seed(seed)
    out, broken = [], None
    try:
        ref = fn(x, weights[0], out_dtype)
    except Exception as e:  # noqa: BLE001 - a kernel that fails is skipped
        ref, broken = None, _failure(e, timing["device"])
    for m in ms:
        if on_m:
            on_m(m)
        if broken or (timing.get("deadline") and time.monotonic() > timing["deadline"]):
            out += [skip_row(m, case, broken or "out of time (--budget-s)") for case in CASES]
            continue
        try:
            out += check_m(fn, weights, x, mates, m, out_dtype, ref, timing, gen)
        except Exception as e:  # noqa: BLE001
            broken = _failure(e, timing["device"])
            out += [skip_row(m, case, broken) for case in CASES]
    return out


def check_m(fn, weights, x, mates, m, out_dtype, ref, timing, gen) -> list[dict]:
    """The three cases at M rows, and the time of an M-row GEMM."""
    rows_max = x.shape[0]
    xm = x[:m]
    holder = []

    def run():
        holder[:] = [fn(xm, weights[0], out_dtype)]  # after a graph replay: the replay's rows
        for w in weights[1:]:
            fn(xm, w, out_dtype)
    ms_all, graphed, graph_error = timed(run, timing["device"], timing["warmup"],
                                         timing["iters"])
    eager = fn(xm, weights[0], out_dtype)
    common = {"m": m, "ms": ms_all / len(weights), "graphed": graphed, "graph_error": graph_error,
              "skipped": False, "skip_reason": None}
    prefix = diff(eager, ref[:m])
    prefix["graph_matches_eager"] = bool(torch.equal(holder[0], eager)) if graphed else None
    perm = torch.randperm(m, generator=gen).to(x.device)
    permuted = diff(fn(xm[perm], weights[0], out_dtype), ref[:m][perm])
    if m < rows_max:
        at = min(OFFSET, rows_max - m)
        batch = mates.clone()
        batch[at:at + m] = xm
        offset = dict(diff(fn(batch, weights[0], out_dtype)[at:at + m], ref[:m]), offset=at)
    else:
        offset = {"bitwise": None, "note": f"n/a: {m} rows fill the {rows_max}-row batch"}
    return [{**common, "case": case, "rows_differing": None, "max_abs_diff": None,
             "offset": None, "graph_matches_eager": None, "note": None, **result}
            for case, result in zip(CASES, (prefix, permuted, offset))]


def _failure(e: Exception, device: torch.device) -> str:
    if device.type == "cuda":
        try:
            torch.cuda.synchronize()
        except Exception:  # noqa: BLE001, S110 - a sticky CUDA error fails every later kernel
            pass
    return f"failed: {type(e).__name__}: {e}"[:300]


def skip_row(m: int, case: str, reason: str) -> dict:
    return {"m": m, "case": case, "ms": None, "graphed": None, "graph_error": None,
            "bitwise": None, "rows_differing": None, "max_abs_diff": None, "offset": None,
            "graph_matches_eager": None, "note": None, "skipped": True, "skip_reason": reason}


def weight_copies(k: int, n: int, layers: int, weight_mib: float) -> int:
    """Copies of a [N, K] bf16 weight whose total reaches `weight_mib` (at most one per layer)."""
    return max(1, min(layers, math.ceil(weight_mib * 2**20 / (2 * k * n))))


def run_gemms(args, ctx: dict, emit) -> None:
    """Every (kernel, linear): its rows handed to `emit` as each ends."""
    dev, shape, ms = ctx["device"], ctx["shape"], ctx["grid"]
    specs = linear_specs(shape)
    fns = kernel_fns(dev)
    kernels = [k for k in args.kernels.split(",") if k]
    gen = torch.Generator(device=dev).manual_seed(args.seed)

    def randn(*size):
        return torch.randn(*size, generator=gen, device=dev).to(torch.bfloat16)
    inputs = {k: (randn(args.max_rows, k), randn(args.max_rows, k))
              for k in sorted({k for k, _, _ in specs.values()})}
    weights = {}
    for name, (k, n, _) in specs.items():
        same = "lm_head" if name == "lm_head-fp32" else name
        if same not in weights:
            copies = weight_copies(k, n, shape["layers"], args.weight_mib)
            weights[same] = [randn(n, k).mul_(0.02) for _ in range(copies)]
    with tqdm(total=len(kernels) * len(specs) * len(ms), desc="(kernel, linear, M)",
              mininterval=2.0) as bar:
        for kernel in kernels:
            entry = fns.get(kernel, f"unknown kernel (one of {', '.join(KERNELS)})")
            for name, (k, n, out_dtype) in specs.items():
                ws = weights["lm_head" if name == "lm_head-fp32" else name]
                meta = {"kernel": kernel, "linear": name, "k": k, "n": n,
                        "out_dtype": str(out_dtype).removeprefix("torch."), "copies": len(ws),
                        "kernel_note": None if isinstance(entry, str) else entry[1]}
                if isinstance(entry, str):
                    got = [skip_row(m, c, entry) for m in ms for c in CASES]
                    bar.update(len(ms))
                else:
                    label = f"{kernel} {name}"
                    got = check_linear(entry[0], ws, *inputs[k], ms, out_dtype, ctx["timing"],
                                       args.seed, on_m=lambda m, label=label: (
                                           bar.set_postfix_str(f"{label} M={m}"), bar.update()))
                emit([{**meta, **row} for row in got])


def setup(args) -> dict:
    shape = dict(PRESETS[args.preset])
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = device.type == "cuda"
    grid = parse_grid(args.m_grid or (QUICK_GRID if args.quick else DEFAULT_GRID))
    buckets = parse_grid(args.buckets)
    grid = sorted({m for m in [*grid, *buckets, args.max_rows] if 1 <= m <= args.max_rows})
    name = torch.cuda.get_device_name(device) if cuda else f"cpu: {env_info.cpu_model()}"
    iters = args.iters or (3 if args.quick else 10)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    start = time.monotonic()
    return {"shape": shape, "device": device, "grid": grid, "buckets": buckets, "start": start,
            "timing": {"device": device, "warmup": warmup, "iters": iters,
                       "deadline": start + args.budget_s if args.budget_s else None},
            "meta": {"device": name, "torch": torch.__version__, "cuda": torch.version.cuda,
                     "git_commit": env_info.git_commit(), "preset": args.preset,
                     "max_rows": args.max_rows, "timing": "cuda-graph" if cuda else "eager",
                     # cuBLAS may reduce bf16 GEMMs in bf16 (split-K) when this is on
                     "bf16_reduced_precision_reduction":
                         torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction}}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ctx = setup(args)
    jsonl = out / JSONL
    jsonl.unlink(missing_ok=True)
    rows: list[dict] = []
    fills = report.parse_fills(args.fill_levels)
    seconds = {}

    def add(kind: str, got: list[dict]) -> None:
        for row in got:
            row = {**ctx["meta"], "kind": kind, **row}
            env_info.append_jsonl(jsonl, row)  # kept if a deadline stops the run
            rows.append(row)
    t0 = time.monotonic()
    run_gemms(args, ctx, lambda got: add("gemm", got))
    add("pass-cost", report.pass_costs(rows, ctx["shape"]["layers"], ctx["buckets"],
                                       args.max_rows, fills))
    seconds["gemm"] = time.monotonic() - t0
    report.write(rows, out, argv, ctx, fills)
    t0 = time.monotonic()
    add("attention", attention.run([k for k in args.attention.split(",") if k], ctx,
                                   quick=args.quick, seed=args.seed))
    seconds["attention"] = time.monotonic() - t0
    add("summary", [{"phase_seconds": {k: round(v, 1) for k, v in seconds.items()},
                     "elapsed_s": round(time.monotonic() - ctx["start"], 1),
                     "finished": datetime.now(timezone.utc).isoformat(timespec="seconds")}])
    print(report.write(rows, out, argv, ctx, fills))
    return 0


if __name__ == "__main__":
    sys.exit(main())
