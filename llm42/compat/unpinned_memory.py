"""Pinned memory as a no-op on hosts without an accelerator (CPU engine only).

SGLang 0.5.17 asks for pinned host buffers in code that also runs on its CPU engine: its LoRA
layers, LoRA weights and torch-native LoRA backend call ``torch.tensor(..., pin_memory=True)`` and
``Tensor.pin_memory()``, which CPU-only torch refuses ("no pinned memory allocator"), so a server
started with ``--enable-lora`` died at startup. Pinning only speeds up copies to an accelerator;
with none there is nothing to speed up, so ``install()`` makes the request a no-op: the
factories drop ``pin_memory=True`` and ``Tensor.pin_memory()`` returns the tensor. Hosts with an
accelerator are left alone. The plugin installs it in every process of a CPU-engine server.
"""

from __future__ import annotations

import functools

import torch

FACTORIES = ("tensor", "empty", "zeros", "ones", "full", "arange", "empty_strided")
_MARK = "__llm42_unpinned__"


def install() -> bool:
    """Patch torch in this process; False (nothing patched) when pinned memory works here."""
    if getattr(torch.Tensor.pin_memory, _MARK, False):
        return True
    if _has_pinned_allocator():
        return False
    for name in FACTORIES:
        setattr(torch, name, _without_pinning(getattr(torch, name)))

    def pin_memory(self, *args, **kwargs):
        return self

    setattr(pin_memory, _MARK, True)
    torch.Tensor.pin_memory = pin_memory
    return True


def _has_pinned_allocator() -> bool:
    try:
        torch.empty(1, pin_memory=True)
    except RuntimeError:
        return False
    return True


def _without_pinning(factory):
    if getattr(factory, _MARK, False):
        return factory

    @functools.wraps(factory)
    def call(*args, **kwargs):
        kwargs.pop("pin_memory", None)
        return factory(*args, **kwargs)

    setattr(call, _MARK, True)
    return call
