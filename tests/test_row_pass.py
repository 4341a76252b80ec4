"""The row-invariant pass's pieces without a server: the startup GEMM check catches a GEMM whose
rows depend on each other, the triton hook fixes every row's KV split inside row passes only, and
the launch gate refuses what has no proof."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from llm42.core.config import Llm42Config
from llm42.sglang import hooks_lifecycle, row_pass, runtime


def _model():
    torch.manual_seed(0)
    model = torch.nn.Module()
    model.proj = torch.nn.Linear(64, 96, bias=False).to(torch.bfloat16)
    model.lm_head = torch.nn.Linear(64, 128, bias=False).to(torch.bfloat16)
    return model


def test_check_linears_passes_row_invariant_gemms_and_names_others(monkeypatch):
    model = _model()
    assert row_pass.check_linears(model, 16) == []
    linear = torch.nn.functional.linear

    def row_mixing(x, w, b=None):  # a GEMM whose rows see each other (a batch-wide reduction)
        return linear(x, w, b) + x.float().mean().to(x.dtype)
    monkeypatch.setattr(torch.nn.functional, "linear", row_mixing)
    problems = row_pass.check_linears(model, 16)
    assert any(p.startswith("proj.weight (96, 64): a row changes with the other rows") for p in problems)


@pytest.mark.parametrize("in_row_pass", [True, False])
def test_triton_rows_get_a_fixed_split_in_row_passes_only(monkeypatch, in_row_pass):
    monkeypatch.setattr(runtime, "IN_VERIFY_PASS", in_row_pass)
    monkeypatch.setattr(runtime, "RUNTIME", SimpleNamespace(
        config=Llm42Config(verifier="row-invariant")))
    splits = torch.zeros(3, dtype=torch.int32)
    backend = SimpleNamespace(max_kv_splits=8)

    def sglang_splits(b, num_kv_splits, seq_lens):  # SGLang's: from the batch
        num_kv_splits[:] = torch.tensor([1, 2, 3])
    row_pass.static_kv_splits_hook(sglang_splits, backend, splits, torch.tensor([5, 900, 40]))
    assert splits.tolist() == ([8, 8, 8] if in_row_pass else [1, 2, 3])


def _scheduler(device: str, decode: str):
    args = SimpleNamespace(get_attention_backends=lambda: (decode, decode))
    return SimpleNamespace(device=device, server_args=args,
                           tp_worker=SimpleNamespace(model_runner=SimpleNamespace(model=_model())))


def test_the_gate_refuses_a_row_invariant_launch_without_a_proof():
    config = Llm42Config(verifier="row-invariant")
    assert hooks_lifecycle._check_row_invariant(_scheduler("cpu", "torch_native"), config) is None
    with pytest.raises(ValueError, match="no determinism proof on cuda triton yet"):
        hooks_lifecycle._check_row_invariant(_scheduler("cuda", "triton"), config)
    override = Llm42Config(verifier="row-invariant", allow_unproven_backend=True)
    assert hooks_lifecycle._check_row_invariant(
        _scheduler("cuda", "triton"), override) == "row-invariant:triton"
    with pytest.raises(ValueError, match="needs decode attention triton on cuda .got flashinfer"):
        hooks_lifecycle._check_row_invariant(_scheduler("cuda", "flashinfer"), override)
