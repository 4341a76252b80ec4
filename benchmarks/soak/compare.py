"""Is a deterministic output bitwise its solo reference (or, aborted, a prefix of it)?

    diff = compare_full(reference, output)    # None when identical, else what differs first
    diff = compare_prefix(reference, partial)

Outputs are `responses.Assembler.output()` dicts; floats are compared by their bits
(`proof_compare.bits`). Streamed chat logprobs allow for two SGLang 0.5.17 bugs, counted apart.
"""

from __future__ import annotations

import json

from benchmarks.proof_compare import bits


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
