"""The attention-backend gate: proven backends start, unproven ones stop with a message naming
the backend, the proven list and the override, and the override's backend reaches the stats.

The launch itself (SGLang's parser and auto-selection, `llm42: error:` on stderr) is tested in
tests/test_server_surface.py; a CPU server cannot run an unproven backend (they need GPU kernels),
so the scheduler side is driven here with a fake scheduler holding the resolved backends.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from llm42.sglang import runtime
from llm42.sglang.backend_gate import (
    OVERRIDE_FLAG,
    PROVEN_BACKENDS,
    PROVEN_LORA_BACKENDS,
    check,
    check_server_args,
)

CASES = [
    # (prefill, decode, allow_unproven) -> (allowed, unproven_backend)
    ("triton", "triton", False, True, None),  # the GPU proofs' backend
    ("torch_native", "torch_native", False, True, None),  # the CPU proofs' backend
    ("flashinfer", "flashinfer", False, True, None),  # fixed split in passes, H200 proof
    ("fa3", "fa3", False, False, "fa3"),  # Hopper's default; num_splits from the batch
    ("flex_attention", "triton", False, False, "flex_attention"),  # a split: the unproven half
    ("triton", "fa3", False, False, "fa3"),  # ... on either side
    ("fa3", "flex_attention", False, False, "fa3, flex_attention"),  # both named
    ("fa3", "fa3", True, True, "fa3"),  # override: starts, reported
    ("triton", "triton", True, True, None),  # override on a proven backend: nothing to report
]


@pytest.mark.parametrize("prefill, decode, allow, allowed, unproven", CASES,
                         ids=[f"{c[0]}/{c[1]}{' allow' if c[2] else ''}" for c in CASES])
def test_verdict(prefill, decode, allow, allowed, unproven):
    verdict = check(prefill, decode, allow_unproven=allow)
    assert (verdict.allowed, verdict.unproven_backend) == (allowed, unproven)
    if unproven is None:
        assert verdict.message is None
        return
    for name in unproven.split(", "):
        assert name in verdict.message, verdict.message
    for name in PROVEN_BACKENDS:
        assert name in verdict.message, f"the proven list is missing: {verdict.message}"
    assert OVERRIDE_FLAG in verdict.message


def test_the_refusal_says_how_to_fix_it_and_when_sglang_chose_the_backend():
    refused = check("fa3", "fa3", allow_unproven=False, auto_selected=True)
    assert "--attention-backend triton" in refused.message
    assert "no --attention-backend was given" in refused.message
    assert "no --attention-backend" not in check("fa3", "fa3", allow_unproven=False).message


@pytest.mark.parametrize("lora, allow, allowed, unproven", [
    ("torch_native", False, True, None),  # the CPU LoRA proofs' backend
    ("csgmv", False, True, None),  # SGLang's GPU default: the H200 proof
    ("triton", False, False, "lora:triton"),  # segments planned from the batch, no proof
    ("triton", True, True, "lora:triton"),  # override: starts, reported
])
def test_lora_backends_are_gated_too(lora, allow, allowed, unproven):
    verdict = check("triton", "triton", allow_unproven=allow, lora_backend=lora)
    assert (verdict.allowed, verdict.unproven_backend) == (allowed, unproven)
    if unproven:
        assert f"LoRA backend {lora}" in verdict.message and OVERRIDE_FLAG in verdict.message
        assert all(name in verdict.message for name in PROVEN_LORA_BACKENDS)
    if not allowed:
        assert "--lora-backend csgmv" in verdict.message
        assert "--attention-backend" not in verdict.message  # triton is proven
    both = check("fa3", "fa3", allow_unproven=False, lora_backend="triton")
    assert both.unproven_backend == "fa3, lora:triton"


def test_lora_backend_counts_only_with_lora_on():
    def args(enable_lora):
        return SimpleNamespace(get_attention_backends=lambda: ("triton", "triton"),
                               enable_lora=enable_lora, lora_backend="triton")

    assert check_server_args(args(False), allow_unproven=False).allowed
    assert not check_server_args(args(True), allow_unproven=False).allowed


def _scheduler(prefill: str, decode: str, allow: bool) -> SimpleNamespace:
    """What scheduler_init_hook reads: resolved server args and the loaded model."""
    server_args = SimpleNamespace(
        enable_llm42=True, llm42_allow_unproven_backend=allow, random_seed=0,
        get_attention_backends=lambda: (prefill, decode))
    return SimpleNamespace(
        server_args=server_args, model_config=SimpleNamespace(context_len=1024, vocab_size=32),
        page_size=1, spec_algorithm=SimpleNamespace(is_none=lambda: True),
        enable_overlap=False, enable_metrics=False)


@pytest.fixture
def scheduler_init(monkeypatch):
    from llm42.sglang import hooks_lifecycle, plugin

    # The fake scheduler runs in this process, where SGLang's targets are not hooked.
    monkeypatch.setattr(plugin, "assert_hooks_applied", lambda: None)
    monkeypatch.setattr(runtime, "RUNTIME", None)
    return lambda scheduler: hooks_lifecycle.scheduler_init_hook(None, scheduler)


def test_the_scheduler_refuses_an_unproven_backend(scheduler_init):
    with pytest.raises(ValueError, match=f"fa3.*{OVERRIDE_FLAG}"):
        scheduler_init(_scheduler("fa3", "fa3", allow=False))
    assert runtime.RUNTIME is None


@pytest.mark.parametrize("backend, allow, reported", [
    ("fa3", True, "fa3"),  # the override: started, and the stats say on what
    ("triton", False, None),  # a proven backend: null
])
def test_the_stats_report_the_unproven_backend(scheduler_init, backend, allow, reported):
    scheduler_init(_scheduler(backend, backend, allow))
    snap = runtime.RUNTIME.snapshot()
    assert (snap["unproven_backend"], snap["allow_unproven_backend"]) == (reported, allow)

