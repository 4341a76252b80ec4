"""How long a planned GPU call takes, before spending device time on it.

    DRY_RUN=1 OUT=/tmp/plan BENCH_CONFIGS=... bash benchmarks/gpu/run_gpu_suite.sh STEP ...
    python -m benchmarks.gpu.estimate /tmp/plan/dry_run.jsonl --budget-s 570

Reads the driver commands the suite would run and prices each server start and each
benchmark run from the rows already recorded under `benchmarks/results/` (the same workload,
config and ratio, the newest such row; between two recorded ratios of that config a linear
interpolation, outside them the nearest; without any, the workload's nondet run times a rough
factor, flagged as a guess; a run of another size scales with its prompt count). A run no
recorded row resembles is priced at `--unknown-run-s` and flagged. An llm42 run is priced from
rows of its own window when there are any. Configs the driver switches in at runtime
(`--switch-variants`: skip / inject, the other windows of a sweep) add runs, not starts.
Server starts on the H200 took 54-118 s (decode CUDA-graph capture, process start), the suite's
setup 20-35 s per call, and each run adds ~20 s of client start and dataset loading: the
defaults. A `benchmarks.row_invariance` run (no server) is priced from the newest recorded
run's elapsed seconds (its summary row) when there is one, else at `--row-invariance-s`, flagged
as a guess. A `benchmarks.determinism_proof --launch` is a server start plus its trials, each
priced from the newest recorded proof of the same model (the mean trial of that mode at the
nearest background level, scaled by requests x new tokens; a speculative server from a proof
with the same `--speculative-algorithm` when there is one, else as a server without it, flagged),
else at `--proof-trial-s`, flagged. Model preparation (SmolLM2's GGUF conversion, ~45 s once
per machine) is not in the plan: add it to `--setup-s`. Exit 1 when the call does not fit its
budget.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks import driver

RESULTS_ROOT = Path(__file__).resolve().parents[1] / "results"
ROW_INVARIANCE_START_S = 15.0  # python, torch and CUDA start before a row_invariance run's clock
_PROMPTS = re.compile(r" n=(\d+)")


@dataclass
class Priced:
    what: str
    seconds: float
    source: str  # the recorded row it was priced from, or why it was not


def recorded_rows(root: Path = RESULTS_ROOT) -> list[dict]:
    rows = []
    for path in sorted(root.rglob("results.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line) if line.strip() else {}
            if row.get("duration") and not row.get("skipped"):
                rows.append({**row, "_file": str(path.relative_to(root))})
    return rows


def _shape(workload: str) -> tuple[str, int | None]:
    """("sharegpt", 2048) from "sharegpt n=2048": the workload without its size, and the size."""
    match = _PROMPTS.search(workload)
    return _PROMPTS.sub("", workload), int(match.group(1)) if match else None


def price_run(rows: list[dict], model: str, workload: str, config: str, ratio: float,
              meta: dict, unknown_s: float) -> tuple[float, str]:
    """Seconds of one benchmark run, scaled from the closest recorded row; `meta` is the
    server config's (comparison skipped, mismatches injected)."""
    shape, prompts = _shape(workload)
    skip = bool(meta.get("skip_compare"))
    inject = bool(meta.get("inject_mismatch_rate"))
    mine = [r for r in rows if Path(str(r.get("model"))).name == Path(model).name
            and _shape(r.get("workload") or "")[0] == shape]
    same = [r for r in mine if r.get("config") == config
            and bool(r.get("skip_compare")) == skip
            and bool(r.get("inject_mismatch_rate")) == inject
            and r.get("speculative_algorithm") == meta.get("speculative_algorithm")]
    # a sweep's windows cost differently (passes against re-decoded tails): its own window's
    # rows when there are any
    window = [r for r in same if r.get("window_size") == meta.get("window_size")]
    same = window if meta.get("window_size") and window else same
    if not same:
        nondet = _newest([r for r in mine if r.get("config") == "nondet"], 0.0)
        if nondet is None or config not in _VS_NONDET:
            return unknown_s, "no recorded run of this workload and config"
        factor = _VS_NONDET[config](ratio)
        return _scaled(nondet, prompts) * factor, f"{_name(nondet)} x {factor:.2f} (a guess)"
    lower = _newest([r for r in same if (r.get("det_ratio") or 0.0) <= ratio], ratio)
    upper = _newest([r for r in same if (r.get("det_ratio") or 0.0) >= ratio], ratio)
    if lower is None or upper is None:  # outside the recorded ratios: the nearest one
        only = lower or upper
        return _scaled(only, prompts), _name(only)
    lo, hi = lower.get("det_ratio") or 0.0, upper.get("det_ratio") or 0.0
    weight = 0.0 if hi == lo else (ratio - lo) / (hi - lo)
    seconds = (1 - weight) * _scaled(lower, prompts) + weight * _scaled(upper, prompts)
    source = _name(lower) if lower is upper else f"{_name(lower)} .. {_name(upper)}"
    return seconds, source


# With no recorded run of a config: its nondet run of that workload times a rough factor, from
# the H200 ratios (llm42 at 10 % 0.90-0.98x, 50 % 0.55x, 100 % ~0.5x; sglang-det 0.34-0.46x).
# nondet-defaults (radix cache and prefill graphs on), nondet-no-overlap and nondet-spec
# (speculative decoding) are priced like nondet until measured; llm42 with speculative decoding
# like llm42 without.
_VS_NONDET = {"llm42": lambda ratio: 1.0 + ratio, "sglang-det": lambda ratio: 3.0,
              "nondet-defaults": lambda ratio: 1.0, "nondet-no-overlap": lambda ratio: 1.0,
              "nondet-spec": lambda ratio: 1.0}


def _newest(rows: list[dict], ratio: float) -> dict | None:
    """Of the rows nearest to `ratio`, the newest: code and hosts change."""
    if not rows:
        return None
    gap = min(abs((r.get("det_ratio") or 0.0) - ratio) for r in rows)
    return max((r for r in rows if abs((r.get("det_ratio") or 0.0) - ratio) == gap),
               key=lambda r: r.get("timestamp") or "")


def _scaled(row: dict, prompts: int | None) -> float:
    got = _shape(row["workload"])[1]
    return row["duration"] * (prompts / got if prompts and got else 1.0)


def _name(row: dict) -> str:
    return f"{row['_file']} ({row['workload']}, ratio {row.get('det_ratio')})"


def price_driver(argv: list[str], rows: list[dict], start_s: float, overhead_s: float,
                 unknown_s: float, prestarted_start_s: float | None = None) -> list[Priced]:
    """Each start at `start_s`; with --prestart-next every start after the first at
    `prestarted_start_s` (its imports done while the previous config ran)."""
    args = driver.build_parser().parse_args(argv)
    bench_args = shlex.split(args.bench_args or "")
    workloads = [driver.workload_label(shlex.split(w), bench_args)
                 for w in (args.workload or ["--dataset-name sharegpt"])]
    out = []
    for i, cfg in enumerate(driver.server_configs(args)):
        if i and args.prestart_next and prestarted_start_s is not None:
            out.append(Priced(f"start {cfg.label} (prestarted)", prestarted_start_s,
                              "--prestarted-start-s"))
        else:
            out.append(Priced(f"start {cfg.label}", start_s, "--start-s"))
        for each in [cfg, *cfg.switched]:
            for wl in workloads:
                for ratio, repeat in itertools.product(each.ratios, range(args.repeats)):
                    seconds, source = price_run(rows, args.model_path, wl, each.config, ratio,
                                                each.meta, unknown_s)
                    again = f" repeat {repeat}" if args.repeats > 1 else ""
                    out.append(Priced(f"run {each.label} {wl} ratio {ratio:g}{again}",
                                      seconds + overhead_s, source))
    return out


def price_row_invariance(argv: list[str], root: Path, guess_s: float) -> Priced:
    """The newest recorded run's seconds (plus interpreter start), else the guess; never more
    than its --budget-s allows (it starts no work past it) plus the last item's 30 s."""
    from benchmarks import row_invariance

    args = row_invariance.build_parser().parse_args(argv)
    runs = []
    for path in sorted(root.rglob(row_invariance.JSONL)):
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line) if line.strip() else {}
            if row.get("kind") == "summary" and row.get("preset") == args.preset:
                runs.append((row.get("finished") or "", str(path.relative_to(root)),
                             row["elapsed_s"]))
    if runs:
        _, source, seconds = max(runs)
        seconds += ROW_INVARIANCE_START_S
    else:
        source, seconds = "no recorded run: a guess", guess_s / (3 if args.quick else 1)
    if args.budget_s is not None:
        seconds = min(seconds, args.budget_s + ROW_INVARIANCE_START_S + 30)
    return Priced(f"row-invariance {args.preset}{' --quick' if args.quick else ''}", seconds,
                  source)


def recorded_proofs(root: Path = RESULTS_ROOT) -> list[dict]:
    out = []
    # big proofs are committed gzipped (proof.json.gz)
    for path in sorted([*root.rglob("proof.json"), *root.rglob("proof.json.gz")]):
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as f:
            proof = json.load(f)
        out.append({**proof, "_file": str(path.relative_to(root))})
    return out


def _algorithm(server_args: str | None) -> str | None:
    algorithm = driver._opts(shlex.split(server_args or "")).get("--speculative-algorithm")
    return algorithm.upper() if algorithm else None


def price_proof(argv: list[str], proofs: list[dict], start_s: float,
                guess_trial_s: float) -> list[Priced]:
    """A determinism proof: its server start (with --launch), then each mode's trials."""
    from benchmarks import determinism_proof

    args = determinism_proof.build_parser().parse_args(argv)
    features = tuple(f for f in args.features.split(",") if f)
    work = len(determinism_proof.det_requests(args.num_prompts, args.seed, features,
                                              args.lora_name)) * args.max_new_tokens
    algorithm = _algorithm(args.server_args)
    mine = [p for p in proofs if Path(str(p.get("model"))).name == Path(
        str(args.model_path)).name]
    same = [p for p in mine if _algorithm(p.get("server_args")) == algorithm]
    note = f" (priced as without {algorithm}: a guess)" if algorithm and not same else ""
    mine = sorted(same or [p for p in mine if not _algorithm(p.get("server_args"))],
                  key=lambda p: p.get("timestamp") or "", reverse=True)
    name = Path(args.out_dir).name
    out = [Priced(f"start proof {name}", start_s, "--start-s")] if args.launch else []
    levels = [int(x) for x in args.background.split(",")]
    for mode in ["llm42", "control"] if args.mode == "both" else [args.mode]:
        recorded = next(((p, r) for p in mine for r in p.get("runs") or []
                         if r.get("mode") == mode and r.get("trials")), None)
        if recorded is None:
            seconds, source = guess_trial_s * len(levels) * args.repeats, (
                "no recorded proof of this model: a guess")
        else:
            proof, run = recorded
            scale = work / (proof["num_requests"] * proof["max_new_tokens"])
            seconds = sum(_mean_trial_s(run["trials"], level) for level in levels)
            seconds *= args.repeats * scale
            source = f"{proof['_file']} x {scale:.2f} (requests x tokens){note}"
        out.append(Priced(f"proof {name} {mode}: {args.repeats} x background {args.background}",
                          seconds, source))
    return out


def _mean_trial_s(trials: list[dict], level: int) -> float:
    """Mean seconds of the recorded trials at the background level nearest `level`."""
    gap = min(abs(t["background"] - level) for t in trials)
    near = [t["seconds"] for t in trials if abs(t["background"] - level) == gap]
    return sum(near) / len(near)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("dry_run", help="the suite's $OUT/dry_run.jsonl (DRY_RUN=1)")
    p.add_argument("--budget-s", type=float, default=570.0, help="the call's SUITE_BUDGET_S")
    p.add_argument("--setup-s", type=float, default=30.0,
                   help="the suite's install and kernel-cache restore, once per call")
    p.add_argument("--start-s", type=float, default=100.0, help="seconds per server start")
    p.add_argument("--prestarted-start-s", type=float, default=None,
                   help="seconds per server start after a driver step's first with "
                        "--prestart-next (default: --start-s less driver.PRESTART_SAVES_S)")
    p.add_argument("--run-overhead-s", type=float, default=20.0)
    p.add_argument("--unknown-run-s", type=float, default=120.0)
    p.add_argument("--row-invariance-s", type=float, default=180.0,
                   help="a row_invariance run without a recorded one (8B shape, H100: GEMMs "
                        "~60 s, Triton attention ~15 s, FlashInfer's first JIT ~60-120 s)")
    p.add_argument("--proof-trial-s", type=float, default=30.0,
                   help="a determinism-proof trial without a recorded proof of its model")
    p.add_argument("--results", default=str(RESULTS_ROOT))
    args = p.parse_args(argv)
    rows = recorded_rows(Path(args.results))
    proofs = recorded_proofs(Path(args.results))
    priced = [Priced("setup", args.setup_s, "--setup-s")]
    prestarted = (args.prestarted_start_s if args.prestarted_start_s is not None
                  else max(args.start_s - driver.PRESTART_SAVES_S, 0.0))
    for line in Path(args.dry_run).read_text(encoding="utf-8").splitlines():
        cmd = json.loads(line)
        if cmd[:2] == ["-m", "benchmarks.driver"]:
            priced += price_driver(cmd[2:], rows, args.start_s, args.run_overhead_s,
                                   args.unknown_run_s, prestarted)
        elif cmd[:2] == ["-m", "benchmarks.determinism_proof"]:
            priced += price_proof(cmd[2:], proofs, args.start_s, args.proof_trial_s)
        elif cmd[:2] == ["-m", "benchmarks.row_invariance"]:
            priced.append(price_row_invariance(cmd[2:], Path(args.results),
                                               args.row_invariance_s))
    total = 0.0
    for item in priced:
        total += item.seconds
        flag = "  <- over the budget" if total > args.budget_s else ""
        print(f"{total:7.0f} s  {item.seconds:6.0f} s  {item.what}  [{item.source}]{flag}")
    verdict = "fits" if total <= args.budget_s else "does NOT fit"
    print(f"total {total:.0f} s: {verdict} in --budget-s {args.budget_s:g}")
    return 0 if total <= args.budget_s else 1


if __name__ == "__main__":
    sys.exit(main())
