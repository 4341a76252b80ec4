"""What a streamed token costs the server's processes when normal requests share batches with
deterministic ones (issue 34: on the H100 at 10 % the client's run ended 4.2 s after the
scheduler's last step).

One llm42 server; the same N concurrent streaming requests of T tokens run twice: all normal,
then with a share of them deterministic. For each server process (the HTTP / tokenizer process,
the scheduler, the detokenizer) it reports the CPU seconds per thousand output tokens of each
run and the mixed run's ratio to the normal one. llm42's per-request counters used to travel
with every step's output (SGLang's customized_info), so every normal request beside a
deterministic one accumulated a per-token list that the HTTP process scanned for each chunk:
that process's ratio grew with the output length. Now they leave with a deterministic finish.

    python -m benchmarks.output_path_cost --out-dir out/output-path      # CPU or GPU
    python -m benchmarks.output_path_cost --model-path M --requests 128 --max-new-tokens 512

Without `--model-path` it writes the tests' tiny random Llama (CPU in about a minute). Writes
results.jsonl and table.md.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import requests
from tqdm import tqdm

from benchmarks import env_info


def stream(url: str, prompt: str, det: bool, max_new_tokens: int) -> int:
    """One streaming /generate; the number of output tokens it received."""
    sp = {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True,
          "is_deterministic": det}
    r = requests.post(url + "/generate", stream=True, timeout=1800,
                      json={"text": prompt, "sampling_params": sp, "stream": True})
    r.raise_for_status()
    last = None
    for line in r.iter_lines():
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            last = json.loads(line[6:])
    return len(last["output_ids"]) if last else 0


def processes(pid: int) -> dict[str, psutil.Process]:
    """The server's processes by role: its own (HTTP and tokenizer), then its children by the
    title SGLang gives them."""
    root = psutil.Process(pid)
    found = {"http": root}
    for child in root.children(recursive=True):
        title = " ".join(child.cmdline()) or child.name()
        role = ("scheduler" if "scheduler" in title else
                "detokenizer" if "detokenizer" in title else f"other-{child.pid}")
        found.setdefault(role, child)
    return found


def cpu_seconds(procs: dict[str, psutil.Process]) -> dict[str, float]:
    times = {}
    for role, proc in procs.items():
        t = proc.cpu_times()
        times[role] = t.user + t.system
    return times


def run(url: str, procs, prompts: list[str], det: list[bool], max_new_tokens: int,
        label: str) -> dict:
    before, t0 = cpu_seconds(procs), time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        futures = [pool.submit(stream, url, p, d, max_new_tokens) for p, d in zip(prompts, det)]
        tokens = sum(f.result() for f in tqdm(futures, desc=label, unit="req"))
    wall, after = time.perf_counter() - t0, cpu_seconds(procs)
    return {"run": label, "requests": len(prompts), "deterministic": sum(det),
            "output_tokens": tokens, "wall_s": round(wall, 3),
            "cpu_s": {role: round(after[role] - before[role], 4) for role in procs}}


def table(rows: list[dict]) -> str:
    base = rows[0]
    roles = list(base["cpu_s"])
    lines = ["| run | requests (det) | output tokens | wall (s) | "
             + " | ".join(f"{r} CPU ms / 1k tokens" for r in roles) + " |",
             "|" + "---|" * (4 + len(roles))]
    for row in rows:
        cells = []
        for role in roles:
            per_k = 1e6 * row["cpu_s"][role] / max(row["output_tokens"], 1)
            ref = 1e6 * base["cpu_s"][role] / max(base["output_tokens"], 1)
            cells.append(f"{per_k:.1f}" + (f" ({per_k / ref:.2f}x)" if row is not base and ref
                                           else ""))
        lines.append(f"| {row['run']} | {row['requests']} ({row['deterministic']}) | "
                     f"{row['output_tokens']} | {row['wall_s']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-path", help="default: the tests' tiny random Llama, written here")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--det-ratio", type=float, default=0.1)
    p.add_argument("--server-args", default="", help="more sglang.launch_server arguments")
    p.add_argument("--out-dir", type=Path, default=Path("out/output-path"))
    args = p.parse_args(argv)

    from llm42.server_process import SGLangServer

    args.out_dir.mkdir(parents=True, exist_ok=True)
    model = args.model_path
    if model is None:
        from llm42.models import write_random_llama

        model = write_random_llama(tempfile.mkdtemp(prefix="tiny-llama-"), preset="tiny", seed=0,
                                   std=0.05, dtype="bfloat16",
                                   overrides={"hidden_size": 256, "intermediate_size": 512})
    server_args = ["--enable-llm42", "--random-seed", "7", *args.server_args.split()]
    prompts = [f"Request {i}: tell me a long story about the number {i}."
               for i in range(args.requests)]
    every = max(1, round(1 / args.det_ratio)) if args.det_ratio > 0 else 0
    mixed = [bool(every) and i % every == 0 for i in range(args.requests)]
    with SGLangServer(model, server_args, log_path=args.out_dir / "server.log") as server:
        procs = processes(server.pid)
        stream(server.url, prompts[0], True, 8)  # warm the deterministic path
        rows = [run(server.url, procs, prompts, [False] * len(prompts), args.max_new_tokens,
                    "normal only"),
                run(server.url, procs, prompts, mixed, args.max_new_tokens,
                    f"{args.det_ratio:g} deterministic")]
    meta = {"model": model, "server_args": server_args, "max_new_tokens": args.max_new_tokens,
            "git_commit": env_info.git_commit(), "gpu": env_info.gpu_name()}
    with open(args.out_dir / "results.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps({**meta, **row}) + "\n")
    md = table(rows)
    (args.out_dir / "table.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
