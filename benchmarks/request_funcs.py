"""Streaming HTTP requests to SGLang (native `/generate`, OpenAI completions and chat) via aiohttp.

    async with make_session() as session:
        out = await send_request(session, "sglang", base_url, RequestInput(...))

Timing follows `sglang.bench_serving`: TTFT is the first chunk that carries a token; when one chunk
carries several tokens (llm42 publishes a deterministic request's tokens only once they are
verified, so they arrive a window at a time) its gap is spread evenly over those tokens.
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp

try:  # native chunks are cumulative: parsing them is the client's hot loop, orjson is ~2x faster
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - orjson ships with sglang
    _loads = json.loads

BACKENDS = ("sglang", "sglang-oai", "sglang-oai-chat")
ENDPOINTS = {"sglang": "/generate", "sglang-oai": "/v1/completions",
             "sglang-oai-chat": "/v1/chat/completions"}
LLM42_META_KEYS = ("llm42_verify_passes", "llm42_rollbacks", "llm42_tokens_rolled_back")
# SGLang's speculative steps of the request, in its last chunk's meta_info (speculative servers)
META_KEYS = (*LLM42_META_KEYS, "spec_verify_ct")


@dataclass(frozen=True)
class RequestInput:
    prompt: str | list[int]  # token ids only for the native and completions backends
    prompt_len: int
    output_len: int
    model: str
    temperature: float
    is_deterministic: bool  # the benchmark's label of this request
    send_flag: bool  # send `is_deterministic` (only an --enable-llm42 server accepts true)
    sampling_seed: int | None = None
    ignore_eos: bool = True
    truncation: tuple[tuple[str, float], ...] = ()  # (("top_p", 0.9), ...), sent as given


@dataclass
class RequestOutput:
    success: bool = False
    error: str = ""
    start_time: float = 0.0  # perf_counter at send
    latency: float = 0.0  # seconds until the last chunk
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    output_len: int = 0
    generated_text: str = ""
    meta: dict = field(default_factory=dict)  # llm42 / speculative counters when present


def make_session(timeout_s: float = 6 * 3600) -> aiohttp.ClientSession:
    """One session for the whole run. limit=0: aiohttp's default pool of 100 connections would
    silently cap the concurrency; long runs and large cumulative chunks need a generous timeout
    (`timeout_s` per request) and read buffer (as sglang's client)."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                 timeout=aiohttp.ClientTimeout(total=timeout_s),
                                 read_bufsize=10 * 1024**2)


def build_payload(backend: str, req: RequestInput) -> dict:
    if backend == "sglang":
        sampling = {"temperature": req.temperature, "max_new_tokens": req.output_len,
                    "ignore_eos": req.ignore_eos}
        sampling.update(req.truncation)
        if req.sampling_seed is not None:
            sampling["sampling_seed"] = req.sampling_seed
        if req.send_flag:
            sampling["is_deterministic"] = req.is_deterministic
        key = "text" if isinstance(req.prompt, str) else "input_ids"
        return {key: req.prompt, "sampling_params": sampling, "stream": True}
    payload = {"model": req.model, "temperature": req.temperature, "stream": True,
               "ignore_eos": req.ignore_eos,
               "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    if backend == "sglang-oai":
        payload.update(prompt=req.prompt, max_tokens=req.output_len)
    elif backend == "sglang-oai-chat":
        if not isinstance(req.prompt, str):
            raise ValueError("sglang-oai-chat needs text prompts (decode token ids first).")
        payload.update(messages=[{"role": "user", "content": req.prompt}],
                       max_completion_tokens=req.output_len)
    else:
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}.")
    payload.update(req.truncation)
    if req.sampling_seed is not None:
        payload["seed"] = req.sampling_seed
    if req.send_flag:
        payload["is_deterministic"] = req.is_deterministic
    return payload


def parse_chunk(backend: str, data: dict) -> tuple[str, int | None, dict]:
    """(new or cumulative text, completion tokens so far if known, meta) of one SSE chunk."""
    if backend == "sglang":
        meta = data.get("meta_info") or {}
        return data.get("text") or "", meta.get("completion_tokens"), meta
    usage = data.get("usage") or {}
    choices = data.get("choices") or []
    if not choices:
        return "", usage.get("completion_tokens"), {}
    choice = choices[0]
    if backend == "sglang-oai":
        text = choice.get("text")
    else:
        text = (choice.get("delta") or {}).get("content")
    return text or "", usage.get("completion_tokens"), choice.get("meta_info") or {}


class _Timer:
    """Turns chunk arrival times and token counts into TTFT and per-token ITL.

    As `sglang.bench_serving`: the first chunk gives TTFT and no ITL entry, even when it carries
    several tokens; a later chunk of n new tokens adds n entries of (its gap / n).
    """

    def __init__(self, out: RequestOutput):
        self.out, self.last_time, self.last_tokens = out, out.start_time, 0

    def observe(self, now: float, num_tokens: int) -> None:
        new = num_tokens - self.last_tokens
        if new <= 0:
            return
        if self.last_tokens == 0:
            self.out.ttft = now - self.out.start_time
        else:
            self.out.itl.extend([(now - self.last_time) / new] * new)
        self.last_time, self.last_tokens = now, num_tokens


DONE = b"[DONE]"  # the payload that ends an OpenAI-style stream


async def sse_payloads(content: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """The payloads of a server-sent event stream's `data:` lines, `DONE` included."""
    async for raw in content:
        line = raw.strip()
        if line.startswith(b"data:"):
            yield line[5:].strip()


async def send_request(session: aiohttp.ClientSession, backend: str, base_url: str,
                       req: RequestInput) -> RequestOutput:
    out = RequestOutput(output_len=0)
    timer = _Timer(out)
    out.start_time = timer.last_time = time.perf_counter()
    texts: list[str] = []
    try:
        async with session.post(base_url + ENDPOINTS[backend],
                                json=build_payload(backend, req)) as response:
            if response.status != 200:
                out.error = f"HTTP {response.status}: {(await response.text())[:2000]}"
                return out
            async for body in sse_payloads(response.content):
                if body == DONE:
                    continue
                data = _loads(body)
                if "error" in data:
                    out.error = json.dumps(data["error"])[:2000]
                    return out
                text, num_tokens, meta = parse_chunk(backend, data)
                now = time.perf_counter()
                if backend == "sglang":
                    texts = [text] if text else texts  # native chunks are cumulative
                elif text:
                    texts.append(text)
                if num_tokens is None:  # no usage in the chunk: one token per text chunk
                    num_tokens = timer.last_tokens + (1 if text else 0)
                timer.observe(now, num_tokens)
                out.meta.update({k: meta[k] for k in META_KEYS if k in meta})
                out.latency = now - out.start_time
            out.output_len = timer.last_tokens
            out.generated_text = "".join(texts)
            out.success = out.output_len > 0
            if not out.success:
                out.error = "stream ended without any generated token"
    except Exception:  # noqa: BLE001 - any failure is one failed request, reported in the row
        out.error = traceback.format_exc()[-2000:]
    return out
