"""The `is_deterministic` request field: parsing, validation, and its route to the scheduler.

SamplingParams is a msgspec struct that rejects unknown keys (HTTP 500), and the OpenAI models and
native /generate's dataclass drop unknown top-level keys. So the field is read from the raw body
where it is top-level, and moved into `custom_params["is_deterministic"]`,
which SGLang already carries from every endpoint to `Req.sampling_params.custom_params`.
Validation raises ValueError, which SGLang turns into HTTP 400.
"""

from __future__ import annotations

import math
from typing import Any

FIELD = "is_deterministic"
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_INT32_MAX = (1 << 31) - 1  # SGLang's sampler keeps top_k in an int32 tensor
# SamplingParams fields that SGLang fills in itself (normalize()); never sent by a client.
_INTERNAL_SAMPLING = {"stop_strs", "stop_regex_strs", "stop_str_max_len", "stop_regex_max_len",
                      "is_normalized"}

# Constrained decoding: replayed by the verifier through the request's xgrammar matcher
# (`grammar_replay`), which other grammar backends do not offer.
_GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf", "structural_tag")
# Request features the verifier does not replay exactly: rejected for deterministic requests.
_UNSUPPORTED_REQUEST = {
    "return_hidden_states": (lambda v: bool(v), "return_hidden_states"),
    "input_embeds": (lambda v: v is not None, "input_embeds"),
    # Computed on the fast path only (the verifier does not replay them); SGLang 0.5.17 on CPU
    # also crashes its scheduler on them.
    "token_ids_logprob": (lambda v: v is not None, "token_ids_logprob"),
}


def parse_flag(value: Any, *, enabled: bool) -> bool:
    """The validated flag value; ValueError (HTTP 400) names the field and the problem."""
    if not isinstance(value, bool):
        raise ValueError(
            f"'{FIELD}' must be a boolean (true or false), got {type(value).__name__} "
            f"{value!r}."
        )
    if value and not enabled:
        raise ValueError(
            f"'{FIELD}': true was sent, but this server was started without --enable-llm42, "
            "so it cannot serve deterministic requests. Restart it with --enable-llm42 or "
            f"drop '{FIELD}'."
        )
    return value


def unsupported_features(request: Any) -> list[str]:
    found = [
        name for key, (bad, name) in _UNSUPPORTED_REQUEST.items() if bad(getattr(request, key, None))
    ]
    return sorted(set(found))


def grammar_backend_problem(sampling: dict, grammar_backend: str | None) -> str | None:
    """Deterministic requests with a grammar need SGLang's xgrammar backend (its default)."""
    used = [key for key in _GRAMMAR_FIELDS if sampling.get(key) is not None]
    if not used or grammar_backend in (None, "xgrammar"):
        return None
    return (f"'{used[0]}' needs --grammar-backend xgrammar (this server runs "
            f"{grammar_backend!r}): llm42 replays the grammar for verification through "
            "xgrammar's matcher")


def check_sampling_seed(sampling: dict) -> None:
    """On an llm42 server every request with a seed is seeded by llm42's scheduler hook, which
    puts the seed in an int64 tensor: anything else must be a 400 here, not a scheduler crash."""
    value = sampling.get("sampling_seed")
    if value is None:
        return
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if (
        not is_number
        or (isinstance(value, float) and not (math.isfinite(value) and value.is_integer()))
        or not _INT64_MIN <= value <= _INT64_MAX
    ):
        raise ValueError(
            "'sampling_seed' (OpenAI: 'seed') must be an integer in [-2**63, 2**63), got "
            f"{type(value).__name__} {_short(value)}."
        )


def sampling_type_problems(sampling: dict) -> list[str]:
    """Deterministic requests: every sampling parameter must have SGLang's declared type.

    SGLang does not type-check sampling_params (a wrong type is an HTTP 500, or a crash in the
    scheduler); for deterministic requests llm42 checks them against SamplingParams' own field
    types, so a bad value is always a 400 that names the field."""
    import msgspec
    from sglang.srt.sampling.sampling_params import SamplingParams

    types = {f.name: f.type for f in msgspec.structs.fields(SamplingParams)}
    problems = []
    for key, value in sampling.items():
        if key not in types or key in _INTERNAL_SAMPLING:
            problems.append(f"unknown sampling parameter '{key}'")
            continue
        if value is None:  # SGLang reads None as "use the default"
            continue
        try:
            msgspec.convert(value, types[key])
        except msgspec.ValidationError as exc:
            problems.append(f"'{key}': {exc} ({_short(value)})")
            continue
        if isinstance(value, int) and not isinstance(value, bool):
            limit = _INT32_MAX if key == "top_k" else _INT64_MAX
            if not _INT64_MIN <= value <= limit:
                problems.append(f"'{key}': {value} is out of range")
        if key == "logit_bias" and isinstance(value, dict):
            # NaN or inf would reach the logits as they are (SGLang checks only the keys)
            bad = [v for v in value.values() if not math.isfinite(v)]
            if bad:
                problems.append(f"'logit_bias' values must be finite numbers, got {_short(bad[0])}")
    return problems


def request_problems(request: Any, vocab_size: int | None) -> list[str]:
    """Deterministic requests: the top-level fields that llm42's verifier reads."""
    problems = []
    ret = getattr(request, "return_logprob", None)
    if ret is not None and not isinstance(ret, bool):
        problems.append(f"'return_logprob' must be a boolean, got {_short(ret)}")
    top = getattr(request, "top_logprobs_num", None)
    if top is not None:
        hi = vocab_size if vocab_size else _INT32_MAX
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= hi:
            problems.append(
                f"'top_logprobs_num' must be an integer in [0, {hi}], got {_short(top)}")
    start = getattr(request, "logprob_start_len", None)
    if start is not None and (
        isinstance(start, bool) or not isinstance(start, int)
        or not _INT64_MIN <= start <= _INT64_MAX
    ):
        problems.append(f"'logprob_start_len' must be an integer, got {_short(start)}")
    return problems


def input_ids_problems(input_ids: Any, vocab_size: int | None) -> list[str]:
    """Deterministic requests: prompt token ids outside the vocabulary (SGLang 0.5.17 never calls
    its own vocabulary check; the embedding lookup then kills the scheduler)."""
    if input_ids is None or not vocab_size:
        return []
    for token in input_ids:
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab_size:
            return [f"input token ids must be integers in [0, {vocab_size}), got {_short(token)}"]
    return []


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def extract_sampling_flag(sampling: dict, *, enabled: bool) -> tuple[dict, bool]:
    """Move `is_deterministic` from a native sampling_params dict into custom_params.

    Returns a new dict (batched requests may share one sampling_params dict)."""
    custom = sampling.get("custom_params")
    if custom is not None and not isinstance(custom, dict):
        if FIELD in sampling:
            raise ValueError(
                f"'custom_params' must be an object (it carries '{FIELD}'), got "
                f"{type(custom).__name__} {_short(custom)}."
            )
        return sampling, False  # not llm42's business: SGLang handles it as without llm42
    custom = dict(custom or {})
    if FIELD in sampling:
        value = sampling[FIELD]
        sampling = {k: v for k, v in sampling.items() if k != FIELD}
        custom[FIELD] = value
    if FIELD not in custom:
        return sampling, False
    is_det = parse_flag(custom[FIELD], enabled=enabled)
    sampling = {**sampling, "custom_params": custom}
    return sampling, is_det


def is_deterministic_params(sampling_params) -> bool:
    """For a SamplingParams in the scheduler: was the request validated as deterministic?"""
    custom = getattr(sampling_params, "custom_params", None)
    return bool(custom) and custom.get(FIELD) is True


# ---------------------------------------------------------------- hooks (tokenizer process)


def create_tokenized_object_hook(self, obj, *args, **kwargs):
    """BEFORE TokenizerManager._create_tokenized_object: validate and move the field."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    if not isinstance(obj, GenerateReqInput) or not isinstance(obj.sampling_params, dict):
        return None
    enabled = bool(getattr(self.server_args, "enable_llm42", False))
    sampling, is_det = extract_sampling_flag(obj.sampling_params, enabled=enabled)
    if enabled:
        check_sampling_seed(sampling)
    if is_det:
        bad = unsupported_features(obj)
        if bad:
            raise ValueError(
                f"'{FIELD}': true cannot be combined with {', '.join(bad)}: the llm42 verifier "
                "does not replay these exactly, so the output could not be guaranteed "
                "reproducible. Remove them or send the request without is_deterministic."
            )
        vocab = getattr(getattr(self, "model_config", None), "vocab_size", None)
        input_ids = kwargs.get("input_ids", args[1] if len(args) > 1 else None)
        problems = (sampling_type_problems(sampling) + request_problems(obj, vocab)
                    + input_ids_problems(input_ids, vocab))
        grammar = grammar_backend_problem(
            sampling, getattr(self.server_args, "grammar_backend", None))
        if grammar:
            problems.append(grammar)
        if problems:
            raise ValueError(f"Invalid deterministic request ('{FIELD}': true): "
                             + "; ".join(problems) + ".")
    obj.sampling_params = sampling
    return None


async def _top_level_flag(raw_request) -> Any:
    """The top-level field of the raw JSON body (already read and cached by FastAPI), or
    `_MISSING`."""
    if raw_request is None:
        return _MISSING
    try:
        body = await raw_request.json()
    except Exception:
        return _MISSING
    return body[FIELD] if isinstance(body, dict) and FIELD in body else _MISSING


def merge_top_level_flag(sampling_params, value: Any, *, enabled: bool):
    """Native /generate: the sampling params with a top-level `is_deterministic` moved in (a
    batch's list: into each); ValueError (HTTP 400) for a bad value or one that contradicts
    a value already inside sampling_params."""
    parse_flag(value, enabled=enabled)
    if sampling_params is None:
        return {FIELD: value}
    if isinstance(sampling_params, dict):
        # already inside: in sampling_params, or in its custom_params (where the OpenAI hook
        # put it: OpenAI requests reach this hook too, with their raw body)
        custom = sampling_params.get("custom_params")
        inner = sampling_params.get(FIELD, custom.get(FIELD, _MISSING) if isinstance(
            custom, dict) else _MISSING)
        if inner is _MISSING:
            return {**sampling_params, FIELD: value}
        if inner is not value:  # value is a bool: the same singleton or a contradiction
            raise ValueError(
                f"'{FIELD}' was sent twice with different values: {value!r} at the top level "
                f"and {inner!r} in sampling_params. Send it once."
            )
        return sampling_params
    if isinstance(sampling_params, list):
        return [merge_top_level_flag(sp, value, enabled=enabled) for sp in sampling_params]
    return sampling_params  # SGLang rejects other shapes itself


async def generate_request_hook(original, self, obj, request=None):
    """AROUND TokenizerManager.generate_request: native /generate parses its body into a
    dataclass that drops unknown top-level keys, so a top-level `is_deterministic` would be
    ignored without a word; it is moved into sampling_params, where the OpenAI hook's route
    and `create_tokenized_object_hook` take it."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    value = await _top_level_flag(request) if isinstance(obj, GenerateReqInput) else _MISSING
    if value is not _MISSING:
        enabled = bool(getattr(self.server_args, "enable_llm42", False))
        obj.sampling_params = merge_top_level_flag(obj.sampling_params, value, enabled=enabled)
    async for out in original(self, obj, request):
        yield out


async def openai_handle_request_hook(original, self, request, raw_request):
    """AROUND OpenAIServingBase.handle_request: read the top-level field the models drop."""
    value = await _top_level_flag(raw_request)
    if value is not _MISSING:
        enabled = bool(getattr(self.tokenizer_manager.server_args, "enable_llm42", False))
        try:
            parse_flag(value, enabled=enabled)
        except ValueError as exc:
            return self.create_error_response(
                message=str(exc), err_type="BadRequest", status_code=400
            )
        request.custom_params = {**(request.custom_params or {}), FIELD: value}
    return await original(self, request, raw_request)


_MISSING = object()
