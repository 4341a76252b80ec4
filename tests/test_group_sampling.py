"""The Sampler hook samples every row as in a batch of its own kind (SGLang's own Sampler, CPU).

Without it, one greedy / top-k / top-p / min-p row sends the whole batch through SGLang's sorted
sampler, where seeded noise is indexed by rank: a seeded row's token depends on its batch mates.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from llm42.sglang import cpu_sampling, group_sampling, runtime, verifier

sm = pytest.importorskip("sglang.srt.layers.sampler")

TOP_K_ALL = 1 << 30
VOCAB = 64
# temperature, top_p, top_k, min_p, seed, top logprobs (greedy = top_k 1, as SGLang stores it)
ROWS = [
    (0.8, 1.0, TOP_K_ALL, 0.0, 11, 2),
    (1.0, 1.0, 1, 0.0, 12, 0),
    (0.8, 0.9, TOP_K_ALL, 0.0, 13, 1),
    (1.0, 1.0, 20, 0.0, 14, 0),
    (0.5, 1.0, TOP_K_ALL, 0.0, 15, 0),
    (0.8, 1.0, TOP_K_ALL, 0.1, 16, 0),  # min-p: SGLang has no seeded path, sampled unseeded
]
MIN_P_ROW = 5


@pytest.fixture
def sampler(monkeypatch):
    from sglang.srt.layers.logprob_processor import OutputLogprobProcessor

    exec_cfg = SimpleNamespace(kernel=SimpleNamespace(sampling_backend="pytorch"))
    monkeypatch.setattr(sm, "get_exec", lambda: exec_cfg)
    monkeypatch.setattr(sm, "murmur_hash32", cpu_sampling.murmur_hash32)
    monkeypatch.setattr(sm, "multinomial_with_seed", inspect.unwrap(sm.multinomial_with_seed))
    monkeypatch.setattr(runtime, "RUNTIME", object())  # llm42 on
    s = sm.Sampler.__new__(sm.Sampler)  # without a TP group
    nn.Module.__init__(s)
    s.rl_on_policy_target, s.enable_deterministic = None, False
    s.use_log_softmax_logprob = s.use_ascend_backend = False
    s.output_logprob_processor = OutputLogprobProcessor()
    return s


FORWARD = inspect.unwrap(sm.Sampler.forward)


def _run(sampler, rows, logits, position, hook: bool, stale: bool = False):
    reqs = [SimpleNamespace(sampling_params=SimpleNamespace(
        temperature=t, top_p=p, top_k=k, min_p=m, sampling_seed=seed))
        for t, p, k, m, seed, _ in rows]
    info = verifier._sampling_info(reqs, "cpu", VOCAB)  # batch-wide flags, as SGLang sets them
    if stale:  # a greedy row has left the batch: SGLang never clears the flags it merged in
        info.is_any_greedy = info.need_top_k_sampling = True
    out = sm.LogitsProcessorOutput(next_token_logits=logits.clone())
    args = (out, info, True, [r[5] for r in rows], [None] * len(rows),
            torch.full((len(rows),), position, dtype=torch.int64))
    ids = (group_sampling.sampler_forward_hook(FORWARD, sampler, *args) if hook
           else FORWARD(sampler, *args))
    tops = out.next_token_top_logprobs_val
    return [(ids[i].item(), out.next_token_logprobs[i].item(),
             tops[i].tolist() if tops else [], out.next_token_top_logprobs_idx[i].tolist()
             if tops else []) for i in range(len(rows))]


def test_each_row_sampled_as_alone(sampler):
    torch.manual_seed(0)
    differs_without_hook = 0
    for position in range(12):
        logits = torch.randn(len(ROWS), VOCAB) * 2
        mixed = _run(sampler, ROWS, logits, position, hook=True)
        plain = _run(sampler, ROWS[:MIN_P_ROW], logits[:MIN_P_ROW], position, hook=False)
        for i, row in enumerate(ROWS):
            if i == MIN_P_ROW:  # unseeded: only its contract
                assert 0 <= mixed[i][0] < VOCAB and mixed[i][1] <= 0
                continue
            alone = _run(sampler, [row], logits[i : i + 1], position, hook=False)[0]
            assert mixed[i] == alone, f"row {i} position {position}"
        differs_without_hook += plain[0][0] != mixed[0][0] or plain[4][0] != mixed[4][0]
    # SGLang's batch-wide path draws the plain seeded rows' noise by rank: other tokens
    assert differs_without_hook > 0


def test_single_kind_batch_is_unchanged(sampler):
    """A batch of one kind gives what SGLang gives it, also when its flags are stale."""
    torch.manual_seed(1)
    logits = torch.randn(3, VOCAB)
    rows = [ROWS[0], ROWS[4], ROWS[0]]
    ref = _run(sampler, rows, logits, 7, hook=False)
    assert _run(sampler, rows, logits, 7, hook=True) == ref
    assert _run(sampler, rows, logits, 7, hook=True, stale=True) == ref
