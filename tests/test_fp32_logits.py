"""`--llm42-fp32-logits`: fp32 logits where SGLang rounds them to bf16, for the rows that are
verified (passes, deterministic rows) and no others."""

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
    """Inside a verification pass (every row fp32), with the flag on."""
    from llm42.sglang import runtime

    processor, hidden, lm_head = head
    monkeypatch.setattr(fp32_logits, "_ENABLED", on)
    monkeypatch.setattr(runtime, "IN_VERIFY_PASS", True)
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
    from llm42.sglang import runtime

    processor, hidden, lm_head = head
    monkeypatch.setattr(fp32_logits, "_ENABLED", True)
    monkeypatch.setattr(runtime, "IN_VERIFY_PASS", True)
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


# --- which rows get fp32 logits (issue 33): deterministic rows and passes only ---------------

def _sglang_processor(vocab: int):
    """SGLang's LogitsProcessor with only what `_get_logits` reads on one rank (no TP gather, no
    DP attention), so the real `_get_logits` pipeline runs around the hook."""
    processor = lp.LogitsProcessor.__new__(lp.LogitsProcessor)
    processor.__dict__.update(
        use_fp32_lm_head=False, rl_on_policy_target=None, logit_scale=None, vocab_size=vocab,
        do_tensor_parallel_all_gather=False, do_tensor_parallel_all_gather_dp_attn=False,
        final_logit_softcapping=None)
    return processor


@pytest.fixture
def hooked(monkeypatch, head):
    """The LM head hook installed on SGLang's LogitsProcessor, fp32 logits on, and a fake
    forward that runs SGLang's `_get_logits` over every row as its logits processor would."""
    _, hidden, lm_head = head
    original = lp.LogitsProcessor._compute_lm_head
    monkeypatch.setattr(lp.LogitsProcessor, "_compute_lm_head",
                        lambda self, *a, **k: fp32_logits.compute_lm_head_hook(
                            original, self, *a, **k))
    monkeypatch.setattr(fp32_logits, "_ENABLED", True)
    processor = _sglang_processor(lm_head.weight.shape[0])
    metadata = SimpleNamespace(next_token_logits_buffer=None)

    def forward(runner, batch):
        logits = processor._get_logits(hidden, lm_head, metadata)
        return SimpleNamespace(logits_output=SimpleNamespace(next_token_logits=logits))

    return forward, hidden, lm_head


def _batch(det: list[bool], mode: str = "DECODE", return_logprob: bool = False):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from llm42.sglang import det_rows

    info = SimpleNamespace()
    det_rows.mark(info, det)
    return SimpleNamespace(forward_mode=getattr(ForwardMode, mode), sampling_info=info,
                           return_logprob=return_logprob)


_RUNNER = SimpleNamespace(server_args=SimpleNamespace(enable_dp_attention=False))


@pytest.mark.parametrize("mode", ["DECODE", "EXTEND"])
def test_only_deterministic_rows_get_fp32_logits(hooked, mode):
    """Normal rows keep SGLang's bf16 LM head bit for bit (upcast exactly, as SGLang does);
    deterministic rows get the fp32 GEMM's logits of their own hidden state."""
    forward, hidden, lm_head = hooked
    det = [False, True, False, False, True, False]
    out = fp32_logits.model_forward_hook(forward, _RUNNER, _batch(det, mode)).logits_output
    bf16 = _original(None, hidden, lm_head).float()
    fp32 = dict(zip([1, 4], fp32_logits.fp32_matmul(hidden[[1, 4]], lm_head.weight)))
    for i, is_det in enumerate(det):
        expected = fp32[i] if is_det else bf16[i]
        assert torch.equal(out.next_token_logits[i], expected), (i, is_det)
    assert not torch.equal(fp32[1], bf16[1])  # the two paths really differ on these rows


def test_a_batch_without_deterministic_rows_is_sglangs(hooked):
    forward, hidden, lm_head = hooked
    out = fp32_logits.model_forward_hook(forward, _RUNNER, _batch([False] * 6)).logits_output
    assert torch.equal(out.next_token_logits, _original(None, hidden, lm_head).float())


def test_passes_and_token_rows_get_fp32_for_every_row(hooked, monkeypatch):
    """A verification pass, and an extend batch with input logprobs and a deterministic row
    (its rows are prompt tokens, not requests), compute every row in fp32."""
    from llm42.sglang import runtime

    forward, hidden, lm_head = hooked
    fp32 = fp32_logits.fp32_matmul(hidden, lm_head.weight)
    tokens = _batch([True] + [False] * 5, "EXTEND", return_logprob=True)
    out = fp32_logits.model_forward_hook(forward, _RUNNER, tokens).logits_output
    assert torch.equal(out.next_token_logits, fp32)
    monkeypatch.setattr(runtime, "IN_VERIFY_PASS", True)
    out = fp32_logits.model_forward_hook(forward, _RUNNER, _batch([False] * 6)).logits_output
    assert torch.equal(out.next_token_logits, fp32)


def test_an_all_deterministic_batch_computes_fp32_once(hooked, monkeypatch):
    """Every row deterministic: the hook gives every row fp32 in the forward (no bf16 head to
    throw away, no recompute)."""
    forward, hidden, lm_head = hooked
    calls = []
    monkeypatch.setattr(fp32_logits, "recompute_rows", lambda *a: calls.append(a))
    out = fp32_logits.model_forward_hook(forward, _RUNNER, _batch([True] * 6)).logits_output
    assert torch.equal(out.next_token_logits, fp32_logits.fp32_matmul(hidden, lm_head.weight))
    assert not calls


def test_the_row_check_catches_a_row_from_another_hidden_state(hooked, monkeypatch):
    """LLM42_TEST_CHECK_FP32_ROWS=1 (GPU proofs and benchmarks): the recomputed rows pass when
    they come from the right hidden states and fail when the buffer is misaligned."""
    forward, hidden, lm_head = hooked
    monkeypatch.setenv(fp32_logits.CHECK_ROWS_ENV, "1")
    det = [False, True, False, False, True, False]
    fp32_logits.model_forward_hook(forward, _RUNNER, _batch(det))  # right rows: no error
    bf16 = _original(None, hidden, lm_head).float()
    with pytest.raises(RuntimeError):
        fp32_logits.check_same_rows(fp32_logits.fp32_matmul(hidden[[2, 3]], lm_head.weight),
                                    bf16[[1, 4]])


# --- one GEMM for rows of both kinds, where it is exact (issue 33) ---------------------------

_CPU_RUNNER = SimpleNamespace(server_args=SimpleNamespace(enable_dp_attention=False),
                              device="cpu")


@pytest.fixture
def one_gemm(monkeypatch):
    """A fresh exactness cache; `one_gemm_exact` counted and answering `exact`."""
    checks = []
    monkeypatch.setattr(fp32_logits, "_EXACT", {})
    monkeypatch.setattr(fp32_logits, "_GRAPH_ONE_GEMM", {})
    monkeypatch.setattr(fp32_logits, "_GRAPH_MASK", None)
    monkeypatch.setattr(fp32_logits, "_GRAPH_HIDDEN", None)
    real = fp32_logits.one_gemm_exact

    def exact(weight, rows):
        checks.append(rows)
        return real(weight, rows) if checks_answer[0] is None else checks_answer[0]

    checks_answer = [None]
    monkeypatch.setattr(fp32_logits, "one_gemm_exact", exact)
    return checks, checks_answer


@pytest.mark.parametrize("mode", ["DECODE", "EXTEND"])
def test_one_gemm_gives_normal_rows_sglangs_bits_and_det_rows_fp32(hooked, one_gemm, mode):
    """Where the check holds, one fp32-output GEMM serves every row, no recompute: normal rows
    are SGLang's bf16 logits bit for bit, deterministic rows that GEMM's fp32 rows. The check
    runs once per N."""
    forward, hidden, lm_head = hooked
    checks, answer = one_gemm
    answer[0] = True
    det = [False, True, False, False, True, False]
    for _ in range(2):
        out = fp32_logits.model_forward_hook(forward, _CPU_RUNNER, _batch(det, mode))
    logits = out.logits_output.next_token_logits
    full = fp32_logits.fp32_matmul(hidden, lm_head.weight)
    bf16 = _original(None, hidden, lm_head).float()
    assert torch.equal(logits[[0, 2, 3, 5]], full.to(torch.bfloat16).float()[[0, 2, 3, 5]])
    assert torch.equal(logits[[1, 4]], full[[1, 4]])
    assert checks == [6], "one check per N"
    if torch.equal(full.to(torch.bfloat16), _original(None, hidden, lm_head)):
        assert torch.equal(logits[[0, 2, 3, 5]], bf16[[0, 2, 3, 5]])  # what the check means


def test_an_n_that_fails_the_check_keeps_the_recompute(hooked, one_gemm, monkeypatch):
    """bf16 != rounded fp32 for this N (or the layout turned off, or a logit scale): SGLang's
    bf16 head for every row, then the deterministic rows recomputed (a GEMM of their own)."""
    forward, hidden, lm_head = hooked
    checks, answer = one_gemm
    det = [False, True, False, False, True, False]
    bf16 = _original(None, hidden, lm_head).float()
    recomputed = fp32_logits.fp32_matmul(hidden[[1, 4]], lm_head.weight)

    def run():
        out = fp32_logits.model_forward_hook(forward, _CPU_RUNNER, _batch(det)).logits_output
        return out.next_token_logits

    answer[0] = False
    logits = run()
    assert torch.equal(logits[[0, 2, 3, 5]], bf16[[0, 2, 3, 5]])
    assert torch.equal(logits[[1, 4]], recomputed) and checks == [6]
    answer[0] = True
    monkeypatch.setattr(fp32_logits, "_EXACT", {})
    monkeypatch.setenv(fp32_logits.LAYOUT_ENV, "recompute")
    assert torch.equal(run()[[1, 4]], recomputed) and checks == [6], "never checked"
    monkeypatch.delenv(fp32_logits.LAYOUT_ENV)
    full = fp32_logits.fp32_matmul(hidden, lm_head.weight)
    assert torch.equal(run()[[1, 4]], full[[1, 4]]) and checks == [6, 6]


def _capture_decode_graph(hooked, one_gemm, monkeypatch, exact: bool) -> torch.Tensor:
    """A decode graph of the hooked head's 6 rows on a GPU, its N checked (`exact`): SGLang's
    warm-up forward, then the capture. From then on every forward runs the captured code, as
    a replay would. Returns the warm-up's logits."""
    _, hidden, lm_head = hooked
    one_gemm[1][0] = exact
    processor = _sglang_processor(lm_head.weight.shape[0])
    capturing = [False]
    monkeypatch.setattr(fp32_logits, "_capturing", lambda h: capturing[0])
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))  # a GPU's forward
    warmup = fp32_logits.compute_lm_head_hook(_original, processor, hidden, lm_head)
    capturing[0] = True
    fp32_logits.compute_lm_head_hook(_original, processor, hidden, lm_head)  # the capture
    return warmup


def test_a_decode_graph_captured_with_one_gemm_reads_the_rows_mask(hooked, one_gemm,
                                                                   monkeypatch):
    """A decode graph: its N is checked in the warm-up forward before the capture; the capture
    records the one-GEMM layout, and every replay reads the mask `model_forward_hook` writes
    before it (emulated here by running the captured code again), with no recompute after."""
    forward, hidden, lm_head = hooked
    checks, _ = one_gemm
    warmup = _capture_decode_graph(hooked, one_gemm, monkeypatch, exact=True)
    assert checks == [6] and warmup.dtype == torch.bfloat16  # a plain forward, checked
    assert fp32_logits._GRAPH_ONE_GEMM == {6: True}
    recomputes = []
    monkeypatch.setattr(fp32_logits, "recompute_rows", lambda *a: recomputes.append(a))
    full = fp32_logits.fp32_matmul(hidden, lm_head.weight)
    for det in ([False, True, False, False, True, False], [True, False, False, False, False,
                                                           False], [False] * 6):
        out = fp32_logits.model_forward_hook(forward, _CPU_RUNNER, _batch(det))  # a replay
        logits = out.logits_output.next_token_logits
        for i, is_det in enumerate(det):
            expected = full[i] if is_det else full[i].to(torch.bfloat16).float()
            assert torch.equal(logits[i], expected), (det, i)
    assert not recomputes
    assert fp32_logits._graph_used_one_gemm(4) and not fp32_logits._graph_used_one_gemm(7)


@pytest.mark.parametrize("exact", [True, False], ids=["one-gemm-graph", "recompute-graph"])
def test_a_pass_replaying_a_decode_graph_gets_fp32_for_every_row(hooked, one_gemm, monkeypatch,
                                                                  exact):
    """A row-invariant pass is a decode forward and replays SGLang's decode graph, captured for
    the fast path: whatever rows the last fast-path step marked, every row of the pass gets the
    fp32 GEMM's logits (the mask set for the pass, or every row recomputed), and the next
    fast-path replay is SGLang's bf16 again."""
    from llm42.sglang import runtime

    forward, hidden, lm_head = hooked
    _capture_decode_graph(hooked, one_gemm, monkeypatch, exact)
    assert fp32_logits._GRAPH_ONE_GEMM == {6: exact}

    def replay(runner, batch):  # the captured code, with Python's state as it was at capture
        in_pass = runtime.IN_VERIFY_PASS
        runtime.IN_VERIFY_PASS = False
        try:
            return forward(runner, batch)
        finally:
            runtime.IN_VERIFY_PASS = in_pass

    full = fp32_logits.fp32_matmul(hidden, lm_head.weight)
    fp32_logits.model_forward_hook(replay, _CPU_RUNNER,
                                   _batch([False, True, False, False, True, False]))
    pass_batch = SimpleNamespace(forward_mode=_batch([]).forward_mode, sampling_info=None,
                                 return_logprob=False)
    monkeypatch.setattr(runtime, "IN_VERIFY_PASS", True)
    out = fp32_logits.model_forward_hook(replay, _CPU_RUNNER, pass_batch).logits_output
    assert torch.equal(out.next_token_logits, full)
    monkeypatch.setattr(runtime, "IN_VERIFY_PASS", False)
    out = fp32_logits.model_forward_hook(replay, _CPU_RUNNER, _batch([False] * 6))
    assert torch.equal(out.logits_output.next_token_logits, full.to(torch.bfloat16).float())
