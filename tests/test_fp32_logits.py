"""`--llm42-fp32-logits`: the LM head hook gives fp32 logits where SGLang rounds them to bf16."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from llm42.sglang import fp32_logits

lp = pytest.importorskip("sglang.srt.layers.logits_processor")


def _original(processor, hidden, lm_head, bias=None):  # SGLang's plain path, bf16 output
    return torch.matmul(hidden.to(lm_head.weight.dtype), lm_head.weight.T)


@pytest.fixture
def head():
    g = torch.Generator().manual_seed(0)
    weight = (torch.randn(512, 64, generator=g) * 0.5).to(torch.bfloat16)
    hidden = (torch.randn(6, 64, generator=g) * 3).to(torch.bfloat16)
    processor = SimpleNamespace(use_fp32_lm_head=False, rl_on_policy_target=None)
    return processor, hidden, SimpleNamespace(weight=weight, quant_method=None)


@pytest.mark.parametrize("on", [True, False])
def test_hook_gives_fp32_logits_only_when_enabled(monkeypatch, head, on):
    processor, hidden, lm_head = head
    monkeypatch.setattr(fp32_logits, "_ENABLED", on)
    out = fp32_logits.compute_lm_head_hook(_original, processor, hidden, lm_head)
    exact = hidden.double() @ lm_head.weight.double().T
    if not on:
        assert out.dtype == torch.bfloat16
        return
    assert out.dtype == torch.float32
    # fp32 accumulation of exact bf16 products: far closer than bf16 rounding of the output
    fp32_err = (out.double() - exact).abs().max().item()
    bf16_err = (_original(processor, hidden, lm_head).double() - exact).abs().max().item()
    assert fp32_err < bf16_err / 100, (fp32_err, bf16_err)
    # bf16 output ties many logits; fp32 output separates them
    bf16_ties = sum(len(r) - len(set(r)) for r in _original(
        processor, hidden, lm_head).float().tolist())
    fp32_ties = sum(len(r) - len(set(r)) for r in out.tolist())
    assert fp32_ties < bf16_ties


def test_quantized_or_lora_heads_keep_sglangs_path(monkeypatch, head):
    processor, hidden, lm_head = head
    monkeypatch.setattr(fp32_logits, "_ENABLED", True)
    lora = SimpleNamespace(weight=lm_head.weight, set_lora=1, apply_lora=1)
    assert fp32_logits.compute_lm_head_hook(_original, processor, hidden, lora).dtype == \
        torch.bfloat16
    upcast = SimpleNamespace(use_fp32_lm_head=True, rl_on_policy_target=None)
    assert fp32_logits.compute_lm_head_hook(_original, upcast, hidden, lm_head).dtype == \
        torch.bfloat16  # SGLang's own --enable-fp32-lm-head path stands


def test_enabled_reads_the_flag_from_sglangs_server_args(monkeypatch):
    """Decided from the server args, which exist before SGLang captures its CUDA graphs."""
    from sglang.srt import runtime_context

    from llm42.sglang import server_args as llm42_args

    for argv, expected in (([], True), (["--no-llm42-fp32-logits"], False)):
        parser = __import__("argparse").ArgumentParser()
        llm42_args.add_cli_args_hook(lambda p: None, parser)
        ns = parser.parse_args(["--enable-llm42", *argv])
        ns.random_seed = 7  # an SGLang ServerArgs field
        monkeypatch.setattr(runtime_context, "get_server_args", lambda ns=ns: ns)
        monkeypatch.setattr(fp32_logits, "_ENABLED", None)
        assert fp32_logits.enabled() is expected
