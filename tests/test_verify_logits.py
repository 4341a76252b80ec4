"""The verifier's min_new_tokens mask and logit_bias against SGLang's own code (CPU, no server).

The fast path runs SGLang's `BatchedMinNewTokensPenalizer` (counting decode steps) and
`SamplingBatchInfo.apply_logits_bias`; `verify_logits.apply` must give bitwise the same logits
at every output index, and `penalty_rewind` must put the penalizer's count back after a
rollback.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from llm42.sglang import penalty_rewind, verify_logits

penaltylib = pytest.importorskip("sglang.srt.sampling.penaltylib")
sbi = pytest.importorskip("sglang.srt.sampling.sampling_batch_info")

VOCAB = 50
TOKENIZER = SimpleNamespace(eos_token_id=2, additional_stop_token_ids={7})


class _Batch:  # the orchestrator keeps a weak reference to its batch
    def __init__(self, reqs):
        self.reqs, self.device = reqs, "cpu"


def _req(min_new_tokens=0, stop_token_ids=None, logit_bias=None, prompt_len=5):
    sp = SimpleNamespace(min_new_tokens=min_new_tokens, stop_token_ids=stop_token_ids,
                         logit_bias=logit_bias, frequency_penalty=0.0, presence_penalty=0.0,
                         repetition_penalty=1.0)
    return SimpleNamespace(sampling_params=sp, tokenizer=TOKENIZER,
                           origin_input_ids=list(range(prompt_len)))


def _fast_path(batch, logits, logit_bias):
    """SGLang's order: additive penalties (accumulated as in the overlap loop), then the bias."""
    info = SimpleNamespace(penalizer_orchestrator=batch.orchestrator, acc_additive_penalties=None,
                           acc_scaling_penalties=None, grammar_mask=None, logit_bias=logit_bias,
                           temperatures=torch.ones(len(batch.reqs), 1), vocab_size=VOCAB)
    sbi.SamplingBatchInfo.update_penalties(info)
    info.penalizer_orchestrator = None  # copy_for_forward drops it
    sbi.SamplingBatchInfo.apply_logits_bias(info, logits)


def _sglang_bias(reqs):
    bias = torch.zeros(len(reqs), VOCAB)  # as SamplingBatchInfo.from_schedule_batch builds it
    for i, r in enumerate(reqs):
        for key, value in (r.sampling_params.logit_bias or {}).items():
            bias[i, int(key)] = value
    return bias


def test_mask_and_bias_bitwise_as_sglang_at_every_output_index():
    reqs = [
        _req(min_new_tokens=3, stop_token_ids={11, 12}, logit_bias={"4": 1.7, "11": 0.3}),
        _req(min_new_tokens=0, logit_bias=None),  # a mate: gets zeros added on the fast path
        _req(min_new_tokens=5, stop_token_ids=None, logit_bias={"9": -2.25}, prompt_len=8),
    ]
    batch = _Batch(reqs)
    batch.orchestrator = penaltylib.BatchedPenalizerOrchestrator(
        vocab_size=VOCAB, batch=batch, penalizers={penaltylib.BatchedMinNewTokensPenalizer})
    gen = torch.Generator().manual_seed(0)
    for k in range(7):  # output index k: k tokens before it (o_0 is sampled at prefill)
        base = torch.randn(len(reqs), VOCAB, generator=gen) * 3
        fast = base.clone()
        _fast_path(batch, fast, _sglang_bias(reqs))
        ver = base.clone()
        verify_logits.apply(ver, reqs, [k] * len(reqs))
        assert torch.equal(fast, ver), f"output index {k}: verifier logits differ from SGLang's"
        masked = torch.isneginf(ver[0, [2, 7, 11, 12]]).all().item()
        assert masked == (k < 3), f"row 0 at {k}: stop tokens masked only before min_new_tokens"
        batch.orchestrator.cumulate_output_tokens(torch.zeros(len(reqs), dtype=torch.int64))


def test_output_index_of_prompt_and_window_entries():
    req = _req(prompt_len=6)
    assert verify_logits.output_index(req, 5) == 0  # last prompt token predicts o_0
    assert verify_logits.output_index(req, 6 + 3) == 4  # input o_3 predicts o_4


def test_rewind_puts_the_min_tokens_count_back_after_a_rollback():
    reqs = [_req(min_new_tokens=4, stop_token_ids={11}), _req(min_new_tokens=4)]
    batch = _Batch(reqs)
    batch.sampling_info = SimpleNamespace(
        penalizer_orchestrator=penaltylib.BatchedPenalizerOrchestrator(
            vocab_size=VOCAB, batch=batch, penalizers={penaltylib.BatchedMinNewTokensPenalizer}))
    orchestrator = batch.sampling_info.penalizer_orchestrator
    for _ in range(5):
        orchestrator.cumulate_output_tokens(torch.zeros(2, dtype=torch.int64))
    penalty_rewind.rewind(batch, reqs[0], 3)  # 3 candidates of row 0 rolled back
    penalizer = orchestrator.penalizers[penaltylib.BatchedMinNewTokensPenalizer]
    assert penalizer.len_output_tokens.flatten().tolist() == [2, 5]
    logits = torch.zeros(2, VOCAB)
    orchestrator.apply(logits)
    assert torch.isneginf(logits[0, 11]) and not torch.isneginf(logits[1, 11]), (
        "row 0 is back below min_new_tokens: its stop token is masked again")
    penalty_rewind.rewind(batch, reqs[1], 9)
    assert penalizer.len_output_tokens.flatten().tolist() == [2, 0]  # never below zero
