"""llm42's server flags on `python -m sglang.launch_server`, and what `--enable-llm42` implies.

ServerArgs is read-only after `__post_init__`, so the flags are attached through
`ServerArgs.override("llm42", ...)`; they reach the scheduler subprocess with the pickled args.
"""

from __future__ import annotations

import argparse
import sys

from llm42.core.config import Llm42Config

FLAG_DEFAULTS = {
    "enable_llm42": False,
    "llm42_window_size": 64,
    "llm42_verify_batch_size": 8,
    "llm42_inject_mismatch_rate": 0.0,
    "llm42_skip_compare": False,
    "llm42_max_verify_wait": None,
    "llm42_max_passes_per_step": 0,
    "llm42_defer_verify_on_prefill": False,
    "llm42_overlap_verify": False,
    "llm42_batched_prefill": True,
    "llm42_prefix_cache": False,
    "llm42_solo_prefill_min_tokens": None,
    "llm42_timeline_dir": None,
    "llm42_benchmark_modes": False,
}


def add_cli_args_hook(original, parser: argparse.ArgumentParser):
    original(parser)
    group = parser.add_argument_group("llm42 (selective deterministic inference)")
    group.add_argument(
        "--enable-llm42",
        action="store_true",
        help="Serve requests that carry is_deterministic=true bitwise-reproducibly "
        "(decode on the fast path, verify every window in a fixed-shape pass, roll back).",
    )
    group.add_argument(
        "--llm42-window-size",
        type=int,
        default=FLAG_DEFAULTS["llm42_window_size"],
        help="Tokens decoded per deterministic request before they are verified (W).",
    )
    group.add_argument(
        "--llm42-verify-batch-size",
        type=int,
        default=FLAG_DEFAULTS["llm42_verify_batch_size"],
        help="Rows per verification pass (B); the pass always has B x W tokens.",
    )
    group.add_argument(
        "--llm42-max-verify-wait",
        type=int,
        default=FLAG_DEFAULTS["llm42_max_verify_wait"],
        help="Decode steps a full window may wait (decoding on) so that passes fill up with B "
        "rows instead of padding; 0 verifies every window at once. Default: W / 4.",
    )
    group.add_argument(
        "--llm42-max-passes-per-step",
        type=int,
        default=FLAG_DEFAULTS["llm42_max_passes_per_step"],
        help="At most this many verification passes per scheduler step, so that a burst of due "
        "windows is spread over several decode steps instead of stalling one (jobs that waited "
        "2 x the max verify wait + 1 steps run regardless); 0: no cap (default).",
    )
    group.add_argument(
        "--llm42-defer-verify-on-prefill",
        action="store_true",
        help="Hold verification passes back in scheduler steps that are about to prefill (a "
        "waiting request and room for it), so that a prefill and a pass do not lengthen the "
        "same gap between decode steps; overdue jobs (2 x the max verify wait + 1 steps) run "
        "regardless.",
    )
    group.add_argument(
        "--llm42-overlap-verify",
        action="store_true",
        help="Overlap scheduler (SGLang's default): queue a verification pass behind the decode "
        "step in flight and process that step's result while the GPU verifies, instead of "
        "waiting for it first (passes of full windows and prompts; a finishing request's "
        "partial window still waits). Outputs unchanged; the H200 determinism proof passed "
        "with it.",
    )
    group.add_argument(
        "--llm42-batched-prefill",
        action=argparse.BooleanOptionalAction,
        default=FLAG_DEFAULTS["llm42_batched_prefill"],
        help="Prefill deterministic requests on the fast path together with other requests and "
        "verify their prompt in fixed-shape passes (default); --no-llm42-batched-prefill gives "
        "each deterministic prefill a batch of its own. Requests asking for prompt logprobs are "
        "always prefilled alone.",
    )
    group.add_argument(
        "--llm42-solo-prefill-min-tokens",
        type=int,
        default=FLAG_DEFAULTS["llm42_solo_prefill_min_tokens"],
        help="With batched prefill: deterministic prompts of this many tokens or more prefill in "
        "a batch of their own instead of being recomputed by prompt passes (cheaper for long "
        "prompts); 0: every prompt is batched. Default: 1024, or 0 with --llm42-prefix-cache.",
    )
    group.add_argument(
        "--llm42-prefix-cache",
        action="store_true",
        help="With batched prefill (the default): deterministic requests share verified prompt KV "
        "through SGLang's radix cache, in whole rows of W tokens (needs the radix cache on).",
    )
    group.add_argument(
        "--llm42-timeline-dir",
        default=FLAG_DEFAULTS["llm42_timeline_dir"],
        help="Profiling: each scheduler process appends one JSON line per scheduler iteration "
        "(batch launched, verification passes, duration) to DIR/timeline-<pid>.jsonl; "
        "`python -m benchmarks.timeline DIR` summarizes them. Works without --enable-llm42 "
        "too (the timeline of a baseline server, to compare with llm42's).",
    )
    group.add_argument(
        "--llm42-inject-mismatch-rate",
        type=float,
        default=FLAG_DEFAULTS["llm42_inject_mismatch_rate"],
        help="Fault injection for tests/benchmarks: probability that a verification window "
        "gets one corrupted candidate (seeded by --random-seed).",
    )
    group.add_argument(
        "--llm42-skip-compare",
        action="store_true",
        help="Benchmarking only: run verification passes but commit every candidate "
        "(measures the cost of verification alone; output is NOT deterministic).",
    )
    group.add_argument(
        "--llm42-benchmark-modes",
        action="store_true",
        help="Benchmarking only: accept POST /llm42_benchmark_mode {\"skip_compare\": bool, "
        "\"inject_mismatch_rate\": float, \"window_size\": int} to switch those settings on "
        "the running server between benchmark runs (one server start for llm42, "
        "comparison-skipped and injected runs, and a window sweep). A window switch needs an "
        "idle server: with deterministic requests in flight it is refused (409). Off "
        "(default): the endpoint answers 403, since skip_compare turns determinism off.",
    )


def from_cli_args_hook(original, cls, args: argparse.Namespace):
    values = {k: getattr(args, k, v) for k, v in FLAG_DEFAULTS.items()}
    if values["enable_llm42"]:
        from llm42.sglang.plugin import REGISTRATION_PROBLEMS

        if REGISTRATION_PROBLEMS:
            _fail(
                "the installed SGLang does not match llm42's patches/ manifest:\n  "
                + "\n  ".join(REGISTRATION_PROBLEMS)
            )
        # Seeded sampling (same noise in decode and verify) exists only in the torch sampler.
        args.sampling_backend = "pytorch"
    server_args = original(cls, args)
    if values["enable_llm42"]:
        try:
            config_from_values(values, seed=server_args.random_seed).validate(
                _context_length(server_args)
            )
        except ValueError as exc:
            _fail(str(exc))
        if values["llm42_prefix_cache"] and server_args.disable_radix_cache:
            _fail("--llm42-prefix-cache shares KV through SGLang's radix cache: drop "
                  "--disable-radix-cache")
    server_args.override("llm42", **values)
    return server_args


def config_from_values(values: dict, seed: int | None) -> Llm42Config:
    return Llm42Config(
        window_size=values["llm42_window_size"],
        verify_batch_size=values["llm42_verify_batch_size"],
        inject_mismatch_rate=values["llm42_inject_mismatch_rate"],
        skip_compare=values["llm42_skip_compare"],
        seed=seed or 0,
        max_verify_wait=values["llm42_max_verify_wait"],
        max_passes_per_step=values["llm42_max_passes_per_step"],
        defer_verify_on_prefill=values["llm42_defer_verify_on_prefill"],
        overlap_verify=values["llm42_overlap_verify"],
        batched_prefill=values["llm42_batched_prefill"],
        prefix_cache=values["llm42_prefix_cache"],
        solo_prefill_min_tokens=values["llm42_solo_prefill_min_tokens"],
        benchmark_modes=values["llm42_benchmark_modes"],
    )


def config_from_server_args(server_args) -> Llm42Config | None:
    if not getattr(server_args, "enable_llm42", False):
        return None
    values = {k: getattr(server_args, k, v) for k, v in FLAG_DEFAULTS.items()}
    return config_from_values(values, seed=server_args.random_seed)


def _context_length(server_args) -> int | None:
    if server_args.context_length:
        return server_args.context_length
    try:
        return server_args.get_model_config().context_len
    except Exception:
        return None  # checked again in the scheduler, where the model config is loaded


def _fail(message: str):
    print(f"llm42: error: {message}", file=sys.stderr)
    raise SystemExit(2)
