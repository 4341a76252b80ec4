"""One response, whatever its endpoint and streaming: assembled into one output dict, and the
request's outcome (status, aborts, errors, the output).

    asm = Assembler("chat"); asm.add_chunk(chunk) ...; output = asm.output()
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


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

    def add_body(self, out: dict, stream: bool = False) -> None:
        if self.endpoint == "generate":
            self._native(out)
            return
        for choice in out.get("choices") or []:
            self._choice(choice, stream=stream)
        usage = out.get("usage") or {}
        if usage.get("completion_tokens") is not None:
            self.completion_tokens = usage["completion_tokens"]

    def add_chunk(self, out: dict) -> None:
        self.streamed = True
        self.add_body(out, stream=True)

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
