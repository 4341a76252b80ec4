"""Draft-model attention backends for EAGLE / STANDALONE on ``torch_native`` (CPU hosts).

SGLang 0.5.17's ``DraftBackendFactory`` maps the draft worker's attention backend name to a
constructor; on CPU its maps know only ``intel_amx``, so EAGLE and STANDALONE with
``--attention-backend torch_native`` stop at startup ("EAGLE is not supported in ... backend
torch_native"). These ``around_on_cpu`` hooks answer ``torch_native`` themselves and leave every
other name to SGLang:

* decode (multi-step drafting): ``TorchNativeMultiStepDraftBackend`` (``spec_attention``);
* draft extend: SGLang's own ``TorchNativeAttnBackend`` on the draft model runner (its extend path
  serves ``DRAFT_EXTEND_V2`` as is), through SGLang's draft-extend wrapper.

    create_decode_backend(original, factory)       # manifest: DraftBackendFactory.create_decode_backend
    create_draft_extend_backend(original, factory)
"""

from __future__ import annotations

from typing import Any

TORCH_NATIVE = "torch_native"


def _backend_name(factory: Any, phase_attr: str) -> str | None:
    """The name SGLang's ``DraftBackendFactory._create_backend`` resolves for ``phase_attr``:
    ``--speculative-draft-attention-backend``, else the phase's backend, else
    ``--attention-backend``."""
    args = factory.server_args
    return factory.draft_attn_backend or getattr(args, phase_attr, None) or args.attention_backend


def create_decode_backend(original, factory):
    """AROUND ``DraftBackendFactory.create_decode_backend`` (CPU engine only)."""
    if factory.speculative_num_steps <= 1 or (
        _backend_name(factory, "decode_attention_backend") != TORCH_NATIVE
    ):
        return original(factory)
    from llm42.compat.spec_attention import TorchNativeMultiStepDraftBackend

    return TorchNativeMultiStepDraftBackend(
        factory.draft_model_runner, factory.topk, factory.speculative_num_steps
    )


def create_draft_extend_backend(original, factory):
    """AROUND ``DraftBackendFactory.create_draft_extend_backend`` (CPU engine only)."""
    from sglang.srt.runtime_context import get_spec

    phase_attr = (
        "decode_attention_backend"
        if get_spec().speculative_attention_mode == "decode"
        else "prefill_attention_backend"
    )
    if _backend_name(factory, phase_attr) != TORCH_NATIVE:
        return original(factory)
    from sglang.srt.layers.attention.attention_registry import (
        attn_backend_wrapper_for_draft_extend,
    )
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    runner = factory.draft_model_runner
    return attn_backend_wrapper_for_draft_extend(runner, TorchNativeAttnBackend(runner))
