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

from llm42.sglang import cpu_sampling, det_rows, group_sampling, runtime, verifier, vocab_noise

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
    (0.8, 1.0, TOP_K_ALL, 0.1, 16, 0),  # min-p: SGLang has no seeded path: unseeded if normal
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
    original = sm.Sampler._sample_from_probs  # hooked as the plugin hooks it
    monkeypatch.setattr(sm.Sampler, "_sample_from_probs", lambda *a, **kw: (
        vocab_noise.sample_from_probs_hook(original, *a, **kw)))
    s = sm.Sampler.__new__(sm.Sampler)  # without a TP group
    nn.Module.__init__(s)
    s.rl_on_policy_target, s.enable_deterministic = None, False
    s.use_log_softmax_logprob = s.use_ascend_backend = False
    s.output_logprob_processor = OutputLogprobProcessor()
    return s


FORWARD = inspect.unwrap(sm.Sampler.forward)


def _run(sampler, rows, logits, position, hook: bool, stale: bool = False, det: bool = False):
    reqs = [SimpleNamespace(sampling_params=SimpleNamespace(
        temperature=t, top_p=p, top_k=k, min_p=m, sampling_seed=seed))
        for t, p, k, m, seed, _ in rows]
    info = verifier._sampling_info(reqs, "cpu", VOCAB)  # batch-wide flags, as SGLang sets them
    det_rows.mark(info, [det] * len(rows))  # the verifier marks every row deterministic
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


def test_deterministic_rows_sampled_as_alone(sampler):
    """Deterministic rows (the verifier's, or marked in a decode batch) of every kind, min-p
    included (seeded), get in a mixed batch exactly what they get alone, and truncated ones
    draw by vocabulary id: not SGLang's draw by rank."""
    torch.manual_seed(2)
    by_rank_differs = 0
    for position in range(12):
        logits = torch.randn(len(ROWS), VOCAB) * 2
        mixed = _run(sampler, ROWS, logits, position, hook=True, det=True)
        for i, row in enumerate(ROWS):
            alone = _run(sampler, [row], logits[i : i + 1], position, hook=True, det=True)[0]
            assert mixed[i] == alone, f"row {i} position {position}"
        normal = _run(sampler, ROWS, logits, position, hook=True, det=False)
        by_rank_differs += sum(mixed[i][0] != normal[i][0] for i in (2, 3))
        for m, n in zip(mixed[:MIN_P_ROW], normal[:MIN_P_ROW]):  # logprobs: SGLang's
            assert m[0] != n[0] or m[1:] == n[1:]
    assert by_rank_differs > 0


def test_deterministic_flags_follow_filter_merge_and_copy():
    """SGLang filters, merges and copies a batch's SamplingBatchInfo; the per-row flags follow."""
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    def info(flags):
        reqs = [SimpleNamespace(sampling_params=SimpleNamespace(
            temperature=1.0, top_p=0.9, top_k=TOP_K_ALL, min_p=0.0, sampling_seed=i))
            for i in range(len(flags))]
        made = verifier._sampling_info(reqs, "cpu", VOCAB)
        det_rows.mark(made, flags)
        return made

    a = info([True, False, True])
    det_rows.filter_hook(None, a, [0, 2])
    assert det_rows.of(a) == [True, True]
    b = info([False])
    a.temperatures = torch.cat([a.temperatures[:2], b.temperatures])  # as merge_batch leaves it
    det_rows.merge_hook(None, a, b)
    assert det_rows.of(a) == [True, True, False]
    unmarked = SamplingBatchInfo.__new__(SamplingBatchInfo)
    unmarked.temperatures = torch.ones(2, 1)
    det_rows.merge_hook(None, a, unmarked)  # built without llm42: no deterministic rows
    assert det_rows.of(a) == [True, True, False, False, False]
    copied = SimpleNamespace()
    det_rows.copy_hook(copied, a)
    assert det_rows.of(copied) == det_rows.of(a)
