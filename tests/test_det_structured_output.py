"""Structured output and stop_regex on deterministic requests (CPU server).

The fast path masks each token's logits with the request's grammar state after the tokens before
it; the verifier replays those masks (`llm42.sglang.grammar_replay`) and a rollback rewinds the
matcher with the tokens it drops. Each constraint is compared bitwise: alone, repeated, among
normal traffic with grammars of its own, in one batched call, and on the server that forces a
mismatch in half of all windows (there the rewind is exercised: a matcher left a token ahead
or behind makes the next mask wrong, so the output breaks its constraint or differs, or the
matcher rejects the token and the request aborts). Every output must satisfy its constraint:
the tiny random model never writes these strings by itself.
"""

from __future__ import annotations

import json
import re

import pytest
import requests

from helpers import (
    PROMPTS,
    assert_bitwise_everywhere,
    assert_same,
    concurrently,
    generate,
    natural_rollbacks_are_rare,
)

pytestmark = pytest.mark.server

PROMPTS3 = PROMPTS[:3]
# Long enough for several windows of W = 8 (byte-level tokens: one per character or so).
REGEX = r"[a-z]{4}(,[a-z]{4}){4}"
EBNF = 'root ::= item ("+" item)*\nitem ::= [0-9] [0-9] [0-9]'
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "tags"],
          "properties": {"name": {"type": "string", "pattern": "^[a-z]{6}$"},
                         "tags": {"type": "array", "minItems": 2, "maxItems": 2,
                                  "items": {"enum": ["red", "green", "blue"]}}}}
# Keep what follows the first digit pair (stop_regex ends at its match).
STOP_REGEX = r"[0-9][0-9]"

# xgrammar's structural tag format: the whole output is one tag around a regex.
TAG = {"type": "structural_tag",
       "format": {"type": "tag", "begin": "<answer>", "end": "</answer>",
                  "content": {"type": "regex", "pattern": "[a-z]{4}(,[a-z]{4}){3}"}}}

CONSTRAINTS = {
    "regex": ({"regex": REGEX}, lambda text: re.fullmatch(REGEX, text)),
    "ebnf": ({"ebnf": EBNF}, lambda text: re.fullmatch(r"[0-9]{3}(\+[0-9]{3})*", text)),
    "json_schema": ({"json_schema": json.dumps(SCHEMA)}, lambda text: _matches_schema(text)),
    "structural_tag": ({"structural_tag": json.dumps(TAG)},
                       lambda text: re.fullmatch(r"<answer>[a-z]{4}(,[a-z]{4}){3}</answer>", text)),
}


def _matches_schema(text: str) -> bool:
    value = json.loads(text)
    return (set(value) == {"name", "tags"} and re.fullmatch("[a-z]{6}", value["name"])
            and len(value["tags"]) == 2 and set(value["tags"]) <= {"red", "green", "blue"})


def _det(url, prompt, sampling, max_new_tokens=48):
    return generate(url, prompt, det=True, max_new_tokens=max_new_tokens, temperature=0.8,
                    seed=11, sampling=sampling)


def _normal_traffic(url, n: int):
    mixes = [{"regex": REGEX}, {}, {"json_schema": json.dumps(SCHEMA)}, {"top_k": 5}]
    return [lambda i=i: generate(url, PROMPTS[i % len(PROMPTS)], det=None, temperature=0.9,
                                 max_new_tokens=10 + 4 * (i % 4), sampling=mixes[i % len(mixes)])
            for i in range(n)]


@pytest.mark.parametrize("kind", sorted(CONSTRAINTS))
def test_constrained_bitwise_alone_loaded_batched_and_injected(llm42_server, inject_server,
                                                               kind):
    url = llm42_server.url
    sampling, satisfied = CONSTRAINTS[kind]
    refs, loaded = assert_bitwise_everywhere(
        url, lambda url, p: _det(url, p, sampling), PROMPTS3,
        normal_traffic=_normal_traffic(url, 12),
        batched=lambda url: generate(url, PROMPTS3, det=True, max_new_tokens=48,
                                     temperature=0.8, seed=11, sampling=sampling),
        inject_url=inject_server.url)
    for p, r in zip(PROMPTS3, refs):
        text = r[2]["text"]
        assert r[2]["finish_reason"]["type"] == "stop", (p, r[2]["finish_reason"], text)
        assert satisfied(text), f"{p!r}: {text!r} breaks the {kind}"
    # the verifier masks as the fast path did: the grammar adds no rollbacks of its own
    natural_rollbacks_are_rare(loaded)


def test_stop_regex_bitwise_and_evaluated_on_verified_text(llm42_server, inject_server):
    """The regex forces the digits after twelve letters (two windows in); stop_regex ends the
    request there: its finish is withheld until the window with the digits is verified, and on
    the injecting server a rollback re-checks it on the corrected tokens."""
    url = llm42_server.url
    sampling = {"regex": r"[a-z]{12}[0-9]{2}[a-z]{20}", "stop_regex": STOP_REGEX}
    refs = [_det(url, p, sampling) for p in PROMPTS3]
    for p, r in zip(PROMPTS3, refs):
        reason = r[2]["finish_reason"]
        assert reason["type"] == "stop" and reason.get("matched") == STOP_REGEX, (p, reason)
        assert re.fullmatch(r"[a-z]{12}([0-9]{2})?", r[2]["text"]), r[2]["text"]
        assert len(r[0]) < 34, "stop_regex did not end the request"
    loaded = concurrently([lambda p=p: _det(url, p, sampling) for p in PROMPTS3]
                          + _normal_traffic(url, 8))[: len(PROMPTS3)]
    injected = concurrently([lambda p=p: _det(inject_server.url, p, sampling)
                             for p in PROMPTS3])
    for p, r, a, b in zip(PROMPTS3, refs, loaded, injected):
        assert_same(r, a, f"among normal traffic {p!r}")
        assert_same(r, b, f"injected mismatches {p!r}")
        assert a[2]["finish_reason"] == b[2]["finish_reason"] == r[2]["finish_reason"]


def _openai(url, path, body, stream=False):
    """(text, logprobs) of an OpenAI completion or chat completion, streamed or not."""
    r = requests.post(url + path, json={**body, "stream": stream}, timeout=300, stream=stream)
    assert r.status_code == 200, r.text
    if not stream:
        c = r.json()["choices"][0]
        return c["text"] if "text" in c else c["message"]["content"], c["logprobs"]
    text, lps = "", []
    for line in r.iter_lines():
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        assert "error" not in chunk, chunk
        for c in chunk["choices"]:
            text += c.get("text") or (c.get("delta") or {}).get("content") or ""
            content = (c.get("logprobs") or {}).get("content")
            lps += content or []
    return text, lps


def test_openai_structured_output_streamed_loaded_and_injected(llm42_server, inject_server):
    """Chat with response_format json_schema and completions with regex: streamed or not,
    among normal traffic and with forced mismatches, the same text and logprobs."""
    chat = ("/v1/chat/completions", {
        "model": "default", "messages": [{"role": "user", "content": PROMPTS[3]}],
        "max_tokens": 64, "temperature": 0.8, "seed": 5, "logprobs": True,
        "is_deterministic": True,
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "item", "schema": SCHEMA}}})
    comp = ("/v1/completions", {"model": "default", "prompt": PROMPTS[4], "max_tokens": 48,
                                "temperature": 0.8, "seed": 9, "logprobs": 1, "regex": REGEX,
                                "is_deterministic": True})
    ref_chat, ref_comp = _openai(llm42_server.url, *chat), _openai(llm42_server.url, *comp)
    assert _matches_schema(ref_chat[0]), ref_chat[0]
    assert re.fullmatch(REGEX, ref_comp[0]), ref_comp[0]
    loaded = concurrently([lambda: _openai(llm42_server.url, *chat),
                           lambda: _openai(llm42_server.url, *comp)]
                          + _normal_traffic(llm42_server.url, 8))
    assert loaded[0] == ref_chat and loaded[1] == ref_comp
    assert _openai(inject_server.url, *comp) == ref_comp
    assert _openai(inject_server.url, *chat) == ref_chat
    streamed = _openai(llm42_server.url, *chat, stream=True)
    assert streamed[0] == ref_chat[0]
    # SGLang's streamed chat leaves out the entry of the stop token (<|im_end|>) that the
    # non-streamed answer ends with; every other entry must match bit for bit.
    full = ref_chat[1]["content"]
    assert len(streamed[1]) in (len(full), len(full) - 1), (len(streamed[1]), len(full))
    assert streamed[1] == full[: len(streamed[1])]
