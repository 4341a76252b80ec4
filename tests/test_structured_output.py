"""Normal structured-output requests on the CPU server (`llm42.compat.grammar_bitmask`).

SGLang 0.5.17's xgrammar backend pins its bitmask and applies it with Triton: on CPU-only torch
the first json_schema or regex request killed the scheduler, so the server died for everyone.
Each request here must be served, and its output must satisfy its constraint (the mask really
reached the logits: the tiny random model never writes JSON or this regex by itself).
"""

from __future__ import annotations

import json
import re

import pytest
import requests

pytestmark = pytest.mark.server

_SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}},
           "required": ["answer"], "additionalProperties": False}
# No spaces: xgrammar 0.2.1 reads this tokenizer as byte-fallback, so no token spells " ".
_REGEX = r"(red|green|blue)-[0-9]{2}"


def test_normal_json_schema_and_regex_requests_are_served_and_constrained(llm42_server):
    url = llm42_server.url
    chat = requests.post(url + "/v1/chat/completions", timeout=300, json={
        "model": "default", "max_tokens": 48, "temperature": 0,
        "messages": [{"role": "user", "content": "Is the sky blue?"}],
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "answer", "schema": _SCHEMA}}})
    assert chat.status_code == 200, chat.text
    choice = chat.json()["choices"][0]
    assert choice["finish_reason"] == "stop", choice  # the grammar ended it, not max_tokens
    assert json.loads(choice["message"]["content"])["answer"] in ("yes", "no"), choice

    native = requests.post(url + "/generate", timeout=300, json={
        "text": "Pick a colour and a number:",
        "sampling_params": {"max_new_tokens": 16, "temperature": 0.8, "regex": _REGEX}})
    assert native.status_code == 200, native.text
    assert re.fullmatch(_REGEX, native.json()["text"]), native.json()["text"]
    # and without a constraint the same request does not match: the mask did the work
    free = requests.post(url + "/generate", timeout=300, json={
        "text": "Pick a colour and a number:",
        "sampling_params": {"max_new_tokens": 16, "temperature": 0.8}})
    assert not re.fullmatch(_REGEX, free.json()["text"]), free.json()["text"]
    assert llm42_server.is_running()
