"""llm42's server flags on `python -m sglang.launch_server`, and what `--enable-llm42` implies.

ServerArgs is read-only after `__post_init__`, so the flags are attached through
`ServerArgs.override("llm42", ...)`; they reach the scheduler subprocess with the pickled args.
So does the attention backend: resolved once, in the launcher, where `--enable-llm42` without
`--attention-backend` swaps an unproven default of SGLang's for a proven one
(`get_default_attn_backend_hook`).
"""

from __future__ import annotations

import argparse
import contextvars
import sys
import typing
from dataclasses import replace

from llm42.core.config import Llm42Config, setting_fields
from llm42.sglang import backend_gate, speculation, verifier_choice

_GROUP = "llm42 (selective deterministic inference)"
_ENABLE_HELP = ("Serve requests that carry is_deterministic=true bitwise-reproducibly (decode on "
                "the fast path, verify every window in a fixed-shape pass, roll back).")
_TIMELINE_HELP = (
    "Profiling: each scheduler process appends one JSON line per scheduler iteration (batch "
    "launched, verification passes, duration) to DIR/timeline-<pid>.jsonl; `python -m "
    "benchmarks.timeline DIR` summarizes them. Works without --enable-llm42 too (the timeline "
    "of a baseline server, to compare with llm42's).")
# The --llm42-verifier value while `from_cli_args` resolves the args of an llm42 server given
# no attention backend (None otherwise): SGLang picks its default inside
# ServerArgs.__post_init__, before llm42's flags are attached.
_AUTO_SELECT = contextvars.ContextVar("llm42_auto_select_backend", default=None)


def dest(flag: str) -> str:
    """argparse's attribute name of a flag: --llm42-window-size -> llm42_window_size."""
    return flag.lstrip("-").replace("-", "_")


# Attribute (argparse dest) -> default of every llm42 flag: --enable-llm42, one flag per
# `Llm42Config` setting, and --llm42-timeline-dir (which also works on a baseline server, so it
# is no setting of the config, built only with --enable-llm42).
FLAG_DEFAULTS = {
    "enable_llm42": False,
    **{dest(f.metadata["flag"]): f.default for f in setting_fields()},
    "llm42_timeline_dir": None,
}
# The flags of a server whose schedulers need llm42's runtime hooks; without any of them they
# register none (`plugin.HOOKS_ENV`). The settings do nothing without --enable-llm42
# (`config_from_server_args`); --llm42-timeline-dir records a baseline server's step timeline.
RUNTIME_HOOK_FLAGS = ("enable_llm42", "llm42_timeline_dir")


def _argparse_kwargs(field, annotation) -> dict:
    """`store_true` for a bool off by default, `--x/--no-x` for one on or decided later (None),
    else a typed value."""
    if annotation is bool or set(typing.get_args(annotation)) == {bool, type(None)}:
        if field.default or field.default is None:
            return {"action": argparse.BooleanOptionalAction, "default": field.default}
        return {"action": "store_true"}
    value_type = next(t for t in typing.get_args(annotation) or (annotation,) if t is not None)
    return {"type": value_type, "default": field.default}


def add_cli_args_hook(original, parser: argparse.ArgumentParser):
    original(parser)
    group = parser.add_argument_group(_GROUP)
    group.add_argument("--enable-llm42", action="store_true", help=_ENABLE_HELP)
    hints = typing.get_type_hints(Llm42Config)
    for field in setting_fields():
        group.add_argument(field.metadata["flag"], help=field.metadata["help"],
                           **_argparse_kwargs(field, hints[field.name]))
    group.add_argument("--llm42-timeline-dir", default=None, help=_TIMELINE_HELP)


def from_cli_args_hook(original, cls, args: argparse.Namespace):
    values = {k: getattr(args, k, v) for k, v in FLAG_DEFAULTS.items()}
    if values["enable_llm42"]:
        from llm42.sglang.plugin import REGISTRATION_PROBLEMS

        if REGISTRATION_PROBLEMS:
            _fail(
                "the installed SGLang does not match llm42's patches/ manifest:\n  "
                + "\n  ".join(REGISTRATION_PROBLEMS)
            )
        # Seeded sampling (same noise in decode and verify) exists only in the torch sampler.
        args.sampling_backend = "pytorch"
        if getattr(args, "speculative_algorithm", None) and not args.disable_overlap_schedule:
            # see llm42.sglang.speculation: rollbacks need the synchronous speculative loop
            args.disable_overlap_schedule = True
            print("llm42: speculative decoding: the overlap scheduler is turned off",
                  file=sys.stderr)
    token = _AUTO_SELECT.set(values["llm42_verifier"] if values["enable_llm42"]
                             and _no_backend_given(args) else None)
    try:
        server_args = original(cls, args)
    finally:
        _AUTO_SELECT.reset(token)
    if values["enable_llm42"]:
        try:
            config = config_from_values(values, seed=server_args.random_seed,
                                        radix_cache=not server_args.disable_radix_cache)
            # the flags are checked against the verifier auto would run here; the scheduler,
            # which alone sees the pool and the weights, checks them again if it falls back
            _, decode = server_args.get_attention_backends()
            verifier = verifier_choice.launch_verifier(
                config, str(server_args.device or "cuda").split(":")[0], decode)
            replace(config, verifier=verifier).validate(_context_length(server_args))
        except ValueError as exc:
            _fail(str(exc))
        refusal = speculation.check_server_args(server_args)
        if refusal:
            _fail(refusal)
        if values["llm42_prefix_cache"] and server_args.disable_radix_cache:
            _fail("--llm42-prefix-cache shares KV through SGLang's radix cache: drop "
                  "--disable-radix-cache")
        # After SGLang's auto-selection (ServerArgs.__post_init__): the backends the model
        # runner will build, checked before any process or kernel starts.
        verdict = backend_gate.check_server_args(
            server_args, allow_unproven=values["llm42_allow_unproven_backend"],
            auto_selected=_no_backend_given(args))
        if not verdict.allowed:
            _fail(verdict.message)
        if verdict.message:
            print(f"llm42: warning: {verdict.message}", file=sys.stderr)
    server_args.override("llm42", **values)
    from llm42.sglang.plugin import record_hooks_decision

    record_hooks_decision(any(values[k] for k in RUNTIME_HOOK_FLAGS))
    return server_args


def get_default_attn_backend_hook(original, self, use_mla_backend, model_config):
    """AROUND ServerArgs._get_default_attn_backend, SGLang's choice when no backend is given:
    on an llm42 server, triton where the row-invariant verifier may run (it decodes only
    there), else an unproven choice (FA3 on Hopper) becomes a proven one; logged."""
    backend = original(self, use_mla_backend, model_config)
    verifier = _AUTO_SELECT.get()
    if verifier is None:
        return backend
    chosen, line = backend_gate.auto_select(
        backend, _usable_gpu_backends(self.device, use_mla_backend, model_config),
        prefer=verifier_choice.backend_preference(verifier, self.device))
    print(f"llm42: {line}", file=sys.stderr)
    return chosen


def _usable_gpu_backends(device: str | None, use_mla_backend: bool, model_config) -> tuple:
    """Which of flashinfer and triton can serve this model here: SGLang's own conditions for
    its non-Hopper default (FlashInfer has no attention sinks; MLA falls back to triton)."""
    from sglang.srt import server_args as sglang_server_args

    if not str(device).startswith("cuda") or sglang_server_args.is_hip():
        return ()  # no proof on other hardware: SGLang's default stays, the gate judges it
    if use_mla_backend:
        return ("triton",)
    if sglang_server_args.is_flashinfer_available() and not model_config.has_attention_sinks:
        return ("flashinfer", "triton")
    return ("triton",)


def config_from_values(values: dict, seed: int | None, radix_cache: bool = True) -> Llm42Config:
    """The config of parsed flag values (attribute -> value, as `FLAG_DEFAULTS`)."""
    settings = {f.name: values[dest(f.metadata["flag"])] for f in setting_fields()}
    return Llm42Config(seed=seed or 0, radix_cache=radix_cache, **settings)


def config_from_server_args(server_args) -> Llm42Config | None:
    if not getattr(server_args, "enable_llm42", False):
        return None
    values = {k: getattr(server_args, k, v) for k, v in FLAG_DEFAULTS.items()}
    return config_from_values(values, seed=server_args.random_seed,
                              radix_cache=not getattr(server_args, "disable_radix_cache", False))


def _context_length(server_args) -> int | None:
    if server_args.context_length:
        return server_args.context_length
    try:
        return server_args.get_model_config().context_len
    except Exception:
        return None  # checked again in the scheduler, where the model config is loaded


def _no_backend_given(args: argparse.Namespace) -> bool:
    return not any(getattr(args, name, None) for name in (
        "attention_backend", "prefill_attention_backend", "decode_attention_backend"))


def _fail(message: str):
    print(f"llm42: error: {message}", file=sys.stderr)
    raise SystemExit(2)
