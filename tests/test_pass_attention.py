"""FlashInfer inside a verification pass: SGLang's own planning code, run with llm42's hook,
plans a pass as SGLang's deterministic mode plans every batch (paged kernel, fixed KV split) and
leaves normal batches alone; passes on FlashInfer never replay a prefill CUDA graph."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from llm42.sglang import pass_attention, runtime
from llm42.sglang.manifest import resolve_upstream

pytest.importorskip("sglang.srt.layers.attention.flashinfer_backend")
PLAN = "sglang.srt.layers.attention.flashinfer_backend.FlashInferAttnBackend.init_forward_metadata"
CAN_RUN = ("sglang.srt.model_executor.runner.prefill_cuda_graph_runner."
           "PrefillCudaGraphRunner.can_run_graph")


class _Updater:
    def __init__(self):
        self.calls = []

    def update(self, *args, **kwargs):
        self.calls.append(kwargs)


def _backend(enable_deterministic=False):
    """The attributes SGLang's init_forward_metadata reads on an extend batch."""
    return SimpleNamespace(
        enable_deterministic=enable_deterministic, prefill_split_tile_size=None,
        use_sliding_window_kv_pool=False, is_multimodal=False, enable_mis=False, use_paged=False,
        indices_updater_prefill=_Updater(), prefill_wrappers_paged=["paged"], dq_page_table=None,
        _prepare_dequant_workspace_metadata_for_extend=lambda *a: None)


def _extend_batch():
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    lens = torch.tensor([40, 70])
    return SimpleNamespace(
        forward_mode=ForwardMode.EXTEND, out_cache_loc=None, req_pool_indices=torch.tensor([1, 2]),
        seq_lens=lens, seq_lens_cpu=lens, seq_lens_sum=110, extend_prefix_lens=torch.tensor([0, 0]),
        extend_prefix_lens_cpu=[0, 0], encoder_lens=None, cross_attention_custom_mask=None)


def _plan(monkeypatch, in_pass: bool):
    monkeypatch.setattr(runtime, "IN_VERIFY_PASS", in_pass)
    backend = _backend()
    pass_attention.init_forward_metadata_hook(resolve_upstream(PLAN), backend, _extend_batch())
    (call,) = backend.indices_updater_prefill.calls
    return backend, call, backend.forward_metadata


def test_a_pass_is_planned_with_the_paged_kernel_and_a_fixed_split(monkeypatch):
    backend, call, meta = _plan(monkeypatch, in_pass=True)
    assert call["use_ragged"] is False and meta.use_ragged is False
    assert call["fixed_split_size"] == pass_attention.PASS_SPLIT_TILE_SIZE == 4096
    # the backend is left as it was for the next (normal) batch
    assert backend.enable_deterministic is False and backend.prefill_split_tile_size is None


def test_a_normal_batch_keeps_sglangs_plan(monkeypatch):
    _, call, meta = _plan(monkeypatch, in_pass=False)
    assert call["use_ragged"] is True and call["fixed_split_size"] is None


def test_the_backend_is_restored_when_planning_fails(monkeypatch):
    monkeypatch.setattr(runtime, "IN_VERIFY_PASS", True)
    backend = _backend()

    def broken(b, fb):
        raise RuntimeError("plan failed")
    with pytest.raises(RuntimeError):
        pass_attention.init_forward_metadata_hook(broken, backend, _extend_batch())
    assert backend.enable_deterministic is False and backend.prefill_split_tile_size is None


@pytest.mark.parametrize("backend,in_pass,graphed", [
    ("flashinfer", True, False), ("flashinfer", False, True), ("triton", True, True)])
def test_passes_on_flashinfer_run_eagerly(monkeypatch, backend, in_pass, graphed):
    import sglang.srt.runtime_context as ctx

    args = SimpleNamespace(get_attention_backends=lambda: (backend, backend))
    monkeypatch.setattr(ctx, "get_server_args", lambda: args)
    monkeypatch.setattr(pass_attention, "_EAGER_PASSES", None)
    monkeypatch.setattr(runtime, "IN_VERIFY_PASS", in_pass)
    assert resolve_upstream(CAN_RUN)  # the hooked SGLang method exists
    assert pass_attention.can_run_graph_hook(lambda r, fb: True, None, None) is graphed


FA3_EXTEND = ("sglang.srt.layers.attention.flashattention_backend.FlashAttentionBackend."
              "forward_extend")


@pytest.mark.parametrize("in_pass,splits", [(True, 1), (False, 0)])
def test_fa3_gets_one_kv_split_inside_a_pass_only(monkeypatch, in_pass, splits):
    import inspect

    # the hook relies on every FA3 call of SGLang's extend path reading backend.num_splits
    assert "num_splits=self.num_splits" in inspect.getsource(resolve_upstream(FA3_EXTEND))
    monkeypatch.setattr(runtime, "IN_VERIFY_PASS", in_pass)
    backend = SimpleNamespace(num_splits=0)
    seen = pass_attention.fa3_forward_extend_hook(lambda b, *a: b.num_splits, backend, "q")
    assert seen == splits and backend.num_splits == 0
