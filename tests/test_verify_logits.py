"""The verifier's penalties, min_new_tokens mask and logit_bias against SGLang's own code (CPU).

The fast path runs SGLang's penalizers (fed one output token per decode step) and
`SamplingBatchInfo.update_penalties` + `apply_logits_bias`; `verify_logits.apply` must give
bitwise the same logits at every output index from the tokens alone, and `penalty_rewind` must
leave the penalizers as if the rolled-back tokens had never been fed.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch

from llm42.sglang import penalty_rewind, verify_logits

penaltylib = pytest.importorskip("sglang.srt.sampling.penaltylib")
sbi = pytest.importorskip("sglang.srt.sampling.sampling_batch_info")
rep_mod = pytest.importorskip("sglang.srt.sampling.penaltylib.repetition_penalty")

VOCAB = 50
TOKENIZER = SimpleNamespace(eos_token_id=2, additional_stop_token_ids={7})
PENALIZERS = {penaltylib.BatchedFrequencyPenalizer, penaltylib.BatchedPresencePenalizer,
              penaltylib.BatchedRepetitionPenalizer, penaltylib.BatchedMinNewTokensPenalizer}


@pytest.fixture(autouse=True)
def _eager_scaling(monkeypatch):
    """SGLang torch.compiles its scaling op (CPU servers run it eagerly: TORCH_COMPILE_DISABLE)."""
    eager = inspect.unwrap(getattr(rep_mod.apply_scaling_penalties, "_torchdynamo_orig_callable",
                                   rep_mod.apply_scaling_penalties))
    monkeypatch.setattr(rep_mod, "apply_scaling_penalties", eager)
    monkeypatch.setattr(sbi, "apply_scaling_penalties", eager)


class _Batch:  # the orchestrator keeps a weak reference to its batch
    def __init__(self, reqs):
        self.reqs, self.device = reqs, "cpu"
        self.sampling_info = SimpleNamespace(penalizer_orchestrator=None)

    @property
    def orchestrator(self):
        return self.sampling_info.penalizer_orchestrator


def _req(min_new_tokens=0, stop_token_ids=None, logit_bias=None, prompt_len=5,
         frequency=0.0, presence=0.0, repetition=1.0):
    sp = SimpleNamespace(min_new_tokens=min_new_tokens, stop_token_ids=stop_token_ids,
                         logit_bias=logit_bias, frequency_penalty=frequency,
                         presence_penalty=presence, repetition_penalty=repetition)
    return SimpleNamespace(sampling_params=sp, tokenizer=TOKENIZER, output_ids=[],
                           origin_input_ids=list(range(prompt_len)))


def _start(reqs) -> _Batch:
    batch = _Batch(reqs)
    batch.sampling_info.penalizer_orchestrator = penaltylib.BatchedPenalizerOrchestrator(
        vocab_size=VOCAB, batch=batch, penalizers=PENALIZERS)
    return batch


def _feed(batch, tokens):
    """One decode step: each request appends its token; the penalizers get them."""
    for req, t in zip(batch.reqs, tokens):
        req.output_ids.append(t)
    batch.orchestrator.cumulate_output_tokens(torch.tensor(tokens, dtype=torch.int64))


def _fast_path(batch, logits):
    """copy_for_forward's update_penalties, then apply_logits_bias (SGLang's own code)."""
    bias = torch.zeros(len(batch.reqs), VOCAB)  # as SamplingBatchInfo.from_schedule_batch
    for i, r in enumerate(batch.reqs):
        for key, value in (r.sampling_params.logit_bias or {}).items():
            bias[i, int(key)] = value
    info = SimpleNamespace(penalizer_orchestrator=batch.orchestrator, acc_additive_penalties=None,
                           acc_scaling_penalties=None, grammar_mask=None, logit_bias=bias,
                           temperatures=torch.ones(len(batch.reqs), 1), vocab_size=VOCAB)
    sbi.SamplingBatchInfo.update_penalties(info)
    info.penalizer_orchestrator = None  # copy_for_forward drops it
    sbi.SamplingBatchInfo.apply_logits_bias(info, logits)


def _reqs():
    return [
        _req(min_new_tokens=3, stop_token_ids={11, 12}, logit_bias={"4": 1.7, "11": 0.3},
             frequency=0.1, presence=0.35),
        _req(),  # a mate using nothing: zeros added, scaled by ones on the fast path
        _req(min_new_tokens=5, logit_bias={"9": -2.25}, prompt_len=8, repetition=1.3),
        _req(frequency=-0.7, repetition=0.8, presence=-1.1),
    ]


def test_verifier_logits_bitwise_as_sglang_at_every_output_index():
    batch = _start(_reqs())
    gen = torch.Generator().manual_seed(0)
    for k in range(12):  # output index k: o_0 .. o_{k-1} fed (o_0 is sampled at prefill)
        base = torch.randn(len(batch.reqs), VOCAB, generator=gen) * 3
        fast = base.clone()
        _fast_path(batch, fast)
        ver = base.clone()
        verify_logits.apply(ver, batch.reqs, [k] * len(batch.reqs))
        assert torch.equal(fast, ver), f"output index {k}: verifier logits differ from SGLang's"
        assert not torch.equal(fast[3], base[3]) or k == 0, "penalties had an effect"
        masked = torch.isneginf(ver[0, [2, 7, 11, 12]]).all().item()
        assert masked == (k < 3), f"row 0 at {k}: stop tokens masked only before min_new_tokens"
        # few distinct tokens, so counts grow past 1 (the frequency table's repeated sums)
        _feed(batch, torch.randint(3, 9, (len(batch.reqs),), generator=gen).tolist())


def test_output_index_of_prompt_and_window_entries():
    req = _req(prompt_len=6)
    assert verify_logits.output_index(req, 5) == 0  # last prompt token predicts o_0
    assert verify_logits.output_index(req, 6 + 3) == 4  # input o_3 predicts o_4


_STATE = {"BatchedFrequencyPenalizer": "cumulated_frequency_penalties",
          "BatchedPresencePenalizer": "cumulated_presence_penalties",
          "BatchedRepetitionPenalizer": "cumulated_repetition_penalties",
          "BatchedMinNewTokensPenalizer": "len_output_tokens"}


def test_rewind_leaves_the_penalizers_as_if_the_dropped_tokens_never_came():
    gen = torch.Generator().manual_seed(1)
    steps = [torch.randint(3, 9, (4,), generator=gen).tolist() for _ in range(9)]
    rolled = _start(_reqs())
    for tokens in steps:  # outputs o_0 .. o_9 exist, o_0 .. o_8 were fed
        _feed(rolled, tokens)
    for req in rolled.reqs:
        req.output_ids.append(5)
    # row 0 keeps o_0 .. o_3 (o_3 not fed yet), row 3 keeps o_0 .. o_6; as kv_rollback does
    for row, keep in ((0, 4), (3, 7)):
        req = rolled.reqs[row]
        removed = len(req.output_ids) - keep
        del req.output_ids[keep:]
        penalty_rewind.rewind(rolled, req, removed)
    fresh = _start(_reqs())
    for i, tokens in enumerate(steps):
        fed = [t if i < {0: 3, 3: 6}.get(r, 9) else None for r, t in enumerate(tokens)]
        for r, t in enumerate(fed):  # a request only feeds the tokens it kept
            if t is not None:
                fresh.reqs[r].output_ids.append(t)
        for cls, pen in fresh.orchestrator.penalizers.items():
            mask = [t is not None for t in fed]
            if all(mask):
                pen.cumulate_output_tokens(torch.tensor(tokens))
            else:  # feed row by row through a one-row view of the same op
                _feed_rows(pen, cls, tokens, mask)
    for cls in PENALIZERS:
        name = _STATE[cls.__name__]
        got = getattr(rolled.orchestrator.penalizers[cls], name)
        want = getattr(fresh.orchestrator.penalizers[cls], name)
        assert torch.equal(got, want), f"{cls.__name__}: state after rewind != fresh state"


def _feed_rows(penalizer, cls, tokens, mask):
    """cumulate_output_tokens for the rows in `mask` only: the op on all rows, the others'
    state restored (SGLang's ops are per row)."""
    name = _STATE[cls.__name__]
    before = getattr(penalizer, name).clone()
    penalizer.cumulate_output_tokens(torch.tensor(tokens))
    after = getattr(penalizer, name)
    for r, keep in enumerate(mask):
        if not keep:
            after[r] = before[r]


def test_custom_processor_sees_the_output_before_each_position():
    """SGLang's no-repeat processor (ngram 1) at the entry predicting output token k must ban
    the prompt and o_0 .. o_{k-1}, as on the fast path when o_k was sampled, and nothing of
    what follows; a row without a processor is left alone."""
    from sglang.srt.sampling.custom_logit_processor import DeepseekOCRNoRepeatNGramLogitProcessor

    from llm42.sglang import custom_processors

    from array import array

    req = _req(prompt_len=3)  # prompt ids 0, 1, 2
    req.origin_input_ids = array("q", req.origin_input_ids)  # as SGLang keeps them
    req.output_ids = array("q", [7, 9, 11, 13])
    req.custom_logit_processor = DeepseekOCRNoRepeatNGramLogitProcessor.to_str()
    req.sampling_params.custom_params = {"ngram_size": 1, "window_size": 100,
                                         "is_deterministic": True}
    plain = _req()
    logits = torch.zeros(4, VOCAB)
    custom_processors.apply(logits, [req, req, req, plain], [0, 2, 4, 1])
    banned = [set(torch.nonzero(row == float("-inf")).flatten().tolist()) for row in logits]
    assert banned == [{0, 1, 2}, {0, 1, 2, 7, 9}, {0, 1, 2, 7, 9, 11, 13}, set()]
    assert req.output_ids.tolist() == [7, 9, 11, 13]  # the live request is untouched
