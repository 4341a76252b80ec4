"""Benchmark one model in every configuration: nondet, sglang-det, llm42 at several ratios.

    python -m benchmarks.driver --model-path M --out-dir out/ --det-ratios 0.02,0.1,0.5,1.0 \
        --server-args "--attention-backend triton --disable-radix-cache" \
        --workload "--dataset-name sharegpt" --bench-args "--num-prompts 2048"
    python -m benchmarks.driver --report-only --out-dir out/

One server start per configuration (the deterministic ratio is a property of the client, so a
single `--enable-llm42` server serves every ratio; with `--switch-variants` the comparison-skipped,
injected and other-window llm42 configs run on it too, switched at runtime); every workload and
ratio is benchmarked on it by `benchmarks.bench_serving` in a subprocess. `--server-args` go
identically to every configuration, except that `nondet-defaults` (plain SGLang as a user starts
it) drops the flags that only make the baselines like-for-like with llm42 (`LIKE_FOR_LIKE_FLAGS`).
A configuration whose server does not start (SGLang refuses `--enable-deterministic-inference` on
CPU / torch_native) becomes a skipped row with the reason.
Writes `results.jsonl`, `table.md`, the plots, `commands.txt` and the logs into `--out-dir`.
With `--profile-steps N` every benchmark run also asks its server, once the load is steady, for
a torch.profiler trace of N forward steps (`benchmarks.profile_trigger`), summarized by
`benchmarks.step_profile` into `--out-dir`/profile_LABEL_rRATIO_WORKLOAD/.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import datetime
import itertools
import json
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

from benchmarks import env_info, report
from benchmarks.metrics import empty_summary
from benchmarks.profile_trigger import PROFILE_WAIT_S, ProfileTrigger, finish_profile

RESULTS = "results.jsonl"
# Seconds of a cold server start that a prestarted one has already spent before its gate opens:
# the launcher's and the scheduler's Python imports on the H100 machine (docs/benchmarks.md).
PRESTART_SAVES_S = 50.0
# A run is started when the time left holds this share of its recorded duration (recorded runs
# were often on another card or commit; the deadline stops one that overruns).
RUN_PRICE_FACTOR = 0.9
# nondet-no-overlap / llm42-no-overlap: SGLang's normal event loop instead of the overlap loop
# (llm42 runs in both); they measure what the overlap scheduler is worth with and without llm42.
# nondet-defaults: plain SGLang with its own defaults for what the like-for-like flags pin.
# nondet-spec / llm42-spec: speculative decoding (`--spec-args`) on plain SGLang and on llm42,
# which turns the overlap scheduler off for it (nondet-no-overlap is plain SGLang without it).
CONFIGS = ("nondet", "nondet-defaults", "nondet-no-overlap", "nondet-spec", "sglang-det",
           "llm42", "llm42-skip-compare", "llm42-inject", "llm42-no-overlap",
           "llm42-batched-prefill", "llm42-solo-prefill", "llm42-spec")
DEFAULT_SPEC_ARGS = "--speculative-algorithm NGRAM --speculative-num-draft-tokens 4"
# Server flags that make every baseline run like llm42 does (the pytorch sampler, the only one
# with seeded sampling; no radix cache; no prefill CUDA graphs), flag -> whether it takes a
# value. `nondet-defaults` drops them from --server-args: SGLang's default sampler, radix cache
# and prefill graphs, as a user who never heard of llm42 runs it.
LIKE_FOR_LIKE_FLAGS = {"--sampling-backend": True, "--disable-radix-cache": False,
                       "--cuda-graph-backend-prefill": True}
_ERROR_LINE = re.compile(r"(Error|error|Exception|refus|not supported)")


@dataclass
class ServerConfig:
    """One server start: its label, config name for the JSONL, flags, and the client ratios."""

    label: str
    config: str
    flags: list[str]
    ratios: list[float]
    meta: dict = field(default_factory=dict)  # window_size, verify_batch_size, ... for the rows
    # --switch-variants: the comparison-skipped / injected configs and the other windows run on
    # this server after its own rows, each switched on by POST /llm42_benchmark_mode with its
    # meta["benchmark_mode"]
    switched: list[ServerConfig] = field(default_factory=list)
    kind: str = ""  # the name in CONFIGS it came from
    like_for_like: bool = True  # False: --server-args without LIKE_FOR_LIKE_FLAGS


def without_like_for_like(server_args: list[str]) -> list[str]:
    """`server_args` less LIKE_FOR_LIKE_FLAGS, in both `--flag value` and `--flag=value` form."""
    out, skip_value = [], False
    for token in server_args:
        if skip_value:
            skip_value = False
            continue
        flag = token.split("=", 1)[0]
        if flag in LIKE_FOR_LIKE_FLAGS:
            skip_value = LIKE_FOR_LIKE_FLAGS[flag] and "=" not in token
            continue
        out.append(token)
    return out


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def server_configs(args) -> list[ServerConfig]:
    out: list[ServerConfig] = []
    for name in [c.strip() for c in args.configs.split(",") if c.strip()]:
        if name not in CONFIGS:
            raise SystemExit(f"error: unknown config {name!r}; expected some of {CONFIGS}.")
        if name == "nondet":
            out.append(ServerConfig("nondet", "nondet", [], [0.0]))
        elif name == "nondet-defaults":
            out.append(ServerConfig(name, name, [], [0.0], like_for_like=False))
        elif name == "nondet-no-overlap":
            out.append(ServerConfig(name, name, ["--disable-overlap-schedule"], [0.0]))
        elif name == "nondet-spec":
            flags, algorithm = spec_flags(args)
            out.append(ServerConfig(f"nondet-spec-{algorithm.lower()}", name, flags, [0.0],
                                    {"speculative_algorithm": algorithm}))
        elif name == "sglang-det":
            out.append(ServerConfig("sglang-det", "sglang-det",
                                    ["--enable-deterministic-inference"], [0.0]))
        else:
            for window, extra in itertools.product(
                    [int(w) for w in args.window_sizes.split(",")], args.llm42_args or [""]):
                batch = pass_batch_size(args, window)
                flags = ["--enable-llm42", "--llm42-window-size", str(window),
                         "--llm42-verify-batch-size", str(batch)]
                meta = {"window_size": window, "verify_batch_size": batch,
                        "skip_compare": False, "inject_mismatch_rate": 0.0}
                ratios, label = _floats(args.det_ratios), f"llm42-w{window}"
                if getattr(args, "pass_tokens", None):
                    label += f"-b{batch}"
                if extra != (args.llm42_args or [""])[0] and getattr(
                        args, "args_variant_ratios", None):
                    ratios = _floats(args.args_variant_ratios)  # a survey's other variants
                if extra:
                    env, rest = server_env(extra)
                    flags += rest
                    meta["llm42_args"] = extra
                    if env:
                        meta["server_env"] = env
                    # a variant may set its own B; the last flag wins in SGLang's parser too
                    meta["verify_batch_size"] = int(_opts(flags)["--llm42-verify-batch-size"])
                    label += "-" + _flag_label(extra)
                if name == "llm42-skip-compare":
                    flags.append("--llm42-skip-compare")
                    meta["skip_compare"] = True
                    ratios, label = _floats(args.variant_ratios or args.det_ratios), label + "-skip"
                elif name == "llm42-no-overlap":
                    flags.append("--disable-overlap-schedule")
                    meta["overlap_schedule"] = False
                    label += "-no-overlap"
                elif name == "llm42-batched-prefill":  # the default since 2026-12-03
                    flags.append("--llm42-batched-prefill")
                    meta["batched_prefill"] = True
                    label += "-batched-prefill"
                elif name == "llm42-solo-prefill":
                    flags.append("--no-llm42-batched-prefill")
                    meta["batched_prefill"] = False
                    label += "-solo-prefill"
                elif name == "llm42-spec":
                    spec, algorithm = spec_flags(args)
                    flags += spec
                    meta["speculative_algorithm"] = algorithm
                    label += f"-spec-{algorithm.lower()}"
                elif name == "llm42-inject":
                    flags += ["--llm42-inject-mismatch-rate", str(args.inject_mismatch_rate)]
                    meta["inject_mismatch_rate"] = args.inject_mismatch_rate
                    ratios = _floats(args.variant_ratios or args.det_ratios)
                    label += f"-inject{args.inject_mismatch_rate:g}"
                out.append(ServerConfig(label, "llm42", flags, ratios, meta, kind=name))
    return attach_variants(out) if args.switch_variants else out


_ENV_ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=")


def server_env(llm42_args: str) -> tuple[dict[str, str], list[str]]:
    """`--llm42-args` split, as a shell reads a command line, into the `NAME=value` assignments
    before the first flag (the server's environment, e.g. LLM42_FP32_LOGITS_LAYOUT=recompute
    for an A/B of an internal layout) and the flags."""
    tokens = shlex.split(llm42_args)
    env = {}
    while tokens and _ENV_ASSIGNMENT.match(tokens[0]):
        name, _, value = tokens.pop(0).partition("=")
        env[name] = value
    return env, tokens


def spec_flags(args) -> tuple[list[str], str]:
    """The speculative-decoding flags of nondet-spec / llm42-spec (`--spec-args`) and the
    algorithm they name."""
    flags = shlex.split(getattr(args, "spec_args", None) or DEFAULT_SPEC_ARGS)
    algorithm = _opts(flags).get("--speculative-algorithm")
    if not algorithm:
        raise SystemExit(f"error: --spec-args {shlex.join(flags)!r} names no "
                         "--speculative-algorithm; e.g. " + repr(DEFAULT_SPEC_ARGS))
    return flags, algorithm.upper()


def pass_batch_size(args, window: int) -> int:
    """B of an llm42 server with window W: `--pass-tokens` // W (every window of a sweep then
    runs the same B x W pass), else `--verify-batch-size`."""
    if not getattr(args, "pass_tokens", None):
        return args.verify_batch_size
    if args.pass_tokens % window:
        raise SystemExit(f"error: --pass-tokens {args.pass_tokens} is not a multiple of "
                         f"window {window}")
    return args.pass_tokens // window


_PLAIN_MODE = {"skip_compare": False, "inject_mismatch_rate": 0.0}
# What POST /llm42_benchmark_mode can switch: configs differing only in these share a server.
_SWITCHABLE = ("llm42", "llm42-skip-compare", "llm42-inject")
# --llm42-args flags the endpoint switches too (pass scheduling: when and by which forward a row
# is verified, and which batch a prompt prefills in, never what a row-invariant verifier
# returns), flag -> (mode field, its value's type; None: a switch).
_SCHEDULING_FLAGS = {"--llm42-max-verify-wait": ("max_verify_wait", int),
                     "--llm42-overlap-verify": ("overlap_verify", None),
                     "--no-llm42-overlap-verify": ("overlap_verify", None),
                     "--llm42-max-finish-wait": ("max_finish_wait", int),
                     "--llm42-inline-pad-ratio": ("inline_pad_ratio", float),
                     "--llm42-inline-prefill": ("inline_prefill", None),
                     "--no-llm42-inline-prefill": ("inline_prefill", None),
                     "--llm42-batched-prefill": ("batched_prefill", None),
                     "--no-llm42-batched-prefill": ("batched_prefill", None),
                     "--llm42-defer-verify-on-prefill": ("defer_verify_on_prefill", None),
                     "--llm42-fold-passes": ("fold_passes", None),
                     "--no-llm42-fold-passes": ("fold_passes", None)}


def scheduling_mode(llm42_args: str | None) -> tuple[str, dict]:
    """`--llm42-args` split into what needs a server start of its own (the key of its host) and
    the pass-scheduling settings a host switches at runtime, every one of `_SCHEDULING_FLAGS`
    (absent: the flag's default; None for the two waits: W // 4)."""
    from llm42.core.config import Llm42Config

    rest, tokens, defaults = [], shlex.split(llm42_args or ""), Llm42Config()
    mode = {name: getattr(defaults, name) for name, _ in _SCHEDULING_FLAGS.values()}
    i = 0
    while i < len(tokens):
        flag, _, value = tokens[i].partition("=")
        if flag in _SCHEDULING_FLAGS:
            name, kind = _SCHEDULING_FLAGS[flag]
            if kind and not value:
                i += 1
                value = tokens[i] if i < len(tokens) else ""
            mode[name] = kind(value) if kind else not flag.startswith("--no-")
        else:
            rest.append(tokens[i])
        i += 1
    return shlex.join(rest), mode


def attach_variants(configs: list[ServerConfig]) -> list[ServerConfig]:
    """Run every llm42 config that differs from a plain llm42 server only in what
    POST /llm42_benchmark_mode switches (comparison skipped, injected mismatches, the window,
    the pass-scheduling flags of `--llm42-args`, `_SCHEDULING_FLAGS`) on that server, started
    with --llm42-benchmark-modes: one start per `--llm42-args` value less those flags.

    The host is the plain config with the largest window (of those, the first given), so a
    window sweep starts once: any explicit --llm42-max-verify-wait that fits one window of the
    sweep fits the largest (a smaller window it does not fit becomes skipped rows, not a failed
    start), and the largest window is checked against the context length before anything runs.
    A server hosting several windows (B, scheduling settings) gets `window_size`
    (`verify_batch_size`, the scheduling fields) in every switched variant's mode. A skip /
    inject config without a plain llm42 config keeps a start of its own."""
    split = {id(cfg): scheduling_mode(cfg.meta.get("llm42_args")) for cfg in configs}
    hosts: dict[str, ServerConfig] = {}  # --llm42-args less scheduling -> its host
    for cfg in configs:
        key = split[id(cfg)][0]
        if cfg.kind == "llm42" and (key not in hosts or
                                    cfg.meta["window_size"] > hosts[key].meta["window_size"]):
            hosts[key] = cfg
    out, guests = [], {key: [] for key in hosts}
    for cfg in configs:
        key = split[id(cfg)][0]
        if cfg.kind in _SWITCHABLE and key in hosts and hosts[key] is not cfg:
            guests[key].append(cfg)
        else:
            out.append(cfg)
    for key, host in hosts.items():
        group = [host, *guests[key]]
        windows = {c.meta["window_size"] for c in group}
        batches = {c.meta["verify_batch_size"] for c in group}
        schedules = {tuple(split[id(c)][1].items()) for c in group}
        if guests[key] and "--llm42-benchmark-modes" not in host.flags:
            host.flags.append("--llm42-benchmark-modes")
        for cfg in guests[key]:
            mode = {k: cfg.meta[k] for k in _PLAIN_MODE}
            if len(windows) > 1:
                mode["window_size"] = cfg.meta["window_size"]
            if len(batches) > 1:
                mode["verify_batch_size"] = cfg.meta["verify_batch_size"]
            if len(schedules) > 1:
                mode.update(split[id(cfg)][1])
            host.switched.append(ServerConfig(cfg.label, cfg.config, host.flags, cfg.ratios,
                                              {**cfg.meta, "benchmark_mode": mode},
                                              kind=cfg.kind))
    return out


def plain_mode(cfg: ServerConfig) -> dict:
    """The mode a server with switched variants returns to at the end: its own."""
    mode = dict(_PLAIN_MODE)
    for key in ("window_size", "verify_batch_size"):
        if any(key in v.meta["benchmark_mode"] for v in cfg.switched):
            mode[key] = cfg.meta[key]
    if any("overlap_verify" in v.meta["benchmark_mode"] for v in cfg.switched):
        mode.update(scheduling_mode(cfg.meta.get("llm42_args"))[1])
    return mode


def _flag_label(flags: str) -> str:
    """`--llm42-batched-prefill --llm42-max-verify-wait 48` -> `batched-prefill-max-verify-wait48`,
    `--no-llm42-batched-prefill` -> `no-batched-prefill`: tells servers apart in tables."""
    parts: list[str] = []
    for token in shlex.split(flags):
        if _ENV_ASSIGNMENT.match(token):  # LLM42_FP32_LOGITS_LAYOUT=x -> fp32-logits-layout=x
            name, _, value = token.partition("=")
            parts.append(name.lower().replace("_", "-").replace("llm42-", "") + "=" + value)
        elif token.startswith("-") or not parts:
            parts.append(token.lstrip("-").replace("llm42-", ""))
        else:
            parts[-1] += token
    return re.sub(r"[^A-Za-z0-9.=-]+", "", "-".join(parts))


def _count_lines(path: Path) -> int:
    if not path.is_file():
        return 0
    with open(path, encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


def summarize_timeline(folder: Path) -> None:
    """timeline.md/.json/.png next to the server's step timeline; a failure only warns."""
    import contextlib
    import io

    from benchmarks import timeline

    try:
        with contextlib.redirect_stdout(io.StringIO()):
            code = timeline.main([str(folder), "--out-dir", str(folder)])
        print(f"[driver] step timeline: {folder / 'timeline.md'} (exit {code})", flush=True)
    except Exception as exc:  # noqa: BLE001 - the benchmark rows matter more than the profile
        print(f"[driver] warning: step timeline of {folder} not summarized: {exc!r}", flush=True)


def _slug(text: str) -> str:
    """`random 128/512 n=256` -> `random-128-512-n256`: a workload label as a folder name."""
    return re.sub(r"[^A-Za-z0-9.]+", "-", text.replace("=", "")).strip("-")[:48]


def _with_ratio(cfg: ServerConfig, ratio: float) -> ServerConfig:
    return ServerConfig(cfg.label, cfg.config, cfg.flags, [ratio], cfg.meta)


# A window switch needs an idle server (409 while deterministic requests are in flight, e.g.
# those of a client that a deadline stopped, which the server is still aborting): retry that long.
SWITCH_BUSY_WAIT_S = 60.0


def switch_mode(url: str, mode: dict) -> str | None:
    """POST /llm42_benchmark_mode; what went wrong, or None once the server reports the mode."""
    import requests

    deadline = time.monotonic() + SWITCH_BUSY_WAIT_S
    while True:
        try:
            r = requests.post(url + "/llm42_benchmark_mode", json=mode, timeout=60)
            body = r.json()
        except (requests.RequestException, ValueError) as exc:
            return repr(exc)
        if r.status_code != 409 or time.monotonic() >= deadline:
            break
        time.sleep(1.0)
    if r.status_code != 200 or not body.get("success"):
        return f"HTTP {r.status_code}: {str(body)[:300]}"
    # None asks for a flag's default, which the server reports resolved (max_verify_wait: W // 4)
    wrong = {k: body.get(k) for k, v in mode.items() if v is not None and body.get(k) != v}
    return f"the server reports {wrong}" if wrong else None


def workload_label(workload_args: list[str], bench_args: list[str]) -> str:
    """A short name such as "sharegpt n=2048" or "random 1024/256 n=1024 rate=inf"."""
    opts = _opts(bench_args + workload_args)
    name = opts.get("--dataset-name", "sharegpt")
    if name == "random":
        name += f" {opts.get('--random-input-len', 1024)}/{opts.get('--random-output-len', 1024)}"
    label = f"{name} n={opts.get('--num-prompts', 1000)}"
    if opts.get("--request-rate", "inf") != "inf":
        label += f" rate={opts['--request-rate']}"
    if "--max-concurrency" in opts:
        label += f" conc={opts['--max-concurrency']}"
    if float(opts.get("--temperature", 0) or 0) > 0:  # sampled runs are workloads of their own
        label += f" t={opts['--temperature']}"
        for flag in ("--top-p", "--top-k", "--min-p"):
            if flag in opts:
                label += f" {flag[2:].replace('-', '_')}={opts[flag]}"
    return label


def _opts(argv: list[str]) -> dict[str, str]:
    opts = {}
    for i, arg in enumerate(argv):
        if arg.startswith("--"):
            key, _, value = arg.partition("=")
            if not value and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                value = argv[i + 1]
            opts[key] = value
    return opts


def failure_reason(log_text: str, fallback: str) -> str:
    """The last error-looking line of a server log (SGLang's refusal), else `fallback`."""
    lines = [ln.strip() for ln in log_text.splitlines() if _ERROR_LINE.search(ln)]
    lines = [ln for ln in lines if not ln.startswith(("Traceback", "File "))
             and "Ignore import error" not in ln]  # SGLang logs these at every start
    return (lines[-1] if lines else fallback)[:500]


class Driver:
    def __init__(self, args):
        self.args = args
        self.out = Path(args.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.results = self.out / RESULTS
        self.started = time.monotonic()
        self.server_args = shlex.split(args.server_args or "")
        self.bench_args = shlex.split(args.bench_args or "")
        self.workloads = [shlex.split(w) for w in (args.workload or ["--dataset-name sharegpt"])]
        # the sampled requests, shared by every run (benchmarks.rows_cache); not results
        self.rows_cache = Path(tempfile.mkdtemp(prefix="llm42-rows-"))
        self.start_seconds: list[float] = []  # each server start's, to price the next one
        self.prestarted_seconds: list[float] = []  # those of prestarted servers (gate to health)
        self._recorded: list[dict] | None = None  # benchmarks/results/ rows, read when needed

    def server_args_of(self, cfg: ServerConfig) -> list[str]:
        return self.server_args if cfg.like_for_like else without_like_for_like(self.server_args)

    def log_command(self, what: str, argv: list[str]) -> None:
        with open(self.out / "commands.txt", "a", encoding="utf-8") as f:
            f.write(f"# {what} ({datetime.datetime.now().isoformat(timespec='seconds')})\n"
                    f"{shlex.join(argv)}\n")

    def time_left(self) -> float:
        if not self.args.budget_s:
            return float("inf")
        return self.args.budget_s - (time.monotonic() - self.started)

    def skip_rows(self, cfg: ServerConfig, reason: str, command: str,
                  workloads: list[list[str]] | None = None) -> None:
        for wl in workloads or self.workloads:
            opts = _opts(self.bench_args + wl)
            for ratio in cfg.ratios:
                rec = {"dataset": opts.get("--dataset-name", "sharegpt"),
                       "workload": workload_label(wl, self.bench_args),
                       "model": self.args.model_path, "config": cfg.config,
                       "window_size": None, "verify_batch_size": None, "skip_compare": None,
                       "inject_mismatch_rate": None, **cfg.meta, "det_ratio": ratio,
                       "num_prompts": int(opts.get("--num-prompts", 1000)),
                       "request_rate": opts.get("--request-rate", "inf"),
                       "max_concurrency": int(opts["--max-concurrency"]) if (
                           "--max-concurrency" in opts) else None,
                       **empty_summary(), "recompute_pct": None, "rollbacks": None,
                       "verify_passes": None,
                       "gpu": env_info.gpu_name(), "git_commit": env_info.git_commit(),
                       "command": command,
                       "server_args": shlex.join(self.server_args_of(cfg)),
                       "load_format": _opts(self.server_args).get("--load-format"),
                       "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                       "server_label": cfg.label, "skipped": True, "skip_reason": reason}
                if rec["request_rate"] != "inf":
                    rec["request_rate"] = float(rec["request_rate"])
                env_info.append_jsonl(self.results, rec)
        print(f"[driver] {cfg.label}: skipped ({reason})", flush=True)

    def bench(self, cfg: ServerConfig, url: str, wl: list[str], ratio: float,
              repeat: int = 0) -> None:
        a = self.args
        argv = [sys.executable, "-m", "benchmarks.bench_serving", "--backend", a.backend,
                "--base-url", url, "--model", a.model_path,
                "--tokenizer", a.tokenizer or a.model_path, *self.bench_args, *wl,
                "--config-label", cfg.config, "--deterministic-ratio", f"{ratio:g}",
                "--output-file", str(self.results), "--disable-tqdm",
                "--rows-cache", str(self.rows_cache)]
        for key, flag in (("window_size", "--window-size"),
                          ("verify_batch_size", "--verify-batch-size"),
                          ("inject_mismatch_rate", "--inject-mismatch-rate")):
            if key in cfg.meta:
                argv += [flag, str(cfg.meta[key])]
        if cfg.meta.get("skip_compare"):
            argv.append("--skip-compare")
        meta = {"workload": workload_label(wl, self.bench_args), "server_label": cfg.label,
                "server_args": shlex.join(self.server_args_of(cfg) + cfg.flags),
                "load_format": _opts(self.server_args).get("--load-format")}
        if "benchmark_mode" in cfg.meta:  # switched at runtime on that server
            meta["benchmark_mode"] = cfg.meta["benchmark_mode"]
        for key in ("speculative_algorithm", "server_env"):
            if key in cfg.meta:
                meta[key] = cfg.meta[key]
        if a.repeats > 1:  # the same run again on the same server: spread, first-run costs
            meta["repeat"] = repeat
        argv += ["--extra-metadata", json.dumps(meta)]
        run_name = f"{cfg.label} ratio={ratio:g} {meta['workload']}" + (
            f" repeat {repeat}" if a.repeats > 1 else "")
        self.log_command(f"bench {run_name}", argv)
        log = self.out / f"bench_{cfg.label}.log"
        rows_before = _count_lines(self.results)
        budget_left = max(self.time_left(), 1.0)
        timeout = min(a.bench_timeout or float("inf"), budget_left)
        trigger = None
        if getattr(a, "profile_steps", 0) > 0:
            trigger = self.profile_trigger(cfg, url, meta["workload"], ratio)
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"\n==== {shlex.join(argv)}\n")
            f.flush()
            try:
                code = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT,
                                      cwd=env_info.REPO_ROOT, check=False,
                                      timeout=None if timeout == float("inf") else timeout
                                      ).returncode
            except subprocess.TimeoutExpired:
                code = "timeout"
        print(f"[driver] {run_name}: exit {code}", flush=True)
        if trigger is not None:  # the wait for its trace within what is left of the budget
            finish_profile(trigger, min(PROFILE_WAIT_S, max(self.time_left() - 10.0, 5.0)))
        if _count_lines(self.results) == rows_before:  # exit 1 still writes its row
            lines = log.read_text(errors="replace").strip().splitlines() or [""]
            errors = [ln for ln in lines if ln.startswith("error:")]
            reason = f"benchmark client failed (exit {code}): {(errors or lines)[-1][:300]}"
            if code == "timeout":  # a deadline, not a client error: say which one
                limit = ("--bench-timeout" if timeout < budget_left
                         else f"the time budget (--budget-s {a.budget_s:g})")
                reason = f"not finished: stopped after {timeout:.0f} s, when {limit} ran out"
            self.skip_rows(_with_ratio(cfg, ratio), reason, shlex.join(argv), [wl])

    def profile_trigger(self, cfg: ServerConfig, url: str, workload: str,
                        ratio: float) -> ProfileTrigger | None:
        """--profile-steps: a started ProfileTrigger for this run, tracing into
        OUT/profile_LABEL_rRATIO_WORKLOAD/; None (warned) if it could not start."""
        a = self.args
        try:
            folder = (self.out / f"profile_{cfg.label}_r{ratio:g}_{_slug(workload)}").resolve()
            folder.mkdir(parents=True, exist_ok=True)
            trigger = ProfileTrigger(url, folder, f"{cfg.label}_r{ratio:g}", a.profile_steps,
                                     a.profile_running, a.profile_settle_s)
            trigger.start()
            return trigger
        except Exception as exc:  # noqa: BLE001 - the benchmark rows matter more
            print(f"[driver] warning: profile trigger not started: {exc!r}", flush=True)
            return None

    def server_of(self, cfg: ServerConfig, port: int | None, note: str = ""):
        """`cfg`'s server, not started (its command logged, with `note`)."""
        from llm42.server_process import SGLangServer

        flags = self.server_args_of(cfg) + cfg.flags
        if self.args.timeline:  # baselines too: their decode gaps are what llm42's compare to
            flags = flags + ["--llm42-timeline-dir", str(self.out / f"timeline_{cfg.label}")]
        env = cfg.meta.get("server_env") or {}
        server = SGLangServer(self.args.model_path, flags, port=port, env=env,
                              log_path=self.out / f"server_{cfg.label}.log",
                              startup_timeout=self.args.startup_timeout)
        self.log_command(f"server {cfg.label}{note}",
                         [f"{k}={v}" for k, v in env.items()] + list(server.args))
        return server

    def run_config(self, cfg: ServerConfig, server=None, following: ServerConfig | None = None):
        """Start `cfg`'s server (`server`: one prestarted for it, gated), run its benchmarks,
        stop it. With `following` (--prestart-next), that config's server is launched gated once
        this one is up and returned, for the next call to open."""
        from llm42.server_process import SGLangServerError, SGLangServerTimeout

        # a start that cannot be followed by one run is device time spent for nothing: the
        # longest start so far (sglang-det's took 88 s, then had no time to run) plus its run
        first = self.expected_run_s(cfg, self.workloads[0], cfg.ratios[0]) if cfg.ratios else 0
        if server is None:
            starts = self.start_seconds
        else:  # imports done: priced from prestarted starts, or a cold one less the imports
            starts = self.prestarted_seconds or [max(s - PRESTART_SAVES_S, 0.0)
                                                 for s in self.start_seconds]
        need = max([self.args.min_config_s] + [s + first for s in starts])
        if self.time_left() < need:
            if server is not None:
                server.stop()
            for each in [cfg, *cfg.switched]:
                self.skip_rows(each, f"not run: time budget (--budget-s {self.args.budget_s}) "
                                     f"spent ({self.time_left():.0f} s left, {need:.0f} s "
                                     "needed to start a server and run once)", "")
            return None
        gated = server is not None
        if server is None:
            server = self.server_of(cfg, self.args.port)
        server.startup_timeout = min(self.args.startup_timeout, self.time_left())
        t0 = time.monotonic()
        try:
            server.start()
        except SGLangServerError as exc:
            first = str(exc).splitlines()[0]
            reason = first if isinstance(exc, SGLangServerTimeout) else failure_reason(
                server.log_text(), first)
            for each in [cfg, *cfg.switched]:
                self.skip_rows(each, "server did not start: " + reason, shlex.join(server.args))
            return None
        up_s = time.monotonic() - t0
        (self.prestarted_seconds if gated else self.start_seconds).append(up_s)
        print(f"[driver] {cfg.label}: server up in {up_s:.1f} s"
              + (" (prestarted: imports done while the previous config ran)" if gated else ""),
              flush=True)
        upcoming = None
        try:
            if following is not None:  # its imports overlap this config's runs
                upcoming = self.server_of(
                    following, None, f", prestarted: imports beside {cfg.label}'s runs")
                upcoming.prestart()
            self.bench_all(cfg, server.url)
            for variant in cfg.switched:
                mode = variant.meta["benchmark_mode"]
                problem = switch_mode(server.url, mode)
                if problem:
                    self.skip_rows(variant, f"benchmark mode not switched: {problem}", "")
                    continue
                print(f"[driver] {cfg.label}: switched to {variant.label} {mode}",
                      flush=True)
                self.bench_all(variant, server.url)
            if cfg.switched:
                switch_mode(server.url, plain_mode(cfg))
        except BaseException:
            if upcoming is not None:
                upcoming.stop()
            raise
        finally:
            server.stop()
            timeline = self.out / f"timeline_{cfg.label}"
            if timeline.is_dir():
                summarize_timeline(timeline)
        return upcoming

    def expected_run_s(self, cfg: ServerConfig, wl: list[str], ratio: float) -> float:
        """Seconds a run is likely to take: the recorded run closest to it
        (`benchmarks.gpu.estimate`, from `benchmarks/results/`) times `RUN_PRICE_FACTOR`, at
        least --min-run-s. A run that cannot finish in the time left is not started: the
        deadline would kill it (sglang-det's 8B ShareGPT run takes ~100 s)."""
        from benchmarks.gpu import estimate

        if self._recorded is None:
            self._recorded = estimate.recorded_rows()
        seconds, _ = estimate.price_run(self._recorded, self.args.model_path,
                                        workload_label(wl, self.bench_args), cfg.config, ratio,
                                        cfg.meta, 0.0)
        return max(self.args.min_run_s, RUN_PRICE_FACTOR * seconds)

    def bench_all(self, cfg: ServerConfig, url: str) -> None:
        for wl in self.workloads:
            for ratio in cfg.ratios:
                for repeat in range(self.args.repeats):
                    if self.time_left() < self.expected_run_s(cfg, wl, ratio):
                        if repeat == 0:  # a missing repeat needs no row: the first one stands
                            self.skip_rows(_with_ratio(cfg, ratio), "not run: time budget spent",
                                           "", [wl])
                        continue
                    self.bench(cfg, url, wl, ratio, repeat)

    def run(self) -> None:
        configs = list(server_configs(self.args))
        upcoming = None  # the next config's server, prestarted (--prestart-next)
        try:
            for i, cfg in enumerate(configs):
                following = (configs[i + 1] if self.args.prestart_next and i + 1 < len(configs)
                             else None)
                upcoming = self.run_config(cfg, upcoming, following)
        finally:
            if upcoming is not None:
                upcoming.stop()
            shutil.rmtree(self.rows_cache, ignore_errors=True)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-path", help="checkpoint folder given to every server")
    p.add_argument("--tokenizer", default=None, help="default: --model-path")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--configs", default="nondet,sglang-det,llm42",
                   help=f"comma list of {', '.join(CONFIGS)}")
    p.add_argument("--det-ratios", default="0.02,0.1,0.5,1.0")
    p.add_argument("--variant-ratios", default=None,
                   help="ratios for llm42-skip-compare / llm42-inject (default: --det-ratios)")
    p.add_argument("--args-variant-ratios", default=None,
                   help="ratios of the --llm42-args values after the first (default: "
                        "--det-ratios), e.g. 0.1 for a survey of variants beside a first one "
                        "run at every ratio")
    p.add_argument("--window-sizes", default="64",
                   help="comma list: one llm42 server each (one for all with --switch-variants)")
    p.add_argument("--verify-batch-size", type=int, default=8)
    p.add_argument("--pass-tokens", type=int, default=None,
                   help="B = this // W for each window of --window-sizes (a sweep at a constant "
                        "pass size, e.g. 512: W 16 B 32, W 32 B 16, W 64 B 8); overrides "
                        "--verify-batch-size")
    p.add_argument("--inject-mismatch-rate", type=float, default=0.05)
    p.add_argument("--server-args", default="", help="given identically to every config")
    p.add_argument("--llm42-args", action="append", default=None,
                   help="extra flags of every llm42 server, e.g. '--llm42-max-verify-wait 64' "
                        "(recorded as llm42_args; appended to the server label), after "
                        "optional NAME=value environment assignments, as in a shell; "
                        "repeatable: each llm42 config then runs once per value, '' = its "
                        "defaults")
    p.add_argument("--spec-args", default=DEFAULT_SPEC_ARGS,
                   help="speculative-decoding flags of the nondet-spec and llm42-spec configs "
                        "(their label names the algorithm)")
    p.add_argument("--workload", action="append", default=None,
                   help='bench_serving args of one workload, e.g. "--dataset-name random '
                        '--random-input-len 1024 --random-output-len 256"; repeatable '
                        '(default: "--dataset-name sharegpt")')
    p.add_argument("--bench-args", default="", help="bench_serving args for every run")
    p.add_argument("--backend", default="sglang")
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--startup-timeout", type=float, default=900.0)
    p.add_argument("--prestart-next", action="store_true",
                   help="launch each next server gated while the current one runs, so that its "
                        "Python imports (~50 s of a start on the H100 machine) overlap that run; "
                        "its GPU work waits for the current server to stop "
                        "(llm42.sglang.start_gate)")
    p.add_argument("--bench-timeout", type=float, default=None)
    p.add_argument("--budget-s", type=float, default=None,
                   help="overall deadline: later runs become skipped rows")
    p.add_argument("--min-config-s", type=float, default=120.0,
                   help="with --budget-s: least time left to start another server")
    p.add_argument("--min-run-s", type=float, default=30.0,
                   help="with --budget-s: least time left to start another benchmark (more "
                        "where a recorded run under benchmarks/results/ took longer: "
                        "expected_run_s)")
    p.add_argument("--repeats", type=int, default=1,
                   help="run every config, workload and ratio this many times in a row on its "
                        "server (rows carry `repeat`; the report compares each run with the "
                        "mean of its baseline's runs): a fresh server's first run against its "
                        "later ones, and the spread between runs")
    p.add_argument("--switch-variants", action="store_true",
                   help="run llm42-skip-compare / llm42-inject and every window of "
                        "--window-sizes on one llm42 server per --llm42-args value (started "
                        "with the largest window and --llm42-benchmark-modes, switched by POST "
                        "/llm42_benchmark_mode) instead of a server start each")
    p.add_argument("--timeline", action="store_true",
                   help="every server records a step timeline (--llm42-timeline-dir) into "
                        "OUT/timeline_LABEL/, summarized there when the server stops")
    p.add_argument("--profile-steps", type=int, default=0,
                   help="N > 0: during every benchmark run, once --profile-running requests "
                        "run and none wait, after --profile-settle-s, take a torch.profiler "
                        "trace of N forward steps (POST /start_profile, CPU + GPU, python "
                        "stacks) into OUT/profile_LABEL_rRATIO_WORKLOAD/, summarized there by "
                        "benchmarks.step_profile (profile.md, profile.json); 0: off")
    p.add_argument("--profile-running", type=int, default=200,
                   help="with --profile-steps: the running requests that start the profile")
    p.add_argument("--profile-settle-s", type=float, default=3.0,
                   help="with --profile-steps: seconds between that load and the profile")
    p.add_argument("--report-only", action="store_true",
                   help="only regenerate table.md and the plots from --out-dir/results.jsonl")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = Path(args.out_dir)
    if not args.report_only:
        if not args.model_path:
            raise SystemExit("error: --model-path is required (unless --report-only).")
        if args.repeats < 1:
            raise SystemExit(f"error: --repeats must be at least 1, got {args.repeats}.")
        out.mkdir(parents=True, exist_ok=True)
        driver = Driver(args)
        driver.log_command("driver", getattr(sys, "orig_argv", sys.argv))
        driver.run()
    results = out / RESULTS
    if not results.is_file():
        raise SystemExit(f"error: no {results} to report on.")
    for path in report.write_report(results, out):
        print(f"[driver] wrote {path}")
    print((out / "table.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
