"""Prompt rows as extend sequences (`LLM42_PROMPT_ROWS=extend`; an experiment until a GPU run
decides the default, see docs/tuning.md).

The row-invariant verifier computes every entry as a decode row (`row_pass`): its own query
against its request's KV before it. For a generated token that is what an inline decode step
computes, so the two must stay alike. A prompt token is never decoded, and as a decode row a
prompt of L tokens reads its KV about L^2 / 2 times: on the 8B shape (128 KB of KV per token) a
1,515-token deterministic prompt held the GPU ~83 ms where plain SGLang prefills it in ~35
(`benchmarks/results/h100-2026-12-07-diagnostics`, the online timeline: 3 of the run's 28
slowest gaps waited on such a prompt), and over ShareGPT's prompts the KV reads are more than
half of a deterministic prompt's GPU time (docs/tuning.md).

Here a pass's (or an inline prefill's) prompt entries run as extend sequences instead: each run
of consecutive positions of one request is a sequence whose prefix is its request's KV before
it, packed R tokens a forward (the GEMMs see the rows a decode-row forward gives them), padded
with a dummy sequence on SGLang's padding slot. The attention reads the prefix once per block of
queries. A row's bits must not depend on where its chunk starts or on the forward's other
sequences. `EXTEND_BACKENDS` are those where it holds: Triton, whose unified 1-stage kernel
`pass_attention.triton_extend_hook` selects inside these forwards (8 of 8 cases in
`benchmarks/results/h100-2026-12-06-row-invariance`), and torch_native on CPU, whose rows
`pass_attention.torch_native_extend_rows_hook` computes one by one there (SGLang's own padded
SDPA did not keep them). Elsewhere prompt entries stay decode rows.

Whether a position is a prompt row depends on the request alone (`is_prompt`), so every path
computes it the same way: prompt passes, inline prompt rows, a verified prefix-cache match. The
mode changes outputs (another attention kernel for prompt positions), like the forward size.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from llm42.core.decision import PAD_TOKEN_ID
from llm42.sglang import verifier

ENV = "LLM42_PROMPT_ROWS"
DECODE, EXTEND = "decode", "extend"
EXTEND_BACKENDS = frozenset({"triton", "torch_native"})
# True only while a prompt-row extend forward runs (read by the attention and graph hooks).
ACTIVE = False


def requested() -> str:
    mode = os.environ.get(ENV, "") or DECODE
    if mode not in (DECODE, EXTEND):
        raise ValueError(f"llm42: {ENV} must be {DECODE!r} or {EXTEND!r}, got {mode!r}")
    return mode


def extend_applies(prefill_backend: str | None) -> bool:
    """Whether prompt entries run as extend sequences on a server whose prefill attention
    backend is `prefill_backend` (read once, when the runtime is installed)."""
    return requested() == EXTEND and prefill_backend in EXTEND_BACKENDS


def is_prompt(req, position: int) -> bool:
    return position < len(req.origin_input_ids)


def prompt_entries(entries: list) -> list[int]:
    """Indices of the (request, position, token) entries that are prompt rows."""
    return [i for i, (req, pos, _) in enumerate(entries) if is_prompt(req, pos)]


@dataclass(frozen=True)
class Segment:
    """Consecutive positions of one request: `entries[first : first + len(tokens)]`."""

    req: object
    start: int  # position of its first token: the sequence's prefix length
    tokens: tuple[int, ...]
    first: int


def segments(entries: list) -> list[Segment]:
    """`entries` (request, position, token), cut wherever the request changes or a position
    does not follow the one before."""
    out: list[Segment] = []
    tokens: list[int] = []
    first = 0
    for i, (req, pos, token) in enumerate(entries):
        if tokens and not (req is entries[i - 1][0] and pos == entries[i - 1][1] + 1):
            out.append(Segment(entries[first][0], entries[first][1], tuple(tokens), first))
            tokens, first = [], i
        tokens.append(token)
    if tokens:
        out.append(Segment(entries[first][0], entries[first][1], tuple(tokens), first))
    return out


def forward(scheduler, template, entries: list, rows: int, device) -> torch.Tensor:
    """One extend forward of `rows` tokens: `entries` (at most `rows`, each request's in
    position order) as sequences, then a dummy sequence of the tokens left on request row 0,
    slot 0 (as the fixed-shape pass pads). Returns the [rows, vocab] fp32 logits, entry i's in
    row i."""
    global ACTIVE
    assert 0 < len(entries) <= rows, (len(entries), rows)
    req_to_token = scheduler.req_to_token_pool.req_to_token
    reqs, pool_idx, prefix_lens, extend_lens, locs, ids = [], [], [], [], [], []
    for seg in segments(entries):
        n = len(seg.tokens)
        reqs.append(seg.req)
        pool_idx.append(seg.req.req_pool_idx)
        prefix_lens.append(seg.start)
        extend_lens.append(n)
        locs.append(req_to_token[seg.req.req_pool_idx, seg.start : seg.start + n].to(torch.int64))
        ids += [0 if t == PAD_TOKEN_ID else t for t in seg.tokens]
    pad = rows - len(entries)
    if pad:
        pool_idx.append(0), prefix_lens.append(0), extend_lens.append(pad)
        locs.append(torch.zeros(pad, dtype=torch.int64, device=device))
        ids += [0] * pad
    batch = verifier.extend_batch(template, reqs, pool_idx, prefix_lens, extend_lens, ids, locs)
    ACTIVE = True
    try:
        result = verifier.forward_pass(scheduler, batch)
    finally:
        ACTIVE = False
    logits = result.logits_output.next_token_logits
    assert logits.shape[0] == rows, f"prompt row logits {tuple(logits.shape)}"
    return logits

