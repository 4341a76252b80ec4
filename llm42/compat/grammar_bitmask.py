"""Structured output (json_schema / regex / ebnf) on CPU-only hosts: xgrammar's token bitmask.

SGLang 0.5.17's xgrammar backend allocates the bitmask with ``pin_memory=True`` (CPU-only torch
refuses: no pinned allocator) and applies it with a Triton kernel (``Unsupported device: cpu``
otherwise); either one killed the scheduler, and with it the server, on the first normal request
with a grammar. These stand-ins use xgrammar's own CPU allocation and CPU kernel. The manifest
registers them as ``replace_on_cpu`` hooks, so they are active only with
``SGLANG_USE_CPU_ENGINE=1``; GPU hosts keep SGLang's pinned buffer and Triton kernel.

    allocate_token_bitmask(vocab_size, batch_size)   # int32 [batch, ceil(vocab / 32)], all allowed
    apply_vocab_mask(grammar, logits, vocab_mask)    # masked logits become -inf, in place
"""

from __future__ import annotations

import torch
import xgrammar


def allocate_token_bitmask(vocab_size: int, batch_size: int) -> torch.Tensor:
    """REPLACE of `xgrammar_backend._allocate_token_bitmask` (same signature): unpinned."""
    return xgrammar.allocate_token_bitmask(batch_size, vocab_size)


def apply_vocab_mask(grammar, logits: torch.Tensor, vocab_mask: torch.Tensor) -> None:
    """REPLACE of `XGrammarGrammar.apply_vocab_mask` (`grammar` is its `self`, unused).

    logits: [batch, vocab] (float32, bfloat16 or float16); vocab_mask: [batch, ceil(vocab / 32)].
    """
    xgrammar.apply_token_bitmask_inplace(logits, vocab_mask.to(logits.device))
