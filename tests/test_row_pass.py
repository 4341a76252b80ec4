"""The row-invariant pass's pieces without a server: the startup GEMM check catches a GEMM whose
rows depend on each other, the triton hook fixes every row's KV split inside row passes only, and
the launch gate refuses what has no proof."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from llm42.core.config import Llm42Config
from llm42.sglang import hooks_lifecycle, row_pass, runtime, verifier_choice


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
    # the experiment's tile: each row's splits from its own length, at most the maximum
    monkeypatch.setenv(row_pass.KV_TILE_ENV, "64")
    row_pass.static_kv_splits_hook(sglang_splits, backend, splits, torch.tensor([5, 900, 65]))
    assert splits.tolist() == ([1, 8, 2] if in_row_pass else [1, 2, 3])
    monkeypatch.setenv(row_pass.KV_TILE_ENV, "0")
    if in_row_pass:
        with pytest.raises(ValueError, match="LLM42_ROW_PASS_KV_TILE must be an integer >= 1"):
            row_pass.static_kv_splits_hook(sglang_splits, backend, splits, torch.tensor([5]))


def test_an_inline_step_fixes_the_split_of_the_rows_the_verifier_keeps_only(monkeypatch):
    """In an inline step the eligible rows get their own split (the maximum, or the tile's);
    normal and padding rows keep SGLang's, so a step pays the fixed split only where it verifies
    a token. Outside the step, a pass fixes every row again."""
    monkeypatch.setattr(runtime, "IN_VERIFY_PASS", True)
    monkeypatch.setattr(runtime, "RUNTIME", SimpleNamespace(
        config=Llm42Config(verifier="row-invariant")))
    splits = torch.zeros(4, dtype=torch.int32)
    backend = SimpleNamespace(max_kv_splits=8)

    def sglang_splits(b, num_kv_splits, seq_lens):
        num_kv_splits[:] = torch.tensor([1, 2, 3, 4])
    lens = torch.tensor([5, 900, 40, 1])
    with row_pass.verified_rows(torch.tensor([1, 2])):
        row_pass.static_kv_splits_hook(sglang_splits, backend, splits, lens)
        assert splits.tolist() == [1, 8, 8, 4]
        monkeypatch.setenv(row_pass.KV_TILE_ENV, "64")
        row_pass.static_kv_splits_hook(sglang_splits, backend, splits, lens)
        assert splits.tolist() == [1, 8, 1, 4]
    monkeypatch.delenv(row_pass.KV_TILE_ENV)
    row_pass.static_kv_splits_hook(sglang_splits, backend, splits, lens)
    assert splits.tolist() == [8, 8, 8, 8]


def _scheduler(device: str, decode: str, pool_rows: int = 256):
    args = SimpleNamespace(get_attention_backends=lambda: (decode, decode))
    return SimpleNamespace(device=device, server_args=args,
                           req_to_token_pool=SimpleNamespace(size=pool_rows),
                           tp_worker=SimpleNamespace(model_runner=SimpleNamespace(model=_model())))


def _row_invariant(scheduler, config):
    """An explicit row-invariant verifier's (unproven, rows), or its refusal."""
    verifier, rows, unproven, line = hooks_lifecycle.choose_verifier(config, scheduler)
    assert verifier == "row-invariant", line
    return unproven, rows


def test_the_gate_refuses_a_row_invariant_launch_without_a_proof(monkeypatch):
    """CPU torch_native and CUDA triton have proofs; a row-pass backend without one (here CUDA
    triton with its proof taken away) needs the override; a decode backend whose row passes
    cannot fix each row's KV split is refused even with it."""
    config = Llm42Config(verifier="row-invariant")
    assert _row_invariant(_scheduler("cpu", "torch_native"), config) == (
        None, row_pass.ROWS_PER_FORWARD["cpu"])
    assert _row_invariant(_scheduler("cuda", "triton"), config) == (
        None, row_pass.ROWS_PER_FORWARD["cuda"])
    monkeypatch.setattr(verifier_choice, "PROVEN_ROW_BACKENDS", {"cpu": "torch_native"})
    with pytest.raises(ValueError, match=r"no determinism proof on cuda triton yet \(proven: "
                                         r"cpu torch_native\)"):
        _row_invariant(_scheduler("cuda", "triton"), config)
    override = Llm42Config(verifier="row-invariant", allow_unproven_backend=True)
    assert _row_invariant(_scheduler("cuda", "triton"), override) == (
        "row-invariant:triton", row_pass.ROWS_PER_FORWARD["cuda"])
    with pytest.raises(ValueError, match="needs decode attention triton on cuda .got flashinfer"):
        _row_invariant(_scheduler("cuda", "flashinfer"), override)


def test_auto_runs_row_invariant_wherever_it_can_and_says_why_not(monkeypatch):
    """--llm42-verifier auto: row-invariant on a proven row-pass backend with
    enough pool rows and row-invariant GEMMs; otherwise fixed-shape, never refused, with a log
    line naming the obstacle and the flag that removes it. An explicit fixed-shape is kept, and
    auto never picks an unproven row-invariant verifier, override or not."""
    auto, rows = Llm42Config(verifier="auto"), row_pass.rows_per_forward("cuda")

    def chosen(scheduler, config=auto):
        verifier, got_rows, unproven, line = hooks_lifecycle.choose_verifier(config, scheduler)
        assert (got_rows is None) == (verifier == "fixed-shape") and unproven is None, line
        return verifier, line

    assert chosen(_scheduler("cpu", "torch_native"))[0] == "row-invariant"
    assert chosen(_scheduler("cuda", "triton")) == ("row-invariant",
                                                    "verifier row-invariant (auto: it can run here)")
    verifier, line = chosen(_scheduler("cuda", "flashinfer"))
    assert verifier == "fixed-shape" and "--attention-backend triton gives it" in line, line
    verifier, line = chosen(_scheduler("cuda", "triton", rows - 1))
    assert verifier == "fixed-shape" and f"--max-running-requests {rows} or more" in line, line
    assert chosen(_scheduler("cuda", "triton"), Llm42Config(verifier="fixed-shape"))[0] == \
        "fixed-shape"
    monkeypatch.setattr(row_pass, "check_linears", lambda model, rows: ["o_proj: a row changes"])
    verifier, line = chosen(_scheduler("cuda", "triton"))
    assert verifier == "fixed-shape" and "o_proj: a row changes" in line, line
    monkeypatch.undo()
    monkeypatch.setattr(verifier_choice, "PROVEN_ROW_BACKENDS", {"cpu": "torch_native"})
    override = Llm42Config(verifier="auto", allow_unproven_backend=True)
    verifier, line = chosen(_scheduler("cuda", "triton"), override)
    assert verifier == "fixed-shape" and "no determinism proof on cuda triton" in line, line


def test_a_row_invariant_flag_makes_auto_a_request_for_it():
    """A flag only the row-invariant verifier has turns auto into a request for it: refused
    where it cannot run (naming the fix), instead of the flag being ignored silently."""
    capped = Llm42Config(verifier="auto", max_pass_rows_per_step=64)
    assert capped.requested_verifier == "row-invariant"
    assert hooks_lifecycle.choose_verifier(capped, _scheduler("cuda", "triton"))[0] == \
        "row-invariant"
    with pytest.raises(ValueError, match="cannot run here: it needs decode attention triton"):
        hooks_lifecycle.choose_verifier(capped, _scheduler("cuda", "flashinfer"))
    inline = Llm42Config(verifier="auto", inline_verify=True)
    with pytest.raises(ValueError, match="serve with --llm42-verifier fixed-shape"):
        hooks_lifecycle.choose_verifier(inline, _scheduler("cuda", "triton", 8))
    assert Llm42Config(verifier="auto", inline_verify=False).requested_verifier == "auto"


def test_the_launcher_validates_flags_against_the_verifier_auto_would_run():
    """Where the launcher sees row-invariant's backend it validates as row-invariant (the
    scheduler re-checks if it falls back); elsewhere as fixed-shape. Without a backend given,
    auto and row-invariant prefer the row-invariant verifier's decode backend."""
    auto = Llm42Config(verifier="auto")
    assert verifier_choice.launch_verifier(auto, "cuda", "triton") == "row-invariant"
    assert verifier_choice.launch_verifier(auto, "cuda", "flashinfer") == "fixed-shape"
    assert verifier_choice.launch_verifier(auto, "cpu", "torch_native") == "row-invariant"
    assert verifier_choice.launch_verifier(Llm42Config(), "cuda", "triton") == "row-invariant"
    assert verifier_choice.launch_verifier(Llm42Config(), "cuda", "flashinfer") == "fixed-shape"
    assert verifier_choice.launch_verifier(Llm42Config(verifier="fixed-shape"), "cuda",
                                           "triton") == "fixed-shape"
    assert verifier_choice.backend_preference("auto", "cuda")[0] == "triton"
    assert verifier_choice.backend_preference("row-invariant", "cuda:0")[0] == "triton"
    assert verifier_choice.backend_preference("fixed-shape", "cuda") is None
    assert verifier_choice.backend_preference("auto", "mps") is None


def test_a_pass_of_several_forwards_keeps_every_forwards_logits(monkeypatch):
    """A pass with more entries than a forward's rows runs several forwards. Each replayed decode
    graph returns the same static output buffer, so a forward's logits must be copied out before
    the next one runs: every compared entry gets the logits of its own (position, token)."""
    from llm42.core.planner import VerifyPass, VerifyRow

    vocab, window = 4, 6
    static = torch.empty(5, vocab)  # one output buffer for every forward, like a CUDA graph's

    def graph_forward(scheduler, decode_batch, chunk, rows, device):
        static.zero_()
        for i, (_, position, token) in enumerate(chunk):
            static[i] = position * 1000 + token
        return static, True

    monkeypatch.setattr(row_pass, "ROWS_PER_FORWARD", {"cpu": 5})
    monkeypatch.setattr(row_pass, "_forward", graph_forward)
    rows = [VerifyRow(rid=f"r{k}", input_ids=tuple(range(10 * k, 10 * k + window)),
                      positions=tuple(range(20 + k, 20 + k + window)), prefix_len=20 + k,
                      num_real=window, sample_from=k) for k in range(3)]
    vpass = VerifyPass(rows=tuple(rows), batch_size=3, window_size=window)
    launched = row_pass.launch_row_pass(None, SimpleNamespace(device="cpu"), vpass,
                                        [SimpleNamespace()] * 3)
    assert len(launched.entries) == 6 + 5 + 4  # compared, of 18 entries in 4 forwards of 5
    for (r, j), logits in zip(launched.entries, launched.logits, strict=True):
        expected = rows[r].positions[j] * 1000 + rows[r].input_ids[j]
        assert torch.equal(logits, torch.full((vocab,), float(expected))), (r, j)
    assert launched.graphed


def test_a_server_holding_fewer_requests_than_a_forwards_rows_is_refused():
    """The attention backend sizes its batch buffers by the requests the server holds, so a
    forward of more rows would fail at the first pass: refused at launch, naming the flag."""
    config = Llm42Config(verifier="row-invariant")
    rows = row_pass.rows_per_forward("cuda")
    assert _row_invariant(
        _scheduler("cuda", "triton", rows), config) == (None, rows)
    with pytest.raises(ValueError, match=f"--max-running-requests {rows} or more"):
        _row_invariant(_scheduler("cuda", "triton", rows - 1), config)


def test_the_forward_size_can_be_overridden_for_experiments(monkeypatch):
    assert row_pass.rows_per_forward("cuda") == row_pass.ROWS_PER_FORWARD["cuda"]
    monkeypatch.setenv(row_pass.ROWS_ENV, "256")
    assert row_pass.rows_per_forward("cuda") == 256
    assert row_pass.rows_per_forward("mps") is None, "no row pass where none is defined"
    for bad in ("0", "-4", "many"):
        monkeypatch.setenv(row_pass.ROWS_ENV, bad)
        with pytest.raises(ValueError, match="LLM42_ROW_PASS_ROWS must be an integer >= 1"):
            row_pass.rows_per_forward("cuda")
