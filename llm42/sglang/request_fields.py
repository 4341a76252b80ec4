"""The `is_deterministic` request field: parsing, validation, and its route to the scheduler.

SamplingParams is a msgspec struct that rejects unknown keys (HTTP 500), and the OpenAI models
drop unknown top-level keys. So the field is moved into `custom_params["is_deterministic"]`,
which SGLang already carries from every endpoint to `Req.sampling_params.custom_params`.
Validation raises ValueError, which SGLang turns into HTTP 400.
"""

from __future__ import annotations

from typing import Any

FIELD = "is_deterministic"

# Sampling features the verifier does not replay exactly: rejected for deterministic requests.
_UNSUPPORTED_SAMPLING = {
    "n": (lambda v: v not in (None, 1), "n > 1 (parallel sampling)"),
    "min_p": (lambda v: bool(v), "min_p"),
    "frequency_penalty": (lambda v: bool(v), "frequency_penalty"),
    "presence_penalty": (lambda v: bool(v), "presence_penalty"),
    "repetition_penalty": (lambda v: v not in (None, 1, 1.0), "repetition_penalty"),
    "min_new_tokens": (lambda v: bool(v), "min_new_tokens"),
    "logit_bias": (lambda v: bool(v), "logit_bias"),
    "json_schema": (lambda v: v is not None, "json_schema / response_format"),
    "regex": (lambda v: v is not None, "regex"),
    "ebnf": (lambda v: v is not None, "ebnf"),
    "structural_tag": (lambda v: v is not None, "structural_tag"),
    "stop_regex": (lambda v: bool(v), "stop_regex"),
}
_UNSUPPORTED_REQUEST = {
    "return_hidden_states": (lambda v: bool(v), "return_hidden_states"),
    "lora_path": (lambda v: v is not None, "LoRA adapters"),
    "lora_id": (lambda v: v is not None, "LoRA adapters"),
    "custom_logit_processor": (lambda v: v is not None, "custom_logit_processor"),
    "input_embeds": (lambda v: v is not None, "input_embeds"),
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


def unsupported_features(sampling: dict, request: Any) -> list[str]:
    found = [name for key, (bad, name) in _UNSUPPORTED_SAMPLING.items() if bad(sampling.get(key))]
    found += [
        name for key, (bad, name) in _UNSUPPORTED_REQUEST.items() if bad(getattr(request, key, None))
    ]
    return sorted(set(found))


def extract_sampling_flag(sampling: dict, *, enabled: bool) -> tuple[dict, bool]:
    """Move `is_deterministic` from a native sampling_params dict into custom_params.

    Returns a new dict (batched requests may share one sampling_params dict)."""
    custom = dict(sampling.get("custom_params") or {})
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
    if is_det:
        bad = unsupported_features(sampling, obj)
        if bad:
            raise ValueError(
                f"'{FIELD}': true cannot be combined with {', '.join(bad)}: the llm42 verifier "
                "does not replay these exactly, so the output could not be guaranteed "
                "reproducible. Remove them or send the request without is_deterministic."
            )
    obj.sampling_params = sampling
    return None


async def openai_handle_request_hook(original, self, request, raw_request):
    """AROUND OpenAIServingBase.handle_request: read the top-level field the models drop."""
    value = _MISSING
    if raw_request is not None:
        try:
            body = await raw_request.json()
        except Exception:
            body = None
        if isinstance(body, dict) and FIELD in body:
            value = body[FIELD]
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
