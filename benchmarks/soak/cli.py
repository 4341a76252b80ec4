"""`python -m benchmarks.soak`: the soak's command line (`--launch` starts and stops the server
here), writing soak.jsonl, soak.md and commands.txt into `--out-dir`."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

import benchmarks.soak
from benchmarks import env_info
from benchmarks.server_state import json_of
from benchmarks.soak.plan import SoakConfig, build_plan
from benchmarks.soak.report import markdown, result_row
from benchmarks.soak.run import run_soak

TINY_MODEL = dict(preset="tiny", seed=0, std=0.05, dtype="bfloat16",
                  overrides={"hidden_size": 256, "intermediate_size": 512})
TINY_MODEL_LABEL = "tiny random Llama (bf16, hidden 256, intermediate 512, std 0.05, seed 0)"
DEFAULT_SERVER_ARGS = ("--llm42-window-size 8 --llm42-verify-batch-size 4 "
                       "--llm42-inject-mismatch-rate 0.2 --random-seed 7 --context-length 1024")
# SGLang's idle check raises (kills the scheduler) on a leaked KV slot or request row; its default
# is strict, this makes sure of it for a server launched here
STRICT_LEAK_ENV = {"SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "true"}


def main(argv: list[str] | None = None) -> int:
    doc = benchmarks.soak.__doc__
    p = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=doc.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:30000")
    p.add_argument("--launch", action="store_true", help="start (and stop) the server here")
    p.add_argument("--model-path", default=None,
                   help="with --launch; default: write the tiny random Llama of the tests")
    p.add_argument("--server-args", default=DEFAULT_SERVER_ARGS,
                   help="with --launch (--enable-llm42 is added); default: %(default)s")
    p.add_argument("--startup-timeout", type=float, default=900.0)
    d = SoakConfig()
    p.add_argument("--num-requests", type=int, default=d.num_requests)
    p.add_argument("--det-fraction", type=float, default=d.det_fraction)
    p.add_argument("--abort-fraction", type=float, default=d.abort_fraction)
    p.add_argument("--concurrency", type=int, default=d.concurrency)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--max-new-tokens", default=f"{d.min_new_tokens}-{d.max_new_tokens}",
                   help="range MIN-MAX (or one number) of new tokens per request")
    p.add_argument("--pool-size", type=int, default=d.pool_size,
                   help="distinct deterministic requests (each gets a solo reference)")
    p.add_argument("--max-prompt-words", type=int, default=d.max_prompt_words)
    p.add_argument("--recheck", type=int, default=d.recheck,
                   help="specs taken alone again after the soak and compared")
    p.add_argument("--request-timeout", type=float, default=d.request_timeout)
    p.add_argument("--drain-timeout", type=float, default=d.drain_timeout)
    p.add_argument("--out-dir", default="soak-out")
    p.add_argument("--per-request-log", action="store_true",
                   help="also write soak_requests.jsonl (one row per request)")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    lo, _, hi = args.max_new_tokens.partition("-")
    cfg = SoakConfig(num_requests=args.num_requests, det_fraction=args.det_fraction,
                     abort_fraction=args.abort_fraction, concurrency=args.concurrency,
                     seed=args.seed, min_new_tokens=int(lo), max_new_tokens=int(hi or lo),
                     pool_size=args.pool_size, max_prompt_words=args.max_prompt_words,
                     recheck=args.recheck, request_timeout=args.request_timeout,
                     drain_timeout=args.drain_timeout,
                     run_tag=f"soak{args.seed}-{os.getpid()}", progress=not args.no_progress)
    try:
        build_plan(cfg)
    except ValueError as e:
        p.error(str(e))
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    command = shlex.join(getattr(sys, "orig_argv", sys.argv))
    server_args = shlex.split(args.server_args)
    with contextlib.ExitStack() as stack:
        url, model, server = args.url.rstrip("/"), args.model_path, None
        if args.launch:
            from llm42.server_process import SGLangServer

            if model is None:
                from llm42.models import write_random_llama

                tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="soak-model-"))
                model = write_random_llama(tmp, **TINY_MODEL)
            if "--enable-llm42" not in server_args:
                server_args.append("--enable-llm42")
            server = SGLangServer(model, server_args, log_path=out / "server.log",
                                  startup_timeout=args.startup_timeout, env=STRICT_LEAK_ENV)
            t0 = time.perf_counter()
            stack.enter_context(server)
            print(f"[soak] server up in {time.perf_counter() - t0:.1f} s at {server.url}",
                  flush=True)
            url = server.url
        model_label = (TINY_MODEL_LABEL if args.launch and args.model_path is None
                       else model or (json_of(url + "/get_model_info") or {}).get("model_path"))
        lines = [f"# {datetime.datetime.now(datetime.timezone.utc).isoformat()}",
                 f"soak: {command}"]
        if server is not None:
            lines.append(f"server: {shlex.join(server.args)}")
        lines += [f"git commit: {env_info.git_commit()}", f"cpu: {env_info.cpu_model()}",
                  f"model: {model_label}"]
        (out / "commands.txt").write_text("\n".join(lines) + "\n")
        try:
            result = run_soak(url, cfg, server=server, log=lambda m: print(m, flush=True))
        except RuntimeError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    row = result_row(result, cfg, url, model_label,
                     shlex.join(server_args) if args.launch else None, command)
    (out / "soak.jsonl").write_text(json.dumps(row, allow_nan=False) + "\n")
    (out / "soak.md").write_text(markdown(row))
    if args.per_request_log:
        with open(out / "soak_requests.jsonl", "w", encoding="utf-8") as fh:
            for o in result.outcomes:
                fh.write(json.dumps(o.row()) + "\n")
    print(markdown(row))
    print(f"[soak] {'PASSED' if result.passed else 'FAILED'}; wrote {out}/soak.jsonl, soak.md",
          flush=True)
    return 0 if result.passed else 1
