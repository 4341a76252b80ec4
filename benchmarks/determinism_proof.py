"""Proof of selective determinism: repeated requests under changing load, compared bitwise.

    python -m benchmarks.determinism_proof --url http://127.0.0.1:30000 --mode llm42 --out-dir p/
    python -m benchmarks.determinism_proof --launch --model-path M --server-args "..." \
        --mode both --background 0,16,64,256 --out-dir p/

A set of requests (each prompt greedy, at temperature 0.8 with a per-request seed, and seeded
with top-p 0.9, top-k 20 or min-p 0.05 in turn; with `--features`, one seeded request per prompt
and feature: `n2` (n = 2, both samples compared), `penalty` (frequency, presence and repetition
penalties), `json` (a JSON schema), `lora` (the adapter `--lora-name`, which the server must
serve)) is sent
in every trial: alone (background 0: one request at a time) and among N concurrent normal
requests of mixed prompt and output lengths, `--repeats` times per background level, all with
`return_logprob`. Every repetition of a request is compared with its first one: token ids, and
log-probs by their bits. `--mode llm42` sends `is_deterministic: true` (needs --enable-llm42)
and expects all repetitions identical; `--mode control` sends the same requests without the
flag and expects at least one divergence (else this setup cannot tell the modes apart);
`--mode both` runs control after llm42 on the same server. `--reference proof.json` (repeatable)
also compares every llm42 trial with earlier proofs' llm42 outputs: other servers (another W and
B, speculative decoding on or off). Exit code 0 when the expectation of
every mode run holds, 1 otherwise. Writes `proof.json` and `proof.md` into `--out-dir`.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import asyncio
import contextlib
import datetime
import json
import random
import shlex
import time
from dataclasses import dataclass

import aiohttp

from benchmarks import env_info
from benchmarks.proof_compare import RequestReport, compare_repetitions, expectation_holds
from benchmarks.request_funcs import make_session
from benchmarks.server_state import json_of, llm42_stats

PROMPTS = [
    ("Explain how a large language model inference server schedules requests and batches the "
     "decoding steps of many users at once."),
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "def quicksort(items):\n    \"\"\"Sort a list of integers.\"\"\"\n",
    "List the planets of the solar system and one remarkable fact about each of them:",
    "Translate into French: The weather is beautiful today and we are going to the market.",
    "The history of the printing press begins",
    "Q: What is the derivative of x^3 * sin(x)?\nA:",
    "Summarize the causes of the First World War in five bullet points.",
]
WORDS = ["the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on", "not", "this", "are", "or", "from", "at", "which", "but", "have", "an", "they", "you", "were", "one", "all", "we", "can", "has", "been", "if", "more", "when", "will", "would", "who", "so", "no", "time", "system", "model", "token", "server", "batch", "kernel", "memory", "value", "result", "engine", "request", "output", "input", "layer", "cache", "graph", "python", "compute", "matrix", "vector"]


# Seeded truncated kinds (they draw their noise by vocabulary id): one per prompt, in turn.
TRUNCATED = ((("top_p", 0.9),), (("top_k", 20),), (("min_p", 0.05),))
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["title", "points"],
          "properties": {"title": {"type": "string", "maxLength": 60},
                         "points": {"type": "array", "minItems": 2, "maxItems": 4,
                                    "items": {"type": "string", "maxLength": 80}}}}
# Sampling-API features: extra sampling_params of the feature's request.
FEATURES: dict[str, tuple] = {
    "n2": (("n", 2),),
    "penalty": (("frequency_penalty", 0.4), ("presence_penalty", 0.3),
                ("repetition_penalty", 1.1)),
    "json": (("json_schema", json.dumps(SCHEMA, sort_keys=True)),),
    "lora": (),  # the body's lora_path is the request's `lora`
}


@dataclass(frozen=True)
class DetRequest:
    prompt_index: int
    prompt: str
    temperature: float
    sampling_seed: int | None
    truncation: tuple = ()  # (("top_p", 0.9),): more sampling_params
    feature: str | None = None  # a key of FEATURES
    lora: str | None = None  # adapter name (the `lora` feature)

    @property
    def label(self) -> str:
        if self.feature is not None:
            return f"p{self.prompt_index}-t{self.temperature:g}-{self.feature}-seed{self.sampling_seed}"
        if self.temperature == 0:
            return f"p{self.prompt_index}-greedy"
        kind = "".join(f"-{k}{v:g}" for k, v in self.truncation)
        return f"p{self.prompt_index}-t{self.temperature:g}{kind}-seed{self.sampling_seed}"


def det_requests(num_prompts: int, seed: int, features: tuple[str, ...] = (),
                 lora_name: str | None = None) -> list[DetRequest]:
    """Per prompt: greedy, t = 0.8 seeded, a seeded top-p / top-k / min-p request in turn, and a
    seeded t = 0.8 request per feature."""
    unknown = set(features) - set(FEATURES)
    if unknown:
        raise ValueError(f"unknown features {sorted(unknown)}: expected some of {list(FEATURES)}")
    if "lora" in features and not lora_name:
        raise ValueError("the lora feature needs the adapter's name (--lora-name)")
    out = []
    for i in range(num_prompts):
        prompt = PROMPTS[i % len(PROMPTS)] + (f" (variant {i // len(PROMPTS)})" if (
            i >= len(PROMPTS)) else "")
        out.append(DetRequest(i, prompt, 0.0, None))
        out.append(DetRequest(i, prompt, 0.8, seed + i))
        out.append(DetRequest(i, prompt, 1.0, seed + 1000 + i, TRUNCATED[i % len(TRUNCATED)]))
        for k, name in enumerate(features):
            out.append(DetRequest(i, prompt, 0.8, seed + 2000 + 10 * i + k, feature=name,
                                  lora=lora_name if name == "lora" else None))
    return out


def background_bodies(n: int, rng: random.Random, max_new_tokens: int,
                      max_prompt_words: int) -> list[dict]:
    """Normal requests of mixed lengths (prompt 4..max_prompt_words words, output 8..1.5x)."""
    bodies = []
    for _ in range(n):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, max_prompt_words)))
        sampling = {"temperature": rng.choice((0.0, 0.8)), "ignore_eos": True,
                    "max_new_tokens": rng.randint(8, max(9, int(1.5 * max_new_tokens)))}
        bodies.append({"text": text, "sampling_params": sampling})
    return bodies


def det_body(req: DetRequest, max_new_tokens: int, send_flag: bool) -> dict:
    sampling = {"temperature": req.temperature, "max_new_tokens": max_new_tokens,
                # a grammar must be free to end its output
                "ignore_eos": req.feature != "json", **dict(req.truncation),
                **dict(FEATURES.get(req.feature, ()))}
    if req.sampling_seed is not None:
        sampling["sampling_seed"] = req.sampling_seed
    if send_flag:
        sampling["is_deterministic"] = True
    body = {"text": req.prompt, "sampling_params": sampling, "return_logprob": True}
    if req.lora is not None:
        body["lora_path"] = req.lora
    return body


async def _post(session: aiohttp.ClientSession, url: str, body: dict) -> dict:
    async with session.post(url + "/generate", json=body) as r:
        text = await r.text()
        if r.status != 200:
            raise RuntimeError(f"/generate answered HTTP {r.status}: {text[:1000]}")
        return json.loads(text)


def _sample(out) -> tuple[list[int], list[float], dict]:
    """(token ids, logprobs, meta_info); an n > 1 answer (a list) gives its samples' ids and
    logprobs one after the other, each sample followed by -1 / NaN, and summed counters."""
    if isinstance(out, list):
        parts = [_sample(o) for o in out]
        meta = {key: sum(int(p[2].get(key) or 0) for p in parts)
                for key in ("llm42_rollbacks", "llm42_verify_passes", "completion_tokens",
                            "spec_verify_ct")}
        return ([t for p in parts for t in [*p[0], -1]],
                [v for p in parts for v in [*p[1], float("nan")]], meta)
    meta = out.get("meta_info") or {}
    ids = out.get("output_ids") or meta.get("output_ids") or []
    lps = [t[0] for t in meta.get("output_token_logprobs") or []]
    return list(ids), lps, meta


async def run_trial(url: str, reqs: list[DetRequest], background: int, rng: random.Random,
                    args, send_flag: bool) -> list[tuple[list[int], list[float], dict]]:
    async with make_session(args.request_timeout) as session:
        bodies = [det_body(r, args.max_new_tokens, send_flag) for r in reqs]
        if background == 0:  # alone: one request at a time, nothing else on the server
            return [_sample(await _post(session, url, b)) for b in bodies]
        jobs = [("det", i, b) for i, b in enumerate(bodies)] + [
            ("bg", -1, b) for b in background_bodies(background, rng, args.max_new_tokens,
                                                     args.max_background_words)]
        rng.shuffle(jobs)  # a different arrival order, so different batches, in every trial
        results = await asyncio.gather(*(_post(session, url, b) for _, _, b in jobs))
        det = {i: _sample(out) for (kind, i, _), out in zip(jobs, results) if kind == "det"}
        return [det[i] for i in range(len(bodies))]


def run_mode(url: str, mode: str, args) -> dict:
    reqs = det_requests(args.num_prompts, args.seed, _features(args), args.lora_name)
    levels = [int(x) for x in args.background.split(",")]
    samples: list[list[tuple[list[int], list[float]]]] = [[] for _ in reqs]
    trials, meta_sums = [], [{"rollbacks": 0, "verify_passes": 0, "tokens": 0, "spec_steps": 0}
                             for _ in reqs]
    for rep in range(args.repeats):
        for level in levels:
            rng = random.Random(f"{args.seed}-{mode}-{rep}-{level}")
            t0 = time.perf_counter()
            outs = asyncio.run(run_trial(url, reqs, level, rng, args, send_flag=mode == "llm42"))
            trials.append({"repeat": rep, "background": level,
                           "seconds": round(time.perf_counter() - t0, 3)})
            for k, (ids, lps, meta) in enumerate(outs):
                samples[k].append((ids, lps))
                meta_sums[k]["rollbacks"] += int(meta.get("llm42_rollbacks") or 0)
                meta_sums[k]["verify_passes"] += int(meta.get("llm42_verify_passes") or 0)
                if meta.get("spec_verify_ct"):  # a speculative server: its steps of this request
                    meta_sums[k]["spec_steps"] += int(meta["spec_verify_ct"])
                    meta_sums[k]["tokens"] += int(meta.get("completion_tokens") or 0)
            print(f"[proof {mode}] repeat {rep} background {level}: "
                  f"{trials[-1]['seconds']} s", flush=True)
    trial_names = [f"r{t['repeat']}-bg{t['background']}" for t in trials]
    own = [s[0] for s in samples]  # this server's first trial: what a later proof refers to
    references = _references(args, mode, len(reqs))
    if references:  # other servers' outputs lead: every trial must equal each of them
        samples = [[*refs, *got] for refs, got in zip(zip(*references.values()), samples)]
        trial_names = [*references, *trial_names]
    reports = [compare_repetitions(s) for s in samples]
    return {"mode": mode, "expectation_holds": expectation_holds(mode, reports),
            "outputs": [[list(ids), list(lps)] for ids, lps in own],
            "expectation": ("every repetition bitwise identical" if mode == "llm42"
                            else "at least one divergence"),
            "trials": trials, "spec_accept_length": _accept_length(meta_sums),
            "requests": [_request_json(r, rep, trial_names, sums, samples[k][0])
                         for k, (r, rep, sums) in enumerate(zip(reqs, reports, meta_sums))]}


def _accept_length(sums: list[dict]) -> float | None:
    """Tokens per speculative step of this mode's requests over all trials (None: no
    speculative decoding on the server)."""
    steps = sum(s["spec_steps"] for s in sums)
    return round(sum(s["tokens"] for s in sums) / steps, 3) if steps else None


def _references(args, mode: str, num_requests: int) -> dict[str, list[tuple]]:
    """`--reference` (repeatable): the llm42 mode's outputs of earlier proofs (other servers,
    e.g. other W and B with the row-invariant verifier, or without speculative decoding), by
    trial name ("reference", or "reference-FOLDER" with several), one (ids, logprobs) per
    request; empty without. The first leads: the others and every trial are compared with it."""
    paths = getattr(args, "reference", None) or []
    paths = [paths] if isinstance(paths, (str, Path)) else paths
    if mode != "llm42" or not paths:
        return {}
    out = {}
    for path in paths:
        runs = json.loads(Path(path).read_text())["runs"]
        outputs = next(r["outputs"] for r in runs if r["mode"] == "llm42")
        if len(outputs) != num_requests:
            raise SystemExit(f"error: --reference {path} has {len(outputs)} requests, this "
                             f"proof {num_requests}: run both with the same --num-prompts and "
                             "--features")
        name = "reference" if len(paths) == 1 else f"reference-{Path(path).parent.name}"
        name = f"{name}-{len(out)}" if name in out else name
        out[name] = [(ids, lps) for ids, lps in outputs]
    return out


def _request_json(req: DetRequest, rep: RequestReport, names: list[str], sums: dict,
                  first: tuple[list[int], list[float]]) -> dict:
    return {"label": req.label, "temperature": req.temperature, **dict(req.truncation),
            "feature": req.feature,
            "sampling_seed": req.sampling_seed, "prompt": req.prompt,
            "output_len": len(first[0]), "num_repetitions": rep.num_repetitions,
            "identical": rep.identical, "num_divergent_repetitions": rep.num_divergent,
            "first_divergence": rep.first_divergence,
            "first_token_divergence": rep.first_token_divergence,
            "max_abs_logprob_diff": rep.max_abs_logprob_diff,
            "per_repetition": [{"trial": n, "first_divergence": d.first_divergence,
                                "first_token_divergence": d.first_token_divergence,
                                "max_abs_logprob_diff": d.max_abs_logprob_diff}
                               for n, d in zip(names[1:], rep.diffs)],
            "llm42_rollbacks": sums["rollbacks"], "llm42_verify_passes": sums["verify_passes"],
            # SGLang's spec_accept_length over all trials (tokens per speculative step)
            "spec_accept_length": (round(sums["tokens"] / sums["spec_steps"], 3)
                                   if sums["spec_steps"] else None),
            "reference_token_ids_head": first[0][:32]}


def markdown(result: dict) -> str:
    server = (f"- server: `{result['url']}` model `{result['model']}`; gpu {result['gpu']}; "
              f"commit {result['git_commit']}")
    load = (f"- {result['num_requests']} requests x {result['num_trials']} trials (background "
            f"levels {result['background_levels']}, {result['repeats']} repeats each), "
            f"{result['max_new_tokens']} new tokens, return_logprob, bitwise comparison")
    lines = [f"# Determinism proof ({result['timestamp']})", "", server,
             f"- server args: `{result['server_args']}`", load,
             f"- command: `{result['command']}`",
             f"- TP ranks applied the same decisions: {result.get('tp_ranks_agree', True)} "
             f"({len((result.get('llm42_stats_after') or {}).get('rank_ledgers', []))} "
             f"scheduler ledgers)", ""]
    for run in result["runs"]:
        verdict = "HOLDS" if run["expectation_holds"] else "FAILS"
        lines += [f"## mode `{run['mode']}`: expectation ({run['expectation']}) {verdict}", ""]
        if run.get("spec_accept_length"):
            lines += [f"Speculative decoding: {run['spec_accept_length']} tokens per step "
                      "(SGLang's spec_accept_length over these requests and trials).", ""]
        lines += [("| request | identical | divergent reps | first divergent position | "
                   "first token divergence | max abs logprob diff | llm42 rollbacks |"),
                  "|---|---|---|---|---|---|---|"]
        for r in run["requests"]:
            lines.append(f"| {r['label']} | {r['identical']} | {r['num_divergent_repetitions']}/"
                         f"{r['num_repetitions'] - 1} | {_dash(r['first_divergence'])} | "
                         f"{_dash(r['first_token_divergence'])} | "
                         f"{r['max_abs_logprob_diff']:.3g} | {r['llm42_rollbacks']} |")
        lines.append("")
    return "\n".join(lines)


def _features(args) -> tuple[str, ...]:
    return tuple(f for f in args.features.split(",") if f)


def _dash(value) -> str:
    return "-" if value is None else str(value)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:30000")
    p.add_argument("--mode", choices=("llm42", "control", "both"), default="llm42")
    p.add_argument("--num-prompts", type=int, default=4, help="each greedy, t=0.8 seeded and one seeded top-p/top-k/min-p")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--background", default="0,16,64,256",
                   help="comma list of concurrent normal requests per trial (0 = alone)")
    p.add_argument("--repeats", type=int, default=2, help="trials per background level")
    p.add_argument("--max-background-words", type=int, default=600)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--request-timeout", type=float, default=1800.0)
    p.add_argument("--out-dir", default=".")
    p.add_argument("--launch", action="store_true", help="start (and stop) the server here")
    p.add_argument("--model-path", default=None)
    p.add_argument("--server-args", default="")
    p.add_argument("--startup-timeout", type=float, default=900.0)
    p.add_argument("--features", default="",
                   help=f"comma list of sampling-API requests to add per prompt: {','.join(FEATURES)}")
    p.add_argument("--lora-name", default=None, help="adapter the lora feature's requests use")
    p.add_argument("--reference", action="append", default=None,
                   help="proof.json of an earlier proof (another server, e.g. other W and B "
                        "with --llm42-verifier row-invariant, or no speculative decoding): "
                        "every llm42 trial must equal its outputs bitwise too; repeatable "
                        "(each must also equal the first)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    try:
        num_requests = len(det_requests(args.num_prompts, args.seed, _features(args),
                                        args.lora_name))
    except ValueError as exc:
        p.error(str(exc))
    levels = args.background.split(",")
    if args.repeats * len(levels) < 2:
        p.error("need at least 2 trials (--repeats x number of --background levels).")
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    modes = ["llm42", "control"] if args.mode == "both" else [args.mode]

    server_args = shlex.split(args.server_args)
    with contextlib.ExitStack() as stack:
        url, model = args.url.rstrip("/"), args.model_path
        if args.launch:
            if not args.model_path:
                p.error("--launch needs --model-path.")
            from llm42.server_process import SGLangServer

            if "llm42" in modes and "--enable-llm42" not in server_args:
                server_args.append("--enable-llm42")
            server = SGLangServer(args.model_path, server_args, log_path=out / "server.log",
                                  startup_timeout=args.startup_timeout)
            stack.enter_context(server)
            url = server.url
            with open(out / "commands.txt", "a", encoding="utf-8") as f:
                f.write(shlex.join(server.args) + "\n")
        model = model or (json_of(url + "/get_model_info") or {}).get("model_path")
        stats = llm42_stats(url)
        if "llm42" in modes and not (stats or {}).get("enabled"):
            print(f"error: --mode llm42 needs a server started with --enable-llm42; "
                  f"{url}/llm42_stats says {stats}.", file=sys.stderr)
            return 1
        runs = [run_mode(url, mode, args) for mode in modes]
        stats_after = llm42_stats(url)
    result = {"timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "command": shlex.join(getattr(sys, "orig_argv", sys.argv)), "url": url,
              "model": model, "server_args": shlex.join(server_args) if args.launch else None,
              "gpu": env_info.gpu_name(), "git_commit": env_info.git_commit(),
              "num_requests": num_requests, "max_new_tokens": args.max_new_tokens,
              "background_levels": [int(x) for x in levels], "repeats": args.repeats,
              "num_trials": args.repeats * len(levels), "llm42_stats_before": stats,
              "llm42_stats_after": stats_after, "runs": runs,
              # under TP every rank must have applied the same decisions (llm42.sglang.tp_share)
              "tp_ranks_agree": (stats_after or {}).get("tp_ranks_agree", True),
              "all_expectations_hold": all(r["expectation_holds"] for r in runs)}
    result["all_expectations_hold"] &= result["tp_ranks_agree"]
    (out / "proof.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "proof.md").write_text(markdown(result))
    print(markdown(result))
    return 0 if result["all_expectations_hold"] else 1


if __name__ == "__main__":
    sys.exit(main())
