"""Load soak: thousands of mixed requests with aborts; checks 5xx, leaks and determinism.

    python -m benchmarks.soak --url http://127.0.0.1:30000 --out-dir soak/
    python -m benchmarks.soak --launch --out-dir benchmarks/results/cpu-soak/   # `make soak`

`--launch` starts the server here (default `--server-args`: W=8, B=4, fault injection 0.2,
`--random-seed 7`, context 1024; `--enable-llm42` is always added) and stops it at the end.

A seeded plan of `--num-requests` requests over `/generate`, `/v1/completions` and
`/v1/chat/completions`, streaming and not. `--det-fraction` of them are deterministic, each drawn
from a small pool of distinct (prompt, endpoint, greedy or t=0.8 seeded, max tokens) specs; every
spec first gets a reference, taken alone on the server (sequentially, nothing else running).
The other requests are normal requests of mixed prompt and output lengths. `--abort-fraction` of
all requests get aborted: by `POST /abort_request` with their `rid` (after a few stream chunks,
or after a random delay when not streaming) or, for streams, by closing the connection.
Everything runs at `--concurrency` requests in flight.

Checks (exit code 1 when any fails, 0 otherwise):
  * no HTTP status >= 500 (also SSE error events with such a code, and /abort_request answers),
    no 4xx (every planned request is valid), no transport errors, no stream cut short;
  * every completed deterministic request is identical to its reference: native `output_ids`
    and `output_token_logprobs` (floats by their bits), OpenAI text, logprobs and
    `completion_tokens`; finish reasons equal;
  * an aborted deterministic request's partial output (where visible) is a prefix of its
    reference;
  * after the load drains: the server is idle, `/health` is 200 (SGLang's strict idle leak check
    kills the scheduler on any leaked KV slot or request row, so healthy + idle means no leak),
    the launched server process is alive, KV tokens in use (`/v1/loads` num_used_tokens, radix
    cache excluded) are 0, llm42's `reserved_kv_tokens` is 0, and no `inconsistent_tokens`;
  * `--recheck` specs taken alone again after the soak still equal their references.

Writes into `--out-dir`: `soak.jsonl` (one summary row), `soak.md` (figures table),
`commands.txt` (this command, the server command, git commit, CPU model) and, with
`--per-request-log`, `soak_requests.jsonl` (one row per request). With `--launch` and no
`--model-path` the server runs the tiny random Llama of the tests (bf16, hidden 256, seed 0).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: import `benchmarks` from the repo root
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import json
import os
import platform
import random
import shlex
import struct
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

import aiohttp

from benchmarks import env_info

ENDPOINTS = ("generate", "completions", "chat")
PATHS = {"generate": "/generate", "completions": "/v1/completions",
         "chat": "/v1/chat/completions"}
DET_PROMPTS = [
    "The quick brown fox jumps over the lazy dog because",
    "In a distant galaxy, the ancient robots",
    "def fibonacci(n):",
    "Once upon a time there was a small village where",
    "The capital of France is",
    "List three reasons why the sky is blue:",
    "Explain how a server batches the decoding steps of many users at once.",
    "Translate into French: the weather is beautiful today.",
]
WORDS = ("the of and to in is that for it as was with be by on not this are or from at which "
         "but have an they you were one all we can has been if more when will would who so no "
         "time system model token server batch kernel memory value result engine request "
         "output input layer cache graph python compute matrix vector").split()
TINY_MODEL = dict(preset="tiny", seed=0, std=0.05, dtype="bfloat16",
                  overrides={"hidden_size": 256, "intermediate_size": 512})
TINY_MODEL_LABEL = "tiny random Llama (bf16, hidden 256, intermediate 512, std 0.05, seed 0)"
DEFAULT_SERVER_ARGS = ("--llm42-window-size 8 --llm42-verify-batch-size 4 "
                       "--llm42-inject-mismatch-rate 0.2 --random-seed 7 --context-length 1024")
MAX_FAILURES_KEPT = 200
# in the server log of a launched server: SGLang's idle leak checks (warnings when not strict),
# and any traceback
LOG_MARKERS = ("memory leak detected", "double free", "use-after-free",
               "Traceback (most recent call last)")
# SGLang's idle check raises (kills the scheduler) on a leaked KV slot or request row; its default
# is strict, this makes sure of it for a server launched here
STRICT_LEAK_ENV = {"SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "true"}


# -- the plan ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class SoakConfig:
    num_requests: int = 2000
    det_fraction: float = 0.3
    abort_fraction: float = 0.05
    concurrency: int = 64
    seed: int = 0
    min_new_tokens: int = 2
    max_new_tokens: int = 12
    pool_size: int = 12  # distinct deterministic specs (each gets a solo reference)
    max_prompt_words: int = 40
    recheck: int = 4  # specs taken alone again after the soak
    request_timeout: float = 900.0
    drain_timeout: float = 300.0
    idle_settle_s: float = 1.0  # idle scheduler iterations (each runs the leak check)
    run_tag: str = "soak"
    progress: bool = True


@dataclass(frozen=True)
class DetSpec:
    spec_id: int
    prompt: str
    endpoint: str
    temperature: float
    seed: int | None
    max_new_tokens: int

    @property
    def label(self) -> str:
        mode = "greedy" if self.temperature == 0 else f"t{self.temperature:g}-s{self.seed}"
        return f"d{self.spec_id}-{self.endpoint}-{mode}-n{self.max_new_tokens}"


@dataclass(frozen=True)
class PlannedRequest:
    index: int
    rid: str
    endpoint: str
    stream: bool
    spec_id: int | None  # deterministic spec, None for a normal request
    abort: str | None  # None, "rid" (POST /abort_request) or "disconnect" (streams only)
    abort_after_chunks: int  # streams: abort once this many data chunks arrived
    abort_delay_s: float  # non-streaming rid aborts: abort after this delay
    body: dict
    max_new_tokens: int

    @property
    def det(self) -> bool:
        return self.spec_id is not None


@dataclass
class Plan:
    specs: list[DetSpec]
    requests: list[PlannedRequest]


def det_body(spec: DetSpec, *, stream: bool, rid: str) -> dict:
    """The one request a spec stands for (only `stream`, `stream_options` and `rid` vary)."""
    if spec.endpoint == "generate":
        sp = {"max_new_tokens": spec.max_new_tokens, "temperature": spec.temperature,
              "is_deterministic": True}
        if spec.seed is not None:
            sp["sampling_seed"] = spec.seed
        return {"text": spec.prompt, "sampling_params": sp, "return_logprob": True,
                "stream": stream, "rid": rid}
    body = {"model": "default", "max_tokens": spec.max_new_tokens,
            "temperature": spec.temperature, "is_deterministic": True, "stream": stream,
            "rid": rid}
    if spec.seed is not None:
        body["seed"] = spec.seed
    if spec.endpoint == "completions":
        body.update(prompt=spec.prompt, logprobs=1)
    else:
        body.update(messages=[{"role": "user", "content": spec.prompt}], logprobs=True,
                    top_logprobs=1)
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def _normal_body(rng: random.Random, endpoint: str, stream: bool, rid: str, max_new: int,
                 max_words: int) -> dict:
    if rng.random() < 0.3:  # a deterministic prompt: normal requests may share its prefix
        prompt = rng.choice(DET_PROMPTS)
        if rng.random() < 0.5:
            prompt += " " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 20)))
    else:
        prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, max_words)))
    temperature = rng.choice((0.0, 0.7, 1.0))
    flag = rng.random() < 0.25  # sends is_deterministic: false explicitly
    logprobs = rng.random() < 0.3
    ignore_eos = rng.random() < 0.5
    if endpoint == "generate":
        sp = {"max_new_tokens": max_new, "temperature": temperature, "ignore_eos": ignore_eos}
        if temperature > 0 and rng.random() < 0.5:
            sp["top_p"] = 0.9
        if flag:
            sp["is_deterministic"] = False
        body = {"text": prompt, "sampling_params": sp, "stream": stream, "rid": rid}
        if logprobs:
            body["return_logprob"] = True
        return body
    body = {"model": "default", "max_tokens": max_new, "temperature": temperature,
            "ignore_eos": ignore_eos, "stream": stream, "rid": rid}
    if flag:
        body["is_deterministic"] = False
    if endpoint == "completions":
        body["prompt"] = prompt
        if logprobs:
            body["logprobs"] = 1
    else:
        body["messages"] = [{"role": "user", "content": prompt}]
        if logprobs:
            body.update(logprobs=True, top_logprobs=1)
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def build_plan(cfg: SoakConfig) -> Plan:
    """Seeded: the same config gives the same plan (rids carry `cfg.run_tag`)."""
    if cfg.num_requests < 1 or not 0 <= cfg.det_fraction <= 1 or not 0 <= cfg.abort_fraction <= 1:
        raise ValueError("need num_requests >= 1 and fractions in [0, 1]")
    if not 1 <= cfg.min_new_tokens <= cfg.max_new_tokens:
        raise ValueError("need 1 <= min_new_tokens <= max_new_tokens")
    rng = random.Random(cfg.seed)
    n = cfg.num_requests
    n_det = round(n * cfg.det_fraction)
    pool = max(1, min(cfg.pool_size, n_det)) if n_det else 0
    specs = []
    for i in range(pool):  # cycles endpoints and sampling modes: every combination appears
        greedy = (i // len(ENDPOINTS)) % 2 == 0
        specs.append(DetSpec(
            spec_id=i, prompt=DET_PROMPTS[i % len(DET_PROMPTS)],
            endpoint=ENDPOINTS[i % len(ENDPOINTS)], temperature=0.0 if greedy else 0.8,
            seed=None if greedy else 1000 + i,
            max_new_tokens=rng.randint(cfg.min_new_tokens, cfg.max_new_tokens)))
    det_indices = set(rng.sample(range(n), n_det))
    abort_indices = set(rng.sample(range(n), round(n * cfg.abort_fraction)))
    spec_of = [i % pool for i in range(n_det)] if pool else []
    rng.shuffle(spec_of)  # every spec used, in a random order
    requests, k = [], 0
    for i in range(n):
        rid = f"{cfg.run_tag}-{i:06d}"  # fixed width: SGLang aborts every rid a rid prefixes
        stream = rng.random() < 0.5
        abort = None
        if i in abort_indices:
            abort = rng.choice(("rid", "disconnect")) if stream else "rid"
        after_chunks = rng.randint(1, 3)
        delay = round(rng.uniform(0.05, 3.0), 3)
        if i in det_indices:
            spec = specs[spec_of[k]]
            k += 1
            requests.append(PlannedRequest(
                i, rid, spec.endpoint, stream, spec.spec_id, abort, after_chunks, delay,
                det_body(spec, stream=stream, rid=rid), spec.max_new_tokens))
        else:
            endpoint = rng.choice(ENDPOINTS)
            max_new = rng.randint(cfg.min_new_tokens, cfg.max_new_tokens)
            body = _normal_body(rng, endpoint, stream, rid, max_new, cfg.max_prompt_words)
            requests.append(PlannedRequest(i, rid, endpoint, stream, None, abort, after_chunks,
                                           delay, body, max_new))
    return Plan(specs, requests)


# -- one response, normalized ------------------------------------------------------------------
def bits(value):
    """Floats as their IEEE-754 bits (so -0.0 != 0.0 and NaN == NaN), recursively."""
    if isinstance(value, float):
        return "f" + struct.pack(">d", value).hex()
    if isinstance(value, dict):
        return {k: bits(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [bits(v) for v in value]
    return value


class Assembler:
    """Turns a response (one JSON body, or the SSE chunks of a stream) into one output dict:
    `ids` (native only), `text` (OpenAI only), `logprobs`, `completion_tokens`, `finish`."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        self.ids: list[int] = []
        self.text = ""
        self.logprobs: list = []
        self.completion_tokens: int | None = None
        self.finish: str | None = None
        self.rollbacks: int | None = None
        self.retractions: int | None = None
        self.streamed = False

    # native chunks are cumulative (SGLang's default, no incremental_streaming_output)
    def _native(self, out: dict) -> None:
        meta = out.get("meta_info") or {}
        self.ids = list(out.get("output_ids") or [])
        self.text = out.get("text") or ""
        self.logprobs = [list(t[:2]) for t in meta.get("output_token_logprobs") or []]
        self.completion_tokens = meta.get("completion_tokens", self.completion_tokens)
        reason = meta.get("finish_reason")
        if reason:
            self.finish = reason.get("type") if isinstance(reason, dict) else str(reason)
        if meta.get("llm42_rollbacks") is not None:
            self.rollbacks = int(meta["llm42_rollbacks"])
        if meta.get("num_retractions") is not None:
            self.retractions = int(meta["num_retractions"])

    def _choice(self, choice: dict, stream: bool) -> None:
        if self.endpoint == "completions":
            self.text += choice.get("text") or ""
            lp = choice.get("logprobs") or {}
            self.logprobs += [list(e) for e in zip(lp.get("tokens") or [],
                                                   lp.get("token_logprobs") or [],
                                                   lp.get("top_logprobs") or [])]
        else:
            part = choice.get("delta" if stream else "message") or {}
            self.text += part.get("content") or ""
            self.logprobs += list((choice.get("logprobs") or {}).get("content") or [])
        if choice.get("finish_reason"):
            self.finish = choice["finish_reason"]

    def add_body(self, out: dict) -> None:
        if self.endpoint == "generate":
            self._native(out)
            return
        for choice in out.get("choices") or []:
            self._choice(choice, stream=False)
        usage = out.get("usage") or {}
        if usage.get("completion_tokens") is not None:
            self.completion_tokens = usage["completion_tokens"]

    def add_chunk(self, out: dict) -> None:
        self.streamed = True
        if self.endpoint == "generate":
            self._native(out)
            return
        for choice in out.get("choices") or []:
            self._choice(choice, stream=True)
        usage = out.get("usage") or {}
        if usage.get("completion_tokens") is not None:
            self.completion_tokens = usage["completion_tokens"]

    def output(self) -> dict:
        out = {"logprobs": self.logprobs, "completion_tokens": self.completion_tokens,
               "finish": self.finish}
        if self.endpoint == "generate":
            out["ids"] = self.ids
        else:
            out["text"] = self.text
        if self.endpoint == "chat" and self.streamed:
            out["chat_stream"] = True
        return out


def compare_full(ref: dict, got: dict) -> str | None:
    """None when `got` is bitwise the reference output; else what differs first.

    Streamed chat logprobs are compared as `chat_stream_logprobs_problem` says (SGLang 0.5.17
    loses information there); everything else, top logprobs included, exactly.
    """
    for key in ("ids", "text", "completion_tokens", "finish"):
        if key in ref and ref[key] != got.get(key):
            return f"{key} differs: {_show(ref[key])} vs {_show(got.get(key))}"
    if got.get("chat_stream"):
        return chat_stream_logprobs_problem(ref["logprobs"], got["logprobs"], full=True)
    a, b = bits(ref["logprobs"]), bits(got["logprobs"])
    if a != b:
        pos = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        return (f"logprobs differ at token {pos} (lengths {len(a)} vs {len(b)}): "
                f"{_show(ref['logprobs'][pos:pos + 1])} vs {_show(got['logprobs'][pos:pos + 1])}")
    return None


def compare_prefix(ref: dict, got: dict) -> str | None:
    """None when the partial output `got` is a prefix of the reference (ids or text, and the
    logprobs seen so far, bitwise)."""
    if "ids" in ref:
        ids = got.get("ids") or []
        if ref["ids"][: len(ids)] != ids or len(ids) > len(ref["ids"]):
            return f"ids {_show(ids)} are no prefix of {_show(ref['ids'])}"
    else:
        text = got.get("text") or ""
        if not ref["text"].startswith(text):
            return f"text {_show(text)} is no prefix of {_show(ref['text'])}"
    lps = got.get("logprobs") or []
    if got.get("chat_stream"):
        return chat_stream_logprobs_problem(ref["logprobs"], lps, full=False)
    if len(lps) > len(ref["logprobs"]) or bits(ref["logprobs"][: len(lps)]) != bits(lps):
        return f"logprobs ({len(lps)}) are no prefix of the reference's ({len(ref['logprobs'])})"
    return None


def _without_top(entry: dict) -> dict:
    return {k: v for k, v in entry.items() if k != "top_logprobs"}


def _droppable(entry: dict) -> bool:
    """A token whose text alone is empty or an incomplete UTF-8 sequence: a streamed step of
    only such tokens has an empty text delta."""
    token = entry.get("token") or ""
    return token == "" or "\ufffd" in token


def chat_stream_logprobs_problem(ref_lps: list, got_lps: list, full: bool) -> str | None:
    """Streamed chat logprobs against the reference's, allowing for two SGLang 0.5.17 bugs in
    `serving_chat.py` (neither llm42's): (1) `_process_logprobs_tokens(use_token_index=False)`
    gives every token of a multi-token chunk the first token's `top_logprobs` (llm42 streams a
    deterministic request a verified window per chunk), so top logprobs are not compared;
    (2) `_generate_stream_content` drops the logprobs of a step whose text delta is empty (an
    incomplete UTF-8 sequence), so such entries of the reference may be missing. Every other
    entry (token, bytes, logprob bitwise) must be there, in order; `full`: up to the end."""
    j = 0
    for i, entry in enumerate(got_lps):
        want = bits(_without_top(entry))
        while j < len(ref_lps) and bits(_without_top(ref_lps[j])) != want:
            if not _droppable(ref_lps[j]):
                return (f"streamed chat logprob entry {i} {_show(_without_top(entry))} != "
                        f"reference entry {j} {_show(_without_top(ref_lps[j]))}")
            j += 1
        if j == len(ref_lps):
            return f"streamed chat logprob entry {i} is beyond the reference's {len(ref_lps)}"
        j += 1
    missing = [e for e in ref_lps[j:] if not _droppable(e)] if full else []
    if missing:
        return (f"streamed chat logprobs end after {len(got_lps)} entries; the reference has "
                f"{len(ref_lps)}")
    return None


def chat_stream_upstream_diffs(ref_lps: list, got_lps: list) -> tuple[int, int]:
    """(reference entries missing from the stream, streamed entries whose top_logprobs differ)
    for a stream that passed `chat_stream_logprobs_problem`: the two SGLang bugs, counted."""
    j, wrong_top = 0, 0
    for entry in got_lps:
        want = bits(_without_top(entry))
        while j < len(ref_lps) and bits(_without_top(ref_lps[j])) != want:
            j += 1
        if j < len(ref_lps):
            wrong_top += bits(entry) != bits(ref_lps[j])
        j += 1
    return max(0, len(ref_lps) - len(got_lps)), wrong_top


def _show(value, limit: int = 160) -> str:
    text = json.dumps(value)
    return text if len(text) <= limit else text[:limit] + "..."


# -- sending -----------------------------------------------------------------------------------
@dataclass
class Outcome:
    index: int
    rid: str
    endpoint: str
    stream: bool
    spec_id: int | None
    abort: str | None
    max_new_tokens: int
    status: int | None = None  # HTTP status
    error_code: int | None = None  # code of an SSE error event
    error: str = ""  # transport error or error message
    abort_sent: bool = False
    abort_status: int | None = None  # of POST /abort_request
    disconnected: bool = False  # we closed the stream
    stream_done: bool = False  # [DONE] seen
    chunks: int = 0
    latency_s: float = 0.0
    output: dict | None = None
    rollbacks: int | None = None
    retractions: int | None = None
    verdict: str = ""  # filled by evaluate(): identical / mismatch / prefix-ok / ...

    @property
    def aborted(self) -> bool:
        return self.disconnected or (self.output or {}).get("finish") == "abort"

    @property
    def completed(self) -> bool:
        return (self.status == 200 and not self.error and self.error_code is None
                and not self.aborted and (self.output or {}).get("finish") is not None)

    def num_tokens(self) -> int:
        """Output ids (native), else completion_tokens (else logprob entries)."""
        o = self.output or {}
        if self.endpoint == "generate":
            return len(o.get("ids") or [])
        if o.get("completion_tokens") is not None:
            return int(o["completion_tokens"])
        return len(o.get("logprobs") or [])

    def row(self) -> dict:
        row = dataclasses.asdict(self)
        out = row.pop("output") or {}
        row.update(num_tokens=self.num_tokens(),
                   finish=out.get("finish"), completion_tokens=out.get("completion_tokens"))
        return row


def make_session(timeout_s: float) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                 timeout=aiohttp.ClientTimeout(total=timeout_s),
                                 read_bufsize=10 * 1024**2)


async def _abort(session: aiohttp.ClientSession, url: str, out: Outcome) -> None:
    out.abort_sent = True
    try:
        async with session.post(url + "/abort_request", json={"rid": out.rid}) as r:
            out.abort_status = r.status
            await r.read()
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        out.error = out.error or f"/abort_request: {type(e).__name__}: {e}"


async def execute(session: aiohttp.ClientSession, url: str, req: PlannedRequest) -> Outcome:
    """Send one planned request (with its abort, if any); never raises."""
    out = Outcome(req.index, req.rid, req.endpoint, req.stream, req.spec_id, req.abort,
                  req.max_new_tokens)
    asm = Assembler(req.endpoint)
    t0 = time.perf_counter()
    abort_task = None
    if req.abort == "rid" and not req.stream:  # the answer comes in one piece: abort meanwhile
        abort_task = asyncio.create_task(_delayed_abort(session, url, out, req.abort_delay_s))
    try:
        async with session.post(url + PATHS[req.endpoint], json=req.body) as resp:
            out.status = resp.status
            if resp.status != 200:
                out.error = (await resp.text())[:500]
            elif not req.stream:
                asm.add_body(json.loads(await resp.read()))
            else:
                async for raw in resp.content:
                    line = raw.strip()
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        out.stream_done = True
                        continue
                    chunk = json.loads(data)
                    if "error" in chunk:
                        err = chunk["error"] if isinstance(chunk["error"], dict) else {}
                        out.error_code = int(err.get("code") or 500)
                        out.error = str(err.get("message") or chunk["error"])[:500]
                        continue
                    asm.add_chunk(chunk)
                    out.chunks += 1
                    if req.abort and out.chunks == req.abort_after_chunks and not out.abort_sent:
                        if req.abort == "disconnect":
                            out.disconnected = True
                            resp.close()  # the connection, mid-stream
                            break
                        await _abort(session, url, out)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
        out.error = f"{type(e).__name__}: {e}"[:500]
    if abort_task is not None and not out.abort_sent:  # answered before the abort was due
        abort_task.cancel()
    if abort_task is not None:
        with contextlib.suppress(asyncio.CancelledError):
            await abort_task
    out.latency_s = round(time.perf_counter() - t0, 4)
    out.output = asm.output()
    out.rollbacks, out.retractions = asm.rollbacks, asm.retractions
    return out


async def _delayed_abort(session, url, out: Outcome, delay: float) -> None:
    await asyncio.sleep(delay)
    await _abort(session, url, out)


async def run_requests(url: str, requests_: list[PlannedRequest], concurrency: int,
                       timeout_s: float, progress: bool = False,
                       desc: str = "soak") -> list[Outcome]:
    """All requests, `concurrency` at a time, in plan order; outcomes in plan order."""
    from tqdm import tqdm

    results: list[Outcome | None] = [None] * len(requests_)
    it = iter(enumerate(requests_))
    counts = {"5xx": 0, "4xx": 0, "err": 0, "abort": 0}
    bar = tqdm(total=len(requests_), desc=desc, disable=not progress, smoothing=0.05)

    async def worker(session):
        for k, req in it:
            out = await execute(session, url, req)
            results[k] = out
            code = out.error_code or out.status or 0
            counts["5xx"] += code >= 500 or (out.abort_status or 0) >= 500
            counts["4xx"] += 400 <= code < 500
            counts["err"] += bool(out.error) and code < 400
            counts["abort"] += out.aborted
            bar.update(1)
            bar.set_postfix(counts, refresh=False)

    async with make_session(timeout_s) as session:
        await asyncio.gather(*(worker(session) for _ in range(max(1, concurrency))))
    bar.close()
    return results  # type: ignore[return-value]


async def take_references(url: str, specs: list[DetSpec], timeout_s: float,
                          tag: str) -> list[Outcome]:
    """Each spec alone on the server, one after the other, not streamed."""
    reqs = [PlannedRequest(-1 - s.spec_id, f"{tag}-{s.spec_id:04d}", s.endpoint, False,
                           s.spec_id, None, 0, 0.0,
                           det_body(s, stream=False, rid=f"{tag}-{s.spec_id:04d}"),
                           s.max_new_tokens) for s in specs]
    return await run_requests(url, reqs, 1, timeout_s)


# -- server state ------------------------------------------------------------------------------
def _get_json(url: str, path: str, timeout: float = 30.0):
    import requests

    try:
        r = requests.get(url + path, timeout=timeout)
        return r.status_code, (r.json() if r.headers.get("content-type", "").startswith(
            "application/json") else None)
    except (requests.RequestException, ValueError):
        return None, None


def server_load(url: str) -> dict | None:
    """{running, waiting, used_tokens} summed over DP ranks (`/v1/loads`, else `/get_load`)."""
    code, data = _get_json(url, "/v1/loads")
    if code == 200 and isinstance(data, dict) and "loads" in data:
        loads = data["loads"]
        return {"running": sum(int(x.get("num_running_reqs", 0)) for x in loads),
                "waiting": sum(int(x.get("num_waiting_reqs", 0)) for x in loads),
                "used_tokens": sum(int(x.get("num_used_tokens", 0)) for x in loads)}
    code, data = _get_json(url, "/get_load")
    if code == 200 and data is not None:
        loads = data if isinstance(data, list) else [data]
        return {"running": sum(int(x.get("num_reqs", 0)) for x in loads), "waiting": 0,
                "used_tokens": None}
    return None


def llm42_stats(url: str) -> dict | None:
    code, data = _get_json(url, "/llm42_stats")
    return data if code == 200 else None


def wait_idle(url: str, timeout_s: float, unreachable_s: float = 30.0) -> dict | None:
    """The first load with nothing running or waiting, or the last one seen at the deadline;
    None once the server has not answered for `unreachable_s`."""
    deadline = time.monotonic() + timeout_s
    last_answer = time.monotonic()
    while True:
        load = server_load(url)
        now = time.monotonic()
        if load is None:
            if now - last_answer > unreachable_s:
                return None
        else:
            last_answer = now
            if load["running"] == 0 and load["waiting"] == 0:
                return load
        if now > deadline:
            return load
        time.sleep(0.25)


class LoadPoller:
    """Peak running/waiting requests and KV tokens in use while the soak runs (every 2 s)."""

    def __init__(self, url: str):
        self.url, self.peak = url, {"running": 0, "waiting": 0, "used_tokens": 0}
        self._stop = asyncio.Event()

    async def run(self) -> None:
        while not self._stop.is_set():
            load = await asyncio.to_thread(server_load, self.url)
            for k, v in (load or {}).items():
                if v is not None:
                    self.peak[k] = max(self.peak[k], v)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), 2.0)

    def stop(self) -> None:
        self._stop.set()


# -- the soak ----------------------------------------------------------------------------------
STAT_KEYS = ("verify_passes", "verified_tokens", "rollbacks", "tokens_rolled_back",
             "injected_mismatches", "inconsistent_tokens", "det_requests_finished",
             "retraction_restarts")


@dataclass
class SoakResult:
    figures: dict
    failures: list[str]
    outcomes: list[Outcome]
    references: dict[int, dict]
    checks: dict = field(default_factory=dict)
    specs: list[DetSpec] = field(default_factory=list)
    stats_before: dict | None = None
    stats_after: dict | None = None

    @property
    def passed(self) -> bool:
        return not self.failures


def run_soak(url: str, cfg: SoakConfig, server=None, log=print) -> SoakResult:
    """The whole soak against a running server (`server`: its SGLangServer, whose process must
    still be alive at the end and whose log must not show leaks or tracebacks written during the
    soak). Raises RuntimeError only when the soak cannot start (server down, llm42 off, not
    idle); every failed check is in `.failures`."""
    url = url.rstrip("/")
    failures: list[str] = []
    t_start = time.perf_counter()
    load_avg_start = _load_avg()
    code, _ = _get_json(url, "/health", timeout=60)
    if code != 200:
        raise RuntimeError(f"{url}/health answered {code}; is the server up?")
    stats_before = llm42_stats(url)
    if not (stats_before or {}).get("enabled"):
        raise RuntimeError(f"{url}/llm42_stats says {stats_before}: start the server with "
                           "--enable-llm42")
    load = wait_idle(url, cfg.drain_timeout)
    if not load or load["running"] or load["waiting"]:
        raise RuntimeError(f"server not idle before the soak ({load}): references would not "
                           "be taken alone")
    plan = build_plan(cfg)
    log_start = len(server.log_text()) if server is not None else 0

    t0 = time.perf_counter()
    refs_out = asyncio.run(take_references(url, plan.specs, cfg.request_timeout,
                                           f"{cfg.run_tag}-ref"))
    t_ref = time.perf_counter() - t0
    references: dict[int, dict] = {}
    for spec, ref in zip(plan.specs, refs_out):
        if ref.completed and ref.num_tokens() > 0:
            references[spec.spec_id] = ref.output
        else:
            finish = (ref.output or {}).get("finish")
            failures.append(f"reference {spec.label}: status {ref.status} error "
                            f"{ref.error_code} {ref.error!r} finish {finish}")
    log(f"[soak] {len(plan.specs)} references taken alone in {t_ref:.1f} s; "
        f"{len(plan.requests)} requests at concurrency {cfg.concurrency}")

    t0 = time.perf_counter()
    poller = LoadPoller(url)

    async def load_phase():
        poll = asyncio.create_task(poller.run())
        try:
            return await run_requests(url, plan.requests, cfg.concurrency, cfg.request_timeout,
                                      progress=cfg.progress)
        finally:
            poller.stop()
            await poll

    outcomes = asyncio.run(load_phase())
    t_load = time.perf_counter() - t0

    # drain, then the leak checks
    t0 = time.perf_counter()
    idle = wait_idle(url, cfg.drain_timeout)
    t_drain = time.perf_counter() - t0
    time.sleep(cfg.idle_settle_s)
    health, _ = _get_json(url, "/health", timeout=60)
    load_idle = server_load(url)
    stats_after = llm42_stats(url)
    alive = server.is_running() if server is not None else None
    checks = {"idle_after_drain": bool(idle and not idle["running"] and not idle["waiting"]),
              "load_at_idle": load_idle, "health_after_drain": health,
              "server_process_alive": alive,
              "kv_used_tokens_at_idle": (load_idle or {}).get("used_tokens"),
              "reserved_kv_tokens_at_idle": (stats_after or {}).get("reserved_kv_tokens"),
              "drain_s": round(t_drain, 2)}
    # the host's 1-minute load average at start and end: other processes slow a soak down
    checks["host_load_avg_1m"] = [load_avg_start, _load_avg()]
    leaks = []
    if not checks["idle_after_drain"]:
        leaks.append(f"server not idle {cfg.drain_timeout:.0f} s after the load: {idle}")
    if health != 200:
        leaks.append(f"/health answered {health} after the drain (leak check crashed the "
                     "scheduler?)")
    if alive is False:
        leaks.append("the server process died")
    if checks["kv_used_tokens_at_idle"] not in (0, None):
        leaks.append(f"{checks['kv_used_tokens_at_idle']} KV tokens in use at idle")
    if checks["reserved_kv_tokens_at_idle"] not in (0, None):
        leaks.append(f"llm42 reserved_kv_tokens {checks['reserved_kv_tokens_at_idle']} at idle")
    if server is not None:  # what SGLang logged meanwhile: leak warnings, tracebacks
        new_log = server.log_text()[log_start:]
        for marker in LOG_MARKERS:
            if marker in new_log:
                leaks.append(f"the server log says {marker!r} ({new_log.count(marker)} times)")
    checks["leaks"] = leaks
    failures += [f"leak: {x}" for x in leaks]

    # the same specs alone again: the server is still deterministic after the soak
    recheck_specs = [s for s in plan.specs if s.spec_id in references][: cfg.recheck]
    t0 = time.perf_counter()
    rechecked = asyncio.run(take_references(url, recheck_specs, cfg.request_timeout,
                                            f"{cfg.run_tag}-recheck")) if (
        recheck_specs and health == 200) else []
    t_recheck = time.perf_counter() - t0
    recheck_identical = 0
    for spec, out in zip(recheck_specs, rechecked):
        diff = (compare_full(references[spec.spec_id], out.output) if out.completed
                else f"status {out.status} error {out.error!r}")
        if diff:
            failures.append(f"recheck {spec.label} after the soak: {diff}")
        else:
            recheck_identical += 1
    final_health, _ = _get_json(url, "/health", timeout=60)
    if final_health != 200:
        failures.append(f"/health answered {final_health} after the recheck")

    figures, request_failures = evaluate(plan, outcomes, references)
    failures = request_failures + failures
    delta = {k: (stats_after or {}).get(k, 0) - (stats_before or {}).get(k, 0)
             for k in STAT_KEYS if k in (stats_after or {})}
    if delta.get("inconsistent_tokens", 0):
        failures.append(f"llm42 counted {delta['inconsistent_tokens']} inconsistent tokens "
                        "(re-verified entries that disagree with committed ones)")
    figures.update(
        rollbacks=delta.get("rollbacks"), tokens_rolled_back=delta.get("tokens_rolled_back"),
        injected_mismatches=delta.get("injected_mismatches"),
        verify_passes=delta.get("verify_passes"),
        inconsistent_tokens=delta.get("inconsistent_tokens"),
        leaks=len(leaks), kv_used_tokens_at_idle=checks["kv_used_tokens_at_idle"],
        recheck=len(recheck_specs), recheck_identical=recheck_identical,
        peak_running_reqs=poller.peak["running"], peak_waiting_reqs=poller.peak["waiting"],
        peak_kv_used_tokens=poller.peak["used_tokens"],
        reference_s=round(t_ref, 2), load_s=round(t_load, 2), recheck_s=round(t_recheck, 2),
        duration_s=round(time.perf_counter() - t_start, 2),
        failures=len(failures))
    figures["requests_per_s"] = round(len(outcomes) / max(t_load, 1e-9), 2)
    return SoakResult(figures, failures, outcomes, references, checks, plan.specs, stats_before,
                      stats_after)


def _load_avg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def evaluate(plan: Plan, outcomes: list[Outcome],
             references: dict[int, dict]) -> tuple[dict, list[str]]:
    """Figures and failures of the load phase (sets each outcome's `verdict`)."""
    failures: list[str] = []
    f = dict(requests=len(outcomes), completed=0, aborted=0, abort_attempts=0,
             aborts_by_rid=0, aborts_by_disconnect=0, streamed=0,
             by_endpoint={e: 0 for e in ENDPOINTS}, det=0, det_completed=0, det_identical=0,
             det_mismatched=0, det_aborted=0, det_aborted_partial=0, det_prefix_ok=0,
             status_5xx=0, status_4xx=0, transport_errors=0, output_tokens=0,
             native_det_rollbacks=0, retractions=0, chat_stream_logprobs_dropped=0,
             chat_stream_top_logprobs_wrong=0)
    for req, out in zip(plan.requests, outcomes):
        f["by_endpoint"][out.endpoint] += 1
        f["streamed"] += out.stream
        f["det"] += req.det
        f["abort_attempts"] += bool(req.abort) and (out.abort_sent or out.disconnected)
        code = out.error_code or out.status or 0
        problem = None
        if code >= 500 or (out.abort_status or 0) >= 500:
            f["status_5xx"] += 1
            problem = f"HTTP {code} (abort {out.abort_status}): {out.error[:200]}"
        elif 400 <= code < 500 or (out.abort_status or 200) != 200:
            f["status_4xx"] += 1
            problem = f"HTTP {code} (abort {out.abort_status}): {out.error[:200]}"
        elif out.error:
            f["transport_errors"] += 1
            problem = f"error: {out.error[:200]}"
        elif out.stream and not out.disconnected and not out.stream_done:
            f["transport_errors"] += 1
            problem = "stream ended without [DONE]"
        if problem:
            out.verdict = "error"
            failures.append(f"request {out.rid} ({_desc(out)}): {problem}")
            continue
        f["output_tokens"] += out.num_tokens()
        f["retractions"] += out.retractions or 0
        if out.aborted:
            f["aborted"] += 1
            f["aborts_by_disconnect"] += out.disconnected
            f["aborts_by_rid"] += not out.disconnected
        elif out.completed:
            f["completed"] += 1
        else:
            out.verdict = "error"
            failures.append(f"request {out.rid} ({_desc(out)}): no finish reason")
            continue
        problem = _sanity(req, out)
        if problem:
            out.verdict = "malformed"
            failures.append(f"request {out.rid} ({_desc(out)}): {problem}")
            continue
        if not req.det:
            out.verdict = "aborted" if out.aborted else "ok"
            continue
        ref = references.get(req.spec_id)
        if out.aborted:
            f["det_aborted"] += 1
            partial = bool((out.output or {}).get("ids") or (out.output or {}).get("text")
                           or (out.output or {}).get("logprobs"))
            f["det_aborted_partial"] += partial
            if ref is None:
                out.verdict = "no-reference"
                continue
            diff = compare_prefix(ref, out.output)
            if diff:
                out.verdict = "prefix-mismatch"
                failures.append(f"aborted deterministic {out.rid} ({_desc(out)}): {diff}")
            else:
                out.verdict = "prefix-ok"
                f["det_prefix_ok"] += 1
            continue
        f["det_completed"] += 1
        f["native_det_rollbacks"] += out.rollbacks or 0
        if ref is None:
            out.verdict = "no-reference"
            continue
        diff = compare_full(ref, out.output)
        if diff:
            out.verdict = "mismatch"
            f["det_mismatched"] += 1
            failures.append(f"deterministic {out.rid} ({_desc(out)}) differs from its solo "
                            f"reference: {diff}")
        else:
            out.verdict = "identical"
            f["det_identical"] += 1
            if out.output.get("chat_stream"):
                dropped, wrong_top = chat_stream_upstream_diffs(ref["logprobs"],
                                                                out.output["logprobs"])
                f["chat_stream_logprobs_dropped"] += dropped
                f["chat_stream_top_logprobs_wrong"] += wrong_top
    return f, failures


def _sanity(req: PlannedRequest, out: Outcome) -> str | None:
    """Shape checks every (completed or aborted) response passes, deterministic or not."""
    o = out.output or {}
    n = out.num_tokens()
    if n > req.max_new_tokens:
        return f"{n} tokens for max {req.max_new_tokens}"
    if out.endpoint == "generate" and o.get("completion_tokens") not in (None, n):
        return f"completion_tokens {o.get('completion_tokens')} but {n} output ids"
    if out.completed and o.get("finish") not in ("length", "stop"):
        return f"finish reason {o.get('finish')!r}"
    if out.completed and o.get("completion_tokens") is None:
        return "no completion_tokens"
    if out.completed and o.get("finish") == "length" and n != req.max_new_tokens:
        return f"finish 'length' after {n} of {req.max_new_tokens} tokens"
    return None


def _desc(out: Outcome) -> str:
    kind = f"det spec {out.spec_id}" if out.spec_id is not None else "normal"
    return (f"{out.endpoint} {'stream' if out.stream else 'non-stream'} {kind}"
            f"{' abort ' + out.abort if out.abort else ''}")


# -- report ------------------------------------------------------------------------------------
FIGURE_ROWS = [
    ("requests", "requests"), ("completed", "completed"), ("aborted", "aborted"),
    ("  by /abort_request", "aborts_by_rid"), ("  by closing the stream", "aborts_by_disconnect"),
    ("abort attempts", "abort_attempts"), ("streamed", "streamed"),
    ("deterministic", "det"), ("det completed", "det_completed"),
    ("det identical to solo reference", "det_identical"), ("det mismatched", "det_mismatched"),
    ("det aborted", "det_aborted"), ("det aborted with partial output", "det_aborted_partial"),
    ("det aborted, prefix of reference", "det_prefix_ok"),
    ("5xx", "status_5xx"), ("4xx", "status_4xx"), ("transport errors", "transport_errors"),
    ("rollbacks (server)", "rollbacks"), ("tokens rolled back", "tokens_rolled_back"),
    ("injected mismatches", "injected_mismatches"), ("verify passes", "verify_passes"),
    ("inconsistent tokens", "inconsistent_tokens"),
    ("rollbacks (native det meta_info)", "native_det_rollbacks"),
    ("det chat streams: logprob entries SGLang dropped", "chat_stream_logprobs_dropped"),
    ("det chat streams: wrong top_logprobs from SGLang", "chat_stream_top_logprobs_wrong"),
    ("retractions (native meta_info)", "retractions"),
    ("leaks", "leaks"), ("KV tokens in use at idle", "kv_used_tokens_at_idle"),
    ("recheck identical after soak", "recheck_identical"),
    ("peak running requests", "peak_running_reqs"),
    ("peak KV tokens in use", "peak_kv_used_tokens"),
    ("output tokens", "output_tokens"), ("references (s)", "reference_s"),
    ("load (s)", "load_s"), ("requests/s", "requests_per_s"), ("duration (s)", "duration_s"),
    ("failures", "failures"),
]


def figures_table(figures: dict) -> str:
    lines = ["| figure | value |", "|---|---|"]
    for label, key in FIGURE_ROWS:
        value = figures.get(key)
        if key == "recheck_identical":
            value = f"{value}/{figures.get('recheck')}"
        lines.append(f"| {label} | {'-' if value is None else value} |")
    ends = ", ".join(f"{k} {v}" for k, v in figures.get("by_endpoint", {}).items())
    lines.append(f"| by endpoint | {ends} |")
    return "\n".join(lines)


def markdown(row: dict) -> str:
    verdict = "PASSED" if row["passed"] else f"FAILED ({len(row['failures'])} failures)"
    cfg = row["config"]
    lines = [f"# Soak {verdict} ({row['timestamp']})", "",
             f"- server: `{row['url']}`, model {row['model']}", f"- server args: "
             f"`{row['server_args']}`" if row.get("server_args") else "- server args: (not "
             "launched here)",
             f"- plan: {cfg['num_requests']} requests, {cfg['det_fraction']:g} deterministic "
             f"({cfg['pool_size']} specs, each with a solo reference), {cfg['abort_fraction']:g} "
             f"aborted, concurrency {cfg['concurrency']}, {cfg['min_new_tokens']}-"
             f"{cfg['max_new_tokens']} new tokens, seed {cfg['seed']}",
             f"- commit {row['git_commit']}; CPU {row['cpu']}; host load average (1 min) at "
             f"start / end {row['checks'].get('host_load_avg_1m')}",
             f"- command `{row['command']}`", "",
             figures_table(row["figures"]), ""]
    if row["failures"]:
        lines += ["## Failures", ""] + [f"- {x}" for x in row["failures"]] + [""]
    return "\n".join(lines)


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=20, check=False)
        for line in out.stdout.splitlines():
            if line.startswith("Model name:"):
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} CPUs)"
    except (OSError, subprocess.SubprocessError):
        pass
    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} CPUs)"


def result_row(result: SoakResult, cfg: SoakConfig, url: str, model: str | None,
               server_args: str | None, command: str) -> dict:
    return {"timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "passed": result.passed, "url": url, "model": model, "server_args": server_args,
            "command": command, "git_commit": env_info.git_commit(), "cpu": cpu_model(),
            "gpu": env_info.gpu_name(), "config": dataclasses.asdict(cfg),
            "figures": result.figures, "checks": result.checks,
            "llm42_stats_before": result.stats_before, "llm42_stats_after": result.stats_after,
            "specs": [dataclasses.asdict(s) for s in result.specs],
            "failures": result.failures[:MAX_FAILURES_KEPT],
            "num_failures": len(result.failures)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
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
                       else model or (_get_json(url, "/get_model_info")[1] or {}).get(
                           "model_path"))
        lines = [f"# {datetime.datetime.now(datetime.timezone.utc).isoformat()}",
                 f"soak: {command}"]
        if server is not None:
            lines.append(f"server: {shlex.join(server.args)}")
        lines += [f"git commit: {env_info.git_commit()}", f"cpu: {cpu_model()}",
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


if __name__ == "__main__":
    sys.exit(main())
