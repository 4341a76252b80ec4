"""`--llm42-fp32-logits`: the LM head's logits in fp32, at the cost of a bf16 GEMM.

SGLang rounds the LM head's output to the model dtype before it becomes float32. bf16 keeps 8
bits of mantissa: logits around 15 are quantized in steps of 0.06, so many tokens tie, and a
last-bit difference between the decode batch and the verification pass moves a logit across a
rounding boundary and flips the argmax. Measured on SmolLM2 real weights (CPU, W = 16, B = 32):
greedy recompute 18.2 % with bf16 logits, 6.0 % with fp32 logits.

SGLang's own `--enable-fp32-lm-head` copies the weights to fp32 on every forward. Here the GEMM
reads the bf16 weights once and writes fp32 (`torch.mm(..., out_dtype=torch.float32)` on CUDA,
fp32 accumulation as in any bf16 GEMM); where that overload is missing (CPU) the inputs are
upcast, as SGLang does. The choice is made from the server arguments, not from llm42's runtime:
SGLang captures its decode CUDA graphs before llm42's scheduler hook runs.
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)
_ENABLED: bool | None = None
_MM_OUT_DTYPE: dict[str, bool] = {}  # device type -> torch.mm(out_dtype=...) works there


def enabled() -> bool:
    global _ENABLED
    if _ENABLED is None:
        from sglang.srt.runtime_context import get_server_args

        from llm42.sglang.server_args import config_from_server_args

        config = config_from_server_args(get_server_args())
        _ENABLED = config is not None and config.fp32_logits
    return _ENABLED


def fp32_matmul(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """hidden [n, H] @ weight [V, H]^T -> [n, V] float32."""
    hidden = hidden.to(weight.dtype)
    device = hidden.device.type
    if _MM_OUT_DTYPE.get(device, True):
        try:
            out = torch.mm(hidden, weight.t(), out_dtype=torch.float32)
        except (RuntimeError, TypeError, NotImplementedError):
            _MM_OUT_DTYPE[device] = False
            logger.info("llm42: fp32 logits on %s by upcasting (no torch.mm out_dtype)", device)
        else:
            if device not in _MM_OUT_DTYPE:
                logger.info("llm42: fp32 logits on %s from a bf16 GEMM (torch.mm out_dtype)",
                            device)
            _MM_OUT_DTYPE[device] = True
            return out
    return torch.matmul(hidden.float(), weight.float().t())


def compute_lm_head_hook(original, processor, hidden_states, lm_head, embedding_bias=None):
    """AROUND LogitsProcessor._compute_lm_head: fp32 logits for a plain (unquantized, no LoRA)
    LM head when `--llm42-fp32-logits` is on; SGLang's path otherwise."""
    if not enabled() or not _is_plain(processor, lm_head):
        return original(processor, hidden_states, lm_head, embedding_bias)
    return fp32_matmul(hidden_states, lm_head.weight)


def _is_plain(processor, lm_head) -> bool:
    from sglang.srt.layers.logits_processor import should_apply_lm_head_quant_method

    quant_method = getattr(lm_head, "quant_method", None)
    return (hasattr(lm_head, "weight") and not processor.use_fp32_lm_head
            and not (hasattr(lm_head, "set_lora") and hasattr(lm_head, "apply_lora"))
            and not should_apply_lm_head_quant_method(lm_head, quant_method)
            and getattr(processor, "rl_on_policy_target", None) is None)
