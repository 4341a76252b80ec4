"""Serving benchmark for SGLang with llm42's selective determinism (`sglang.bench_serving` style).

    python -m benchmarks.bench_serving --backend sglang --port 30000 --dataset-name sharegpt \
        --num-prompts 2048 --deterministic-ratio 0.1 --config-label llm42 --output-file r.jsonl

A seeded subset of `--deterministic-ratio` of the requests carries `is_deterministic: true`
(sent only to a server whose `/llm42_stats` says llm42 is enabled; others would reject it).
Each run appends one JSON line (keys: `benchmarks.metrics.REQUIRED_KEYS` and more) and prints a
summary table. Exit code 0: all requests completed; 1: some failed (the row counts them);
2: nothing ran (no row; the error says why).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: import `benchmarks` from the repo root
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import asyncio
import dataclasses
import datetime
import functools
import json
import random
import shlex
import time

import numpy as np
import requests

from benchmarks import env_info, rows_cache
from benchmarks.metrics import summarize
from benchmarks.request_funcs import (
    BACKENDS,
    RequestInput,
    RequestOutput,
    make_session,
    send_request,
)
from benchmarks.server_state import json_of, llm42_stats
from benchmarks.workloads import (
    DatasetRow,
    dataset_source,
    sample_arxiv,
    sample_random,
    sample_sharegpt,
)

CONFIGS = ("nondet", "nondet-defaults", "nondet-no-overlap", "nondet-spec", "sglang-det",
           "llm42")
SUMMARY_ROWS = [
    ("Successful requests", "completed", "{}"),
    ("Benchmark duration (s)", "duration", "{:.2f}"),
    ("Request throughput (req/s)", "request_throughput", "{:.2f}"),
    ("Output token throughput (tok/s)", "output_throughput", "{:.2f}"),
    ("Total token throughput (tok/s)", "total_throughput", "{:.2f}"),
]


class BenchError(RuntimeError):
    """The benchmark could not run (exit code 2, no row written); the message says why."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=BACKENDS, default="sglang")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--base-url", default=None, help="overrides --host/--port")
    p.add_argument("--model", default=None, help="default: the server's model path")
    p.add_argument("--tokenizer", default=None, help="default: --model")
    p.add_argument("--dataset-name", choices=("sharegpt", "arxiv", "random"), default="sharegpt")
    p.add_argument("--dataset-path", default=None)
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--request-rate", type=float, default=float("inf"),
                   help="Poisson arrivals per second; inf sends everything at once")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--random-input-len", type=int, default=1024)
    p.add_argument("--random-output-len", type=int, default=1024)
    p.add_argument("--random-range-ratio", type=float, default=0.0)
    p.add_argument("--sharegpt-output-len", type=int, default=None,
                   help="fixed output length for sharegpt/arxiv (default: the reference's)")
    p.add_argument("--context-len", type=int, default=None,
                   help="drop sharegpt/arxiv pairs with prompt + output longer than this")
    p.add_argument("--output-file", default=None, help="JSONL; one line appended per run")
    p.add_argument("--disable-tqdm", action="store_true")
    p.add_argument("--disable-ignore-eos", action="store_true")
    p.add_argument("--warmup-requests", type=int, default=1)
    p.add_argument("--deterministic-ratio", type=float, default=0.0)
    p.add_argument("--sampling-seed", type=int, default=None,
                   help="request i is sent sampling_seed (native) / seed (OpenAI) = this + i")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=None, help="sent to every request when set")
    p.add_argument("--top-k", type=int, default=None, help="sent to every request when set")
    p.add_argument("--min-p", type=float, default=None, help="sent to every request when set")
    p.add_argument("--config-label", choices=CONFIGS, default="nondet")
    p.add_argument("--window-size", type=int, default=None)
    p.add_argument("--verify-batch-size", type=int, default=None)
    p.add_argument("--inject-mismatch-rate", type=float, default=None)
    p.add_argument("--skip-compare", action="store_true", default=None)
    p.add_argument("--tag", default=None, help="free-form label stored in the record")
    p.add_argument("--extra-metadata", default=None, help="JSON object merged into the record")
    p.add_argument("--rows-cache", default=None,
                   help="folder: the sampled requests are read from here when an earlier run "
                        "with the same dataset, sampling arguments and tokenizer wrote them "
                        "(no tokenizer load), else sampled and written (benchmarks.rows_cache)")
    return p


def load_rows(args, tokenizer) -> list[DatasetRow]:
    common = {"num_prompts": args.num_prompts, "seed": args.seed}
    if args.dataset_name == "random":
        return sample_random(tokenizer, input_len=args.random_input_len,
                             output_len=args.random_output_len,
                             range_ratio=args.random_range_ratio, **common)
    sampler = sample_sharegpt if args.dataset_name == "sharegpt" else sample_arxiv
    return sampler(tokenizer, dataset_path=args.dataset_path,
                   fixed_output_len=args.sharegpt_output_len, context_len=args.context_len,
                   **common)


def choose_deterministic(num_requests: int, ratio: float, seed: int) -> list[bool]:
    """Exactly round(ratio * n) (at least one when ratio > 0) requests, chosen by the seed."""
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"--deterministic-ratio must be in [0, 1], got {ratio}.")
    k = 0 if ratio == 0 else min(num_requests, max(1, round(ratio * num_requests)))
    chosen = set(random.Random(f"llm42-det-{seed}").sample(range(num_requests), k))
    return [i in chosen for i in range(num_requests)]


def _post(url: str, timeout: float = 60) -> bool:
    try:
        return requests.post(url, timeout=timeout).status_code == 200
    except requests.RequestException:
        return False


async def run_requests(args, base_url: str,
                       inputs: list[RequestInput]) -> tuple[list[RequestOutput], float]:
    from tqdm.asyncio import tqdm

    pbar = None if args.disable_tqdm else tqdm(total=len(inputs), desc="requests")
    gate = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None
    intervals = np.random.default_rng(args.seed).exponential(
        1.0 / args.request_rate, size=len(inputs)) if args.request_rate != float("inf") else None

    async with make_session() as session:
        async def one(req: RequestInput) -> RequestOutput:
            if gate is None:
                out = await send_request(session, args.backend, base_url, req)
            else:
                async with gate:
                    out = await send_request(session, args.backend, base_url, req)
            if pbar is not None:
                pbar.update(1)
            return out

        start = time.perf_counter()
        tasks = []
        for i, req in enumerate(inputs):
            tasks.append(asyncio.create_task(one(req)))
            if intervals is not None and i + 1 < len(inputs):
                await asyncio.sleep(float(intervals[i]))
        outputs = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    if pbar is not None:
        pbar.close()
    return list(outputs), duration


def llm42_fields(args, stats: dict | None) -> dict:
    """Configuration metadata (the server's values win) and counters from /llm42_stats."""
    enabled = bool(stats and stats.get("enabled"))

    def pick(key: str, arg_value):
        return stats.get(key, arg_value) if enabled else arg_value

    rec = {"window_size": pick("window_size", args.window_size),
           "verify_batch_size": pick("verify_batch_size", args.verify_batch_size),
           "inject_mismatch_rate": pick("inject_mismatch_rate", args.inject_mismatch_rate),
           "skip_compare": pick("skip_compare", args.skip_compare),
           "overlap_schedule": stats.get("overlap_schedule") if enabled else None,
           "batched_prefill": stats.get("batched_prefill") if enabled else None,
           "llm42_enabled": enabled, "llm42_stats": stats if enabled else None}
    for key in ("recompute_pct", "rollbacks", "verify_passes", "tokens_rolled_back",
                "verified_tokens", "det_requests_finished"):
        rec[key] = stats.get(key) if enabled else None
    return rec


def print_summary(rec: dict) -> None:
    lines = [" Serving Benchmark Result ".center(56, "="),
             f"{'Config':<40}{rec['config']:>16}", f"{'Dataset':<40}{rec['dataset']:>16}",
             f"{'Deterministic ratio':<40}{rec['det_ratio']:>16}"]
    for label, key, fmt in SUMMARY_ROWS:
        value = rec.get(key)
        lines.append(f"{label:<40}{fmt.format(value) if value is not None else '-':>16}")
    lines.append(f"{'(ms)':<16}" + "".join(f"{g or 'all':>10}{'':>10}" for g in (
        "", "det", "normal")))
    lines.append(f"{'':<16}" + "p50       p99       " * 3)
    for lat in ("ttft", "itl", "e2e"):
        cells = ""
        for g in ("", "det_", "normal_"):
            for s in ("p50", "p99"):
                v = rec.get(f"{g}{lat}_{s}_ms")
                cells += f"{v:>10.1f}" if v is not None else f"{'-':>10}"
        lines.append(f"{lat.upper():<16}{cells}")
    if rec.get("llm42_enabled"):
        lines.append(f"llm42: verify_passes={rec['verify_passes']} rollbacks={rec['rollbacks']} "
                     f"recompute_pct={rec['recompute_pct']:.3f}")
    if rec.get("spec_accept_length") is not None:
        lines.append(f"speculative decoding: accept length {rec['spec_accept_length']:.2f} "
                     "(tokens per step)")
    if rec.get("errors"):
        lines.append(f"errors ({rec['failed']} failed): {rec['errors'][0][:200]}")
    lines.append("=" * 56)
    print("\n".join(lines), flush=True)


def run(args) -> dict:
    base_url = (args.base_url or f"http://{args.host}:{args.port}").rstrip("/")
    model = args.model or (json_of(base_url + "/get_model_info") or {}).get("model_path")
    if not model:
        raise BenchError(f"no --model given and {base_url}/get_model_info did not "
                         "answer; start the server first or pass --model.")
    tokenizer_path = args.tokenizer or model

    @functools.cache
    def tokenizer():
        from transformers import AutoTokenizer  # seconds to import: only when rows need it

        return AutoTokenizer.from_pretrained(tokenizer_path)

    rows = rows_cache.load_or_sample(args.rows_cache, args, tokenizer_path,
                                     lambda: load_rows(args, tokenizer()))
    stats = llm42_stats(base_url)
    has_llm42 = bool(stats and stats.get("enabled"))
    if args.deterministic_ratio > 0 and not has_llm42:
        raise BenchError(
            f"--deterministic-ratio {args.deterministic_ratio} needs a server started "
            f"with --enable-llm42, but {base_url}/llm42_stats says "
            f"{'it is absent' if stats is None else stats}. Use --deterministic-ratio 0 for "
            "the nondet and sglang-det configurations.")
    is_det = choose_deterministic(len(rows), args.deterministic_ratio, args.seed)

    truncation = tuple((k, v) for k, v in (("top_p", args.top_p), ("top_k", args.top_k),
                                           ("min_p", args.min_p)) if v is not None)

    def request(row: DatasetRow, i: int, det: bool) -> RequestInput:
        prompt = row.prompt
        if args.backend == "sglang-oai-chat" and not isinstance(prompt, str):
            prompt = tokenizer().decode(prompt)
        seed = None if args.sampling_seed is None else args.sampling_seed + i
        return RequestInput(prompt, row.prompt_len, row.output_len, model, args.temperature,
                            is_deterministic=det, send_flag=has_llm42, sampling_seed=seed,
                            ignore_eos=not args.disable_ignore_eos, truncation=truncation)

    inputs = [request(r, i, d) for i, (r, d) in enumerate(zip(rows, is_det))]
    if args.warmup_requests > 0:
        warm = warmup_inputs(inputs, args.warmup_requests,
                             int(stats.get("window_size") or 64) if has_llm42 else None)
        outs, _ = asyncio.run(run_requests(_quiet(args), base_url, warm))
        failed = [o.error for o in outs if not o.success]
        if failed:
            raise BenchError(f"warm-up request failed: {failed[0][-1000:]}")
    _post(base_url + "/flush_cache")  # no prefix-cache hits carried over from earlier runs
    # also marks the start of the run in a step timeline (a baseline server may record one)
    if (has_llm42 or (stats or {}).get("timelines")) and not _post(
            base_url + "/reset_llm42_stats"):
        print("warning: POST /reset_llm42_stats failed; llm42 counters include earlier work")

    outputs, duration = asyncio.run(run_requests(args, base_url, inputs))
    rec = {"dataset": args.dataset_name,
           "dataset_source": dataset_source(args.dataset_name, args.dataset_path),
           "backend": args.backend, "model": model, "config": args.config_label,
           "det_ratio": args.deterministic_ratio, "num_det_requests": sum(is_det),
           "num_prompts": len(rows), "num_prompts_requested": args.num_prompts,
           "request_rate": "inf" if args.request_rate == float("inf") else args.request_rate,
           "max_concurrency": args.max_concurrency, "temperature": args.temperature,
           "top_p": args.top_p, "top_k": args.top_k, "min_p": args.min_p,
           "sampling_seed": args.sampling_seed, "seed": args.seed, "tag": args.tag}
    if args.dataset_name == "random":
        rec.update(random_input_len=args.random_input_len,
                   random_output_len=args.random_output_len,
                   random_range_ratio=args.random_range_ratio)
    rec.update(summarize(outputs, is_det, prompt_lens=[r.prompt_len for r in rows],
                         duration_s=duration))
    rec.update(llm42_fields(args, llm42_stats(base_url) if has_llm42 else None))
    rec.update(gpu=env_info.gpu_name(), git_commit=env_info.git_commit(),
               command=shlex.join(getattr(sys, "orig_argv", sys.argv)),
               timestamp=datetime.datetime.now(datetime.timezone.utc).isoformat(),
               skipped=False, skip_reason=None)
    if args.extra_metadata:
        rec.update(json.loads(args.extra_metadata))
    if args.output_file:
        env_info.append_jsonl(args.output_file, rec)
    print_summary(rec)
    return rec


def warmup_inputs(inputs: list[RequestInput], n: int, window: int | None) -> list[RequestInput]:
    """The run's first `n` requests cut to 16 new tokens, deterministic where the run's are (a
    fresh server's first timed run was the slow one while the warm-up ran no deterministic
    request beside the normal ones: h100-2026-12-07-repeats), and with llm42 (`window` given)
    one deterministic request past a window, so that the verifier's paths run before timing."""
    warm = [dataclasses.replace(r, output_len=min(r.output_len, 16)) for r in inputs[:n]]
    if window is not None:
        warm.append(dataclasses.replace(inputs[0], output_len=window + 2, is_deterministic=True))
    return warm


def _quiet(args):
    quiet = argparse.Namespace(**vars(args))
    quiet.disable_tqdm, quiet.max_concurrency, quiet.request_rate = True, None, float("inf")
    return quiet


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        rec = run(args)
    except (BenchError, OSError, ValueError) as exc:  # OSError: files, tokenizer, network
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    return 0 if rec["completed"] == rec["num_prompts"] else 1


if __name__ == "__main__":
    sys.exit(main())
