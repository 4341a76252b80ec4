"""Bad input on a real llm42 server: clean 4xx (or a legitimate 200), never a 5xx, never a hang,
never a crashed scheduler; a deterministic request never fares worse than the same normal one.

Native /generate carries `is_deterministic` inside sampling_params, the OpenAI endpoints at the
top level. The property test at the end throws random mixes of (often wrong) fields at all three
endpoints; it is derandomized so CI always runs the same examples (LLM42_FUZZ_EXAMPLES=500 to
explore more locally).
"""

from __future__ import annotations

import json
import os
import re

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import CONTEXT
from llm42.sglang import request_fields

pytestmark = pytest.mark.server

ENDPOINTS = ("generate", "completions", "chat")
PATHS = {"generate": "/generate", "completions": "/v1/completions",
         "chat": "/v1/chat/completions"}
TIMEOUT = (10, 180)  # (connect, read): a hang is a failure, a slow 2-core CI box is not
_ABSENT = object()
VOCAB = 49152  # the tiny test Llama uses SmolLM2's tokenizer


def _body(endpoint, *, det=True, prompt="Hello", sampling=None, top=None, max_tokens=4):
    """Request body: `sampling` goes into sampling_params (native) or the top level (OpenAI);
    `top` always at the top level; prompt None leaves the prompt out."""
    if endpoint == "generate":
        sp = {"max_new_tokens": max_tokens, "temperature": 0, **(sampling or {})}
        if det is not _ABSENT:
            sp["is_deterministic"] = det
        body = {"sampling_params": sp}
        if prompt is not None:
            body["text"] = prompt
    else:
        body = {"model": "default", "max_tokens": max_tokens, "temperature": 0,
                **(sampling or {})}
        if det is not _ABSENT:
            body["is_deterministic"] = det
        if prompt is not None and endpoint == "completions":
            body["prompt"] = prompt
        elif prompt is not None:
            body["messages"] = (prompt if isinstance(prompt, list)
                                else [{"role": "user", "content": prompt}])
    body.update(top or {})
    return body


def _call(url, endpoint, body) -> tuple[int, str, object]:
    """(status, text, parsed JSON or None). Streams are read to the end; an SSE error event
    counts with its own code (SGLang answers HTTP 200 and reports the error in the stream)."""
    r = requests.post(url + PATHS[endpoint], json=body, timeout=TIMEOUT, stream=True)
    with r:
        try:
            text = r.content.decode(errors="replace")  # read timeout -> exception: a hang fails
        except requests.exceptions.ChunkedEncodingError as exc:
            return 599, f"stream broken off by the server: {exc}", None  # a server error
    status = r.status_code
    if status == 200 and "text/event-stream" in r.headers.get("content-type", ""):
        for line in text.splitlines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            err = event.get("error") if isinstance(event, dict) else None
            if err is not None:
                code = err.get("code") if isinstance(err, dict) else None
                code = code if isinstance(code, int) else event.get("code", 500)
                return int(code), text, event
        return status, text, None
    try:
        return status, text, json.loads(text)
    except ValueError:
        return status, text, None


def _healthy(server):
    assert server.is_running(), "SGLang server process died (see its log)"
    r = requests.get(server.url + "/health", timeout=60)
    assert r.status_code == 200, f"/health {r.status_code} after a bad request"


def _answers(server):
    """Cheap liveness (/health costs a second: it generates): the scheduler answers /get_load."""
    assert server.is_running(), "SGLang server process died (see its log)"
    r = requests.get(server.url + "/get_load", timeout=60)
    assert r.status_code == 200, f"/get_load {r.status_code} after a bad request"


# ------------------------------------------------------------ features a deterministic request
# cannot use: (native sampling_params, native top level, OpenAI top level, needle, contrast).
# Structured output and stop_regex are served (tests/test_det_structured_output.py), and so is
# LoRA (tests/test_det_lora.py).
# `contrast`: the same request without is_deterministic is served (200): the 400 is llm42's.

FEATURES = [
    ("return_hidden_states", {}, {"return_hidden_states": True},
     {"return_hidden_states": True}, False),
    # llm42 never verifies these logprobs (and SGLang 0.5.17's CPU path crashes on them).
    ("token_ids_logprob", {}, {"return_logprob": True, "token_ids_logprob": [1, 2]}, None,
     False),
]
# SGLang itself rejects this before llm42 sees the request on this server (no hidden states):
# its message names the feature, not is_deterministic.
_NEEDLES = {"return_hidden_states": r"hidden.states"}


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_unsupported_features_are_400_naming_them(llm42_server, endpoint):
    """One test per endpoint (each server test pays ~1.5 s of leak checks afterwards)."""
    url = llm42_server.url
    checked = 0
    for name, sp, top, oai, contrast in FEATURES:
        sampling, top = (sp, top) if endpoint == "generate" else (oai, {})
        if sampling is None:
            continue
        checked += 1
        status, text, _ = _call(url, endpoint, _body(endpoint, sampling=sampling, top=top))
        assert status == 400, f"{name}: {status} {text}"
        assert re.search(_NEEDLES.get(name, re.escape(name)), text, re.IGNORECASE), text
        if name not in _NEEDLES:
            assert "is_deterministic" in text, text
        if contrast:
            status, text, _ = _call(url, endpoint,
                                    _body(endpoint, det=_ABSENT, sampling=sampling, top=top))
            assert status == 200, f"{name}: without is_deterministic it is served: {text}"
    assert checked == (2 if endpoint == "generate" else 1)


def test_rejected_request_streaming_is_an_error_event(llm42_server):
    """Native streaming answers an SSE error event with code 400, OpenAI streaming HTTP 400."""
    for endpoint, sampling in (("generate", {"sampling_seed": 2**70}),
                               ("chat", {"seed": 2**70})):
        body = _body(endpoint, sampling=sampling, top={"stream": True})
        status, text, _ = _call(llm42_server.url, endpoint, body)
        assert status == 400 and "seed" in text, text


def test_request_level_features_rejected_by_llm42_itself():
    """Where SGLang would serve them (hidden states enabled), llm42 rejects them too; LoRA is
    served."""

    class Req:
        return_hidden_states = True
        lora_path = "adapter"
        lora_id = None
        custom_logit_processor = None
        input_embeds = None
        token_ids_logprob = None

    found = request_fields.unsupported_features(Req())
    assert found == ["return_hidden_states"]


def test_validation_helpers_name_the_field():
    """The pure checks behind the 400s (no server)."""
    for seed in (0, -(2**63), 2**63 - 1, 7.0, None):
        request_fields.check_sampling_seed({"sampling_seed": seed})
    for seed in ("7", 2**63, 1.5, float("nan"), True, [1]):
        with pytest.raises(ValueError, match="sampling_seed"):
            request_fields.check_sampling_seed({"sampling_seed": seed})
    ok = {"max_new_tokens": 4, "temperature": 1, "top_k": 2**31 - 1, "stop": ["a"],
          "stop_token_ids": [1], "custom_params": {"is_deterministic": True}, "top_p": None}
    assert request_fields.sampling_type_problems(ok) == []
    bad = {"max_new_tokens": "4", "top_k": 2**31, "ignore_eos": 1, "is_normalized": True,
           "nope": 1, "custom_params": {"x": [[1]]}}
    problems = " ".join(request_fields.sampling_type_problems(bad))
    for name in bad:
        assert name in problems, (name, problems)
    # a custom_params that is no object: 400 when it has to carry the flag, else SGLang's case
    with pytest.raises(ValueError, match="custom_params"):
        request_fields.extract_sampling_flag({"custom_params": [1], "is_deterministic": True},
                                             enabled=True)
    assert request_fields.extract_sampling_flag({"custom_params": [1]}, enabled=True)[1] is False
    # a grammar needs xgrammar's matcher (the verifier replays it); without one, any backend
    problem = request_fields.grammar_backend_problem({"regex": "a+"}, "outlines")
    assert "regex" in problem and "--grammar-backend xgrammar" in problem and "outlines" in problem
    assert request_fields.grammar_backend_problem({"regex": "a+"}, "xgrammar") is None
    assert request_fields.grammar_backend_problem({"stop_regex": "a+"}, "outlines") is None


def test_top_level_flag_of_native_generate_moves_into_sampling_params():
    """Native /generate drops unknown top-level keys: the hook moves the flag in instead, into
    every prompt's params of a batch, and refuses a bad or contradicting value by name."""
    merge = request_fields.merge_top_level_flag
    assert merge(None, True, enabled=True) == {"is_deterministic": True}
    assert merge({"temperature": 0.5}, True, enabled=True) == {"temperature": 0.5,
                                                               "is_deterministic": True}
    assert merge({"is_deterministic": False}, False, enabled=False) == {"is_deterministic": False}
    routed = {"custom_params": {"is_deterministic": True}}  # by the OpenAI hook: left as it is
    assert merge(routed, True, enabled=True) is routed
    with pytest.raises(ValueError, match="sent twice"):
        merge({"custom_params": {"is_deterministic": False}}, True, enabled=True)
    assert merge([{}, {"max_new_tokens": 3}], True, enabled=True) == [
        {"is_deterministic": True}, {"max_new_tokens": 3, "is_deterministic": True}]
    for inner in (False, 1, "true"):
        with pytest.raises(ValueError, match="'is_deterministic' was sent twice"):
            merge({"is_deterministic": inner}, True, enabled=True)
    with pytest.raises(ValueError, match="'is_deterministic' must be a boolean"):
        merge({}, "yes", enabled=True)
    with pytest.raises(ValueError, match="--enable-llm42"):
        merge({}, True, enabled=False)


# ------------------------------------------------------------ values that crash a scheduler
# Each of these, unchecked, kills SGLang 0.5.17's scheduler (a deterministic request reaches
# llm42's seeded sampler / verifier with it): llm42 must answer 400 instead.

CRASHERS = [
    pytest.param({"sampling_seed": "abc", "temperature": 0.8}, {}, "sampling_seed", id="seed-str"),
    pytest.param({"sampling_seed": 2**63, "temperature": 0.8}, {}, "sampling_seed",
                 id="seed-int64-overflow"),
    pytest.param({"sampling_seed": 1.5, "temperature": 0.8}, {}, "sampling_seed",
                 id="seed-fraction"),
    pytest.param({"top_k": 2**32}, {}, "top_k", id="top_k-int32-overflow"),
    pytest.param({}, {"return_logprob": True, "top_logprobs_num": VOCAB + 1},
                 "top_logprobs_num", id="top_logprobs-over-vocab"),
    pytest.param({"temperature": "0.5"}, {}, "temperature", id="temperature-str"),
    pytest.param({"custom_params": [1, 2]}, {}, "custom_params", id="custom_params-list"),
    pytest.param({"no_such_param": 1}, {}, "no_such_param", id="unknown-param"),
]


# Prompt token ids outside the vocabulary (SGLang 0.5.17 does not check them: the embedding
# lookup kills the scheduler).
BAD_IDS = [("generate", dict(prompt=None, top={"input_ids": [5, -1]})),
           ("generate", dict(prompt=None, top={"input_ids": [VOCAB]})),
           ("completions", dict(prompt=[-1])), ("completions", dict(prompt=[7, VOCAB + 3]))]


def test_values_that_would_crash_the_scheduler_are_400(llm42_server):
    for case in CRASHERS:
        sampling, top, needle = case.values
        status, text, _ = _call(llm42_server.url, "generate",
                                _body("generate", sampling=sampling, top=top))
        assert status == 400 and needle in text, f"{case.id}: {status} {text}"
        _answers(llm42_server)
    for endpoint, kw in BAD_IDS:
        status, text, _ = _call(llm42_server.url, endpoint, _body(endpoint, **kw))
        assert status == 400 and "token ids" in text, f"{endpoint} {kw}: {status} {text}"
        _answers(llm42_server)
    _healthy(llm42_server)


def test_bad_seed_of_a_normal_request_does_not_crash_llm42(llm42_server):
    """llm42 seeds every request that carries a seed, deterministic or not: a seed that is not
    an int64 used to kill the scheduler even without is_deterministic. (JSON integers beyond
    64 bits reach SGLang as floats, so -(2**64) stands for "below int64".)"""
    url = llm42_server.url
    for endpoint, field in (("generate", "sampling_seed"), ("completions", "seed")):
        for seed in ("abc", 2**63, -(2**64), 1e30):
            body = _body(endpoint, det=_ABSENT, sampling={field: seed, "temperature": 0.8})
            status, text, _ = _call(url, endpoint, body)
            assert 400 <= status < 500 and "seed" in text, f"{endpoint} {seed!r}: {text}"
            _answers(llm42_server)
        # a valid seed still seeds: the same normal request twice gives the same tokens
        body = _body(endpoint, det=_ABSENT, sampling={field: 7, "temperature": 0.8})
        first, second = (_call(url, endpoint, body)[2] for _ in range(2))
        assert _tokens(endpoint, first) == _tokens(endpoint, second)
    _healthy(llm42_server)


def _tokens(endpoint, out):
    if endpoint == "generate":
        return out["output_ids"]
    return out["choices"][0]["text"]


# ------------------------------------------------------------ sizes and empty prompts

_LONG = "hello world " * 600  # ~1200 tokens > --context-length 1024
SIZE_CASES = [  # (endpoint, request, id)
    ("generate", dict(max_tokens=10**9), "generate-max_new_tokens-1e9"),
    ("completions", dict(max_tokens=10**9), "completions-max_tokens-1e9"),
    ("chat", dict(max_tokens=10**9), "chat-max_tokens-1e9"),
    ("chat", dict(top={"max_completion_tokens": 10**9}), "chat-max_completion_tokens-1e9"),
    ("generate", dict(prompt=""), "generate-empty-text"),
    ("generate", dict(prompt=[]), "generate-empty-batch"),
    ("generate", dict(prompt=None, top={"input_ids": []}), "generate-empty-ids"),
    ("completions", dict(prompt=""), "completions-empty"),
    ("completions", dict(prompt=[]), "completions-empty-list"),
    ("chat", dict(prompt=[]), "chat-no-messages"),
    ("chat", dict(prompt=""), "chat-empty-content"),
    ("generate", dict(prompt=_LONG), "generate-too-long"),
    ("completions", dict(prompt=_LONG), "completions-too-long"),
    ("chat", dict(prompt=_LONG), "chat-too-long"),
    ("generate", dict(prompt=None, top={"input_ids": [100] * (CONTEXT - 2)}),
     "generate-ids-at-context-limit"),
    # prompt + max_new_tokens ends inside the last verification window at the context limit
    ("generate", dict(prompt=None, max_tokens=20,
                      top={"input_ids": [100 + i % 50 for i in range(CONTEXT - 24)]}),
     "generate-last-window-at-context-end"),
]


def _message(out, text):
    if isinstance(out, dict):
        err = out.get("error")
        if isinstance(err, dict) and err.get("message"):
            return err["message"]
        if out.get("message"):
            return out["message"]
    return text


def _ids(out):
    return [o["output_ids"] for o in (out if isinstance(out, list) else [out])]


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_sizes_and_empty_prompts_deterministic_same_as_normal(llm42_server, endpoint):
    """Clean 4xx with a message or a legitimate 200, and the deterministic request gets
    exactly what the normal one gets (same status, same message, same output length)."""
    url = llm42_server.url
    for case_endpoint, kw, name in SIZE_CASES:
        if case_endpoint != endpoint:
            continue
        normal = _call(url, endpoint, _body(endpoint, det=_ABSENT, **kw))
        det = _call(url, endpoint, _body(endpoint, det=True, **kw))
        for what, (status, text, out) in (("normal", normal), ("deterministic", det)):
            assert status == 200 or 400 <= status < 500, f"{name} {what}: {status} {text[:500]}"
            if status != 200:
                assert _message(out, "").strip(), f"{name} {what}: 4xx without a message"
        assert det[0] == normal[0], f"{name}: deterministic {det[0]} vs normal {normal[0]}"
        if det[0] != 200:
            assert _message(det[2], det[1]) == _message(normal[2], normal[1]), name
        elif endpoint == "generate":  # same length handling (SGLang clips at the context end)
            assert [len(i) for i in _ids(det[2])] == [len(i) for i in _ids(normal[2])], name
            again = _call(url, endpoint, _body(endpoint, det=True, **kw))
            assert _ids(again[2]) == _ids(det[2]), f"{name}: deterministic output changed"
        _answers(llm42_server)


# ------------------------------------------------------------ property test

# Every field has valid values (including the neutral values a deterministic request may use)
# and odd ones: wrong JSON types, out-of-range numbers. A request gets 0-2 odd fields, so most
# examples reach the scheduler (and its verifier) instead of stopping at validation.
_ODD = st.sampled_from(["x", "", "0.5", [], {}, [1], {"a": 1}, True, False, None, -1, 0, 1.5,
                        2**63, -(2**63) - 1, 1e308, -0.0])
_UNIT = st.floats(0.05, 1.0)
_FIELDS = {  # name: (valid, odd)
    "temperature": (st.one_of(st.just(0), st.floats(0, 2)), st.one_of(_ODD, st.just(-0.5))),
    "top_p": (_UNIT, st.one_of(_ODD, st.just(1.5))),
    "top_k": (st.one_of(st.just(-1), st.integers(1, 60)), st.sampled_from([0, -3, 1.5, "5"])),
    "min_p": (st.sampled_from([0.0, 0.05]), st.one_of(_ODD, st.just(1.5))),
    "frequency_penalty": (st.sampled_from([0.0, 0.5]), st.one_of(_ODD, st.just(2.5))),
    "presence_penalty": (st.sampled_from([0, -1.0]), st.one_of(_ODD, st.just(-3))),
    "repetition_penalty": (st.sampled_from([1.0, 1.3]), st.one_of(_ODD, st.just(0.0))),
    "stop": (st.sampled_from(["\n", ["a", "the"], [], "é"]), st.sampled_from([5, [1], {}])),
    "stop_token_ids": (st.sampled_from([[0], [1, 2], []]), st.sampled_from([["a"], 7, [-1]])),
    "ignore_eos": (st.booleans(), _ODD),
    "skip_special_tokens": (st.booleans(), _ODD),
    "no_stop_trim": (st.booleans(), _ODD),
    "n": (st.sampled_from([1, 2]), st.sampled_from([0, "1", -1])),
    "min_new_tokens": (st.sampled_from([0, 2]), st.sampled_from([-1, 10, "1"])),
    "logit_bias": (st.sampled_from([None, {}, {"5": 1.0}]),
                   st.sampled_from([{"x": 1}, [], {str(VOCAB): 1.0}, {"5": "big"}])),
    "seed": (st.integers(0, 2**40), st.one_of(st.sampled_from([2**63, -(2**63) - 1, 2**64]),
                                               _ODD)),
    "stream_interval": (st.sampled_from([None, 1, 3]), st.sampled_from([0, -1, "2"])),
    "custom_params": (st.sampled_from([None, {}, {"k": 1}]),
                      st.sampled_from([[1, 2], "x", {"is_deterministic": 1}, {"k": [[1]]}])),
}
# Values that kill SGLang 0.5.17's own scheduler on CPU for a normal request (top_k beyond
# int32, top logprobs over the vocabulary): only ever sent with is_deterministic true, where
# llm42 must reject them.
_DET_ONLY = {"top_k": st.sampled_from([2**31, 2**40])}
# Grammars, valid and not: served for a normal request (they killed the CPU scheduler until
# llm42.compat.grammar_bitmask), rejected for a deterministic one.
_GRAMMARS = {"regex": st.sampled_from(["a", "(", 5]), "ebnf": st.just('root ::= "a"'),
             "json_schema": st.just('{"type": "object"}')}
_NATIVE_TOP = {
    "return_logprob": (st.booleans(), _ODD),
    "top_logprobs_num": (st.sampled_from([0, 1, 3]), st.sampled_from([-1, "2", 1.5])),
    "logprob_start_len": (st.sampled_from([-1, 0, 1]), st.sampled_from([10**6, "0", -5])),
    "return_text_in_logprobs": (st.booleans(), _ODD),
    "rid": (st.none(), st.sampled_from([5, ""])),
}
_OPENAI_TOP = {
    "logprobs": (st.sampled_from([None, True, False, 0, 2]), st.sampled_from([-1, "x", 99])),
    "top_logprobs": (st.sampled_from([None, 0, 2]), st.sampled_from([-1, 21, "x"])),
    "echo": (st.booleans(), _ODD),
    "user": (st.sampled_from([None, "u"]), st.just(5)),
}
_NOT_A_BOOL = st.one_of(  # is_deterministic of every other JSON type
    st.none(), st.integers(-2, 2),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=4),
    st.lists(st.booleans(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.booleans(), max_size=1),
)
_MAX_TOKENS = (st.integers(1, 6), st.sampled_from([0, -1, 10**9, 2**64, "4", 4.0, 2.5, True, [4]]))
_PROMPTS = {
    "generate": (st.sampled_from(["Hello", "The capital of France is", "é漢字🙂", ["a", "b"]]),
                 st.sampled_from(["", " ", "\x00", [], 5, None, [""]])),
    "completions": (st.sampled_from(["Hello", ["a", "b"], [1, 2, 3]]),
                    st.sampled_from(["", [], [[1, 2]], 5, None, [1.5], [-1], [VOCAB]])),
    "chat": (st.sampled_from(["Hello", [{"role": "system", "content": "x"},
                                         {"role": "user", "content": "Hi"}]]),
             st.sampled_from(["", [], [{"role": "user"}], [{"role": "x", "content": 1}], None])),
}


@st.composite
def requests_st(draw):
    endpoint = draw(st.sampled_from(ENDPOINTS))
    flag = draw(st.sampled_from([True, True, False, _ABSENT, "odd"]))
    flag = draw(_NOT_A_BOOL) if flag == "odd" else flag
    tops = _NATIVE_TOP if endpoint == "generate" else _OPENAI_TOP
    keys = draw(st.lists(st.sampled_from(sorted(_FIELDS)), max_size=4, unique=True))
    top_keys = draw(st.lists(st.sampled_from(sorted(tops)), max_size=2, unique=True))
    slots = ["prompt", "max_tokens", "stream"] + keys + top_keys
    num_odd = draw(st.sampled_from([0, 0, 1, 2]))
    odd = set(draw(st.lists(st.sampled_from(slots), min_size=num_odd, max_size=num_odd,
                            unique=True)))

    def pick(name, pair):
        return draw(pair[1] if name in odd else pair[0])

    sampling = {k: pick(k, _FIELDS[k]) for k in keys}
    rarely = st.sampled_from([False] * 5 + [True])
    if flag is True and draw(rarely):
        key = draw(st.sampled_from(sorted(_DET_ONLY)))
        sampling[key] = draw(_DET_ONLY[key])
    if draw(rarely):
        key = draw(st.sampled_from(sorted(_GRAMMARS)))
        sampling[key] = draw(_GRAMMARS[key])
    if flag is True and endpoint == "generate" and draw(rarely):
        top_keys.append("top_logprobs_num")
        odd.add("top_logprobs_num")
    if endpoint == "generate" and "seed" in sampling:
        sampling["sampling_seed"] = sampling.pop("seed")
    top = {k: pick(k, tops[k]) for k in top_keys if k != "top_logprobs_num" or k not in odd}
    if "top_logprobs_num" in top_keys and "top_logprobs_num" in odd:
        top["top_logprobs_num"] = 10**6 if flag is True else -1
    top["stream"] = pick("stream", (st.booleans(), st.sampled_from([None, "yes", 1])))
    prompt = pick("prompt", _PROMPTS[endpoint])
    if flag is not True and prompt in ([-1], [VOCAB]):
        prompt = [1, 2, 3]  # kills SGLang's own scheduler for a normal request (see BAD_IDS)
    body = _body(endpoint, det=flag, prompt=prompt, sampling=sampling, top=top,
                 max_tokens=pick("max_tokens", _MAX_TOKENS))
    return endpoint, body, flag is True


def _innermost_frames(log_path, offset: int) -> list[str]:
    """For each traceback logged since `offset`: the file of its innermost frame."""
    with open(log_path, "rb") as f:
        f.seek(offset)
        lines = f.read().decode(errors="replace").splitlines()
    found = []
    for i, line in enumerate(lines):
        if "Traceback (most recent call last):" not in line:
            continue
        last = None
        for follow in lines[i + 1:]:
            if not follow.startswith(" "):
                break
            m = re.match(r'\s+File "([^"]+)"', follow)
            last = m.group(1) if m else last
        if last:
            found.append(last)
    return found


def _strip_flag(endpoint, body):
    body = json.loads(json.dumps(body))
    holder = body.get("sampling_params") if endpoint == "generate" else body
    if isinstance(holder, dict):
        holder.pop("is_deterministic", None)
    return body


_EXAMPLES_RUN = [0]


@settings(max_examples=int(os.environ.get("LLM42_FUZZ_EXAMPLES", "60")), deadline=None,
          derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=requests_st())
def test_random_requests_never_5xx_never_hang(llm42_server, plain_server, case):
    """llm42 never makes a request fare worse than SGLang does: a 5xx only where SGLang without
    --enable-llm42 answers the same request (flag removed) with a 5xx too, i.e. SGLang failed on
    it before llm42 could look at it (wrongly typed native fields), and never raised inside
    llm42's code. No hangs (read timeouts fail), and the server stays healthy."""
    endpoint, body, is_det = case
    log_offset = os.path.getsize(llm42_server.log_path)
    status, text, _ = _call(llm42_server.url, endpoint, body)
    if status >= 500:
        what = "deterministic" if is_det else "normal"
        frames = _innermost_frames(llm42_server.log_path, log_offset)
        assert not any("/llm42/" in f for f in frames), (
            f"llm42 code raised for a {what} request: {frames}\n{json.dumps(body)}")
        ref, ref_text, _ = _call(plain_server.url, endpoint, _strip_flag(endpoint, body))
        assert ref >= 500, (f"{what} request: llm42 server {status} where SGLang answers {ref}: "
                            f"{json.dumps(body)}\n{text[:800]}\n{ref_text[:300]}")
    _EXAMPLES_RUN[0] += 1
    if _EXAMPLES_RUN[0] % 10 == 0:
        _healthy(llm42_server)
    else:
        _answers(llm42_server)  # the autouse fixture checks /health after the last example
