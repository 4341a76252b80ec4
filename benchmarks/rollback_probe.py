"""Rollback probe: what each sampling kind costs in rollbacks on a real model.

    python -m benchmarks.rollback_probe --launch --out-dir benchmarks/results/cpu-rollback-probe
    python -m benchmarks.rollback_probe --base-url http://127.0.0.1:30000 --out-dir DIR

Every request is deterministic; per sampling kind (greedy, t = 1.0, t = 0.7 + top_p 0.9, top_k 50,
min_p 0.05) one `benchmarks.bench_serving` run sends `--num-prompts` ShareGPT chat prompts at
once, each with its own seed, after a stats reset. The cost of LLM-42 is the share of decoded
tokens thrown away (recompute %) and of windows rolled back; dummy weights never roll back, so
this runs on real weights: the embedded SmolLM2-135M on CPU (`--launch`), its GGUF on the GPU.
Writes `probe.jsonl` (bench_serving rows with `sampling_kind`), `probe.md` and `probe.png`.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: import `benchmarks` from the repo root
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import json
import shlex

from tqdm import tqdm

from benchmarks import bench_serving, env_info
from benchmarks.report import load_rows

# name: bench_serving sampling arguments
KINDS = {
    "greedy": ["--temperature", "0"],
    "t1.0": ["--temperature", "1.0"],
    "t0.7-top_p0.9": ["--temperature", "0.7", "--top-p", "0.9"],
    "top_k50": ["--temperature", "1.0", "--top-k", "50"],
    "min_p0.05": ["--temperature", "1.0", "--min-p", "0.05"],
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--launch", action="store_true",
                       help="start an llm42 server on --model-path (default: embedded SmolLM2)")
    where.add_argument("--base-url", help="an already running --enable-llm42 server")
    p.add_argument("--model-path", default=None)
    p.add_argument("--server-args", default="", help="extra launch_server args with --launch")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--kinds", default=",".join(KINDS), help=f"subset of {','.join(KINDS)}")
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--backend", default="sglang-oai-chat")
    p.add_argument("--dataset-name", default="sharegpt")
    p.add_argument("--dataset-path", default=None)
    p.add_argument("--sampling-seed", type=int, default=1, help="request i gets this + i")
    p.add_argument("--bench-args", default="", help="more bench_serving args for every kind")
    return p


def kind_row(rec: dict, kind: str) -> dict:
    """The probe's numbers for one run: decisions of every kind the server saw are summed (one
    run sends one kind; greedy prompts' o_0 decisions count with it)."""
    stats = rec.get("llm42_stats") or {}
    split = stats.get("by_sampling_kind") or {}
    decisions = sum(v["decisions"] for v in split.values())
    rollbacks = sum(v["rollbacks"] for v in split.values())
    return {"kind": kind, "temperature": rec.get("temperature"), "top_p": rec.get("top_p"),
            "top_k": rec.get("top_k"), "min_p": rec.get("min_p"),
            "recompute_pct": rec.get("recompute_pct"),
            "windows_rolled_back_pct": 100.0 * rollbacks / max(1, decisions),
            "rollbacks": rollbacks, "decisions": decisions,
            "verify_passes": rec.get("verify_passes"),
            "output_throughput": rec.get("output_throughput"), "duration": rec.get("duration")}


def markdown(rows: list[dict]) -> str:
    head = ("| kind | temperature | top_p | top_k | min_p | recompute % | windows rolled back % "
            "| rollbacks / decisions | passes | output tok/s | wall s |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]

    def fmt(v, digits=1):
        return "-" if v is None else (f"{v:.{digits}f}" if isinstance(v, float) else str(v))

    for r in rows:
        lines.append(f"| {r['kind']} | {fmt(r['temperature'], 2)} | {fmt(r['top_p'], 2)} | "
                     f"{fmt(r['top_k'])} | {fmt(r['min_p'], 2)} | {fmt(r['recompute_pct'])} | "
                     f"{fmt(r['windows_rolled_back_pct'])} | {r['rollbacks']} / {r['decisions']}"
                     f" | {fmt(r['verify_passes'])} | {fmt(r['output_throughput'])} | "
                     f"{fmt(r['duration'])} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = [r["kind"] for r in rows]
    ax.bar(names, [r["recompute_pct"] or 0 for r in rows], color="tab:red", label="recompute %")
    ax.plot(names, [r["windows_rolled_back_pct"] for r in rows], "ko-",
            label="windows rolled back %")
    ax.set_ylabel("%")
    ax.set_title("llm42 rollbacks by sampling kind (all requests deterministic)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(jsonl: Path, out_dir: Path) -> list[dict]:
    rows = [kind_row(rec, rec.get("sampling_kind", "?")) for rec in load_rows(jsonl)]
    (out_dir / "probe.md").write_text(markdown(rows))
    plot(rows, out_dir / "probe.png")
    return rows


def _hardware() -> str:
    gpu = env_info.gpu_name()
    return gpu if gpu != "cpu" else f"cpu: {env_info.cpu_model()}"


def run(args, base_url: str) -> list[dict]:
    out = Path(args.out_dir)
    jsonl = out / "probe.jsonl"
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise SystemExit(f"unknown --kinds {unknown}; choose from {list(KINDS)}")
    for kind in tqdm(kinds, desc="sampling kinds", unit="kind"):
        argv = ["--base-url", base_url, "--backend", args.backend,
                "--dataset-name", args.dataset_name, "--num-prompts", str(args.num_prompts),
                "--sharegpt-output-len", str(args.output_len), "--deterministic-ratio", "1.0",
                "--config-label", "llm42", "--sampling-seed", str(args.sampling_seed),
                "--output-file", str(jsonl), "--tag", f"probe-{kind}", "--disable-tqdm",
                "--extra-metadata", json.dumps({"sampling_kind": kind}), *KINDS[kind],
                *shlex.split(args.bench_args)]
        if args.dataset_path:
            argv += ["--dataset-path", args.dataset_path]
        bench_serving.run(bench_serving.build_parser().parse_args(argv))
    rows = write_report(jsonl, out)
    (out / "commands.txt").write_text(
        f"{shlex.join(getattr(sys, 'orig_argv', sys.argv))}\ncommit {env_info.git_commit()}\n"
        f"hardware {_hardware()}\n")
    print(markdown(rows))
    return rows


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    if args.base_url:
        run(args, args.base_url.rstrip("/"))
        return 0
    from llm42.models import default_model_path
    from llm42.server_process import SGLangServer

    server = SGLangServer(args.model_path or default_model_path(),
                          ["--enable-llm42", *shlex.split(args.server_args)],
                          log_path=str(Path(args.out_dir) / "server.log"))
    server.start()
    try:
        run(args, server.url)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
