"""Deterministic top-k / top-p / min-p draws keyed by vocabulary id (`llm42.sglang.vocab_noise`).

The property that cuts rollbacks: perturb near-tied probabilities by ~1e-6 so that they swap
ranks, and a draw changes only when the token drawn before or after is one of the perturbed
ones, and then rarely. SGLang's seeded sorted sampler, which draws its noise by rank, is the
control: it flips most draws.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from llm42.sglang import cpu_sampling, vocab_noise

sm = pytest.importorskip("sglang.srt.layers.sampler")

TOP_K_ALL = 1 << 30
VOCAB = 256
# (top_k, top_p, min_p): each truncation alone and combined
SETTINGS = [
    pytest.param((40, 1.0, 0.0), id="top_k40"),
    pytest.param((TOP_K_ALL, 0.9, 0.0), id="top_p0.9"),
    pytest.param((TOP_K_ALL, 1.0, 0.05), id="min_p0.05"),
    pytest.param((50, 0.95, 0.02), id="combined"),
]


@pytest.fixture(autouse=True)
def cpu_hash(monkeypatch):
    monkeypatch.setattr(sm, "murmur_hash32", cpu_sampling.murmur_hash32)
    monkeypatch.setattr(sm, "multinomial_with_seed", inspect.unwrap(sm.multinomial_with_seed))


def _near_tied(seed: int, num_pairs: int = 24):
    """Probabilities with `num_pairs` exact ties among the likely tokens, and two perturbed
    versions: in one the first token of each pair is 1e-6 ahead, in the other the second."""
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(VOCAB, generator=g) * 2.5, dim=0)
    likely = torch.argsort(probs, descending=True)[: 2 * num_pairs + 8]
    pairs = likely[torch.randperm(len(likely), generator=g)[: 2 * num_pairs]].view(-1, 2)
    probs[pairs[:, 1]] = probs[pairs[:, 0]]
    a, b = probs.clone(), probs.clone()
    a[pairs[:, 0]] += 1e-6
    b[pairs[:, 1]] += 1e-6
    return a, b, set(pairs.flatten().tolist())


def _draws(probs, setting, num: int, sglang: bool = False):
    top_k, top_p, min_p = setting
    rows = probs.expand(num, -1).contiguous()
    seeds = torch.arange(num, dtype=torch.int64) * 7919 + 3
    positions = torch.arange(num, dtype=torch.int64) % 97
    ks = torch.full((num,), min(top_k, VOCAB), dtype=torch.int32)
    ps, mps = torch.full((num,), top_p), torch.full((num,), min_p)
    if sglang:  # SGLang's own seeded path (it has none for min-p)
        return sm.top_k_top_p_min_p_sampling_from_probs_torch(
            rows.clone(), ks, ps, mps, False, seeds, positions).tolist()
    return vocab_noise.draw(rows, ks, ps, mps, seeds, positions).tolist()


@pytest.mark.parametrize("setting", SETTINGS)
def test_draw_changes_only_when_the_drawn_token_is_in_the_near_tie(setting):
    changed = 0
    for seed in range(4):
        a, b, tied = _near_tied(seed)
        for i, (x, y) in enumerate(zip(_draws(a, setting, 400), _draws(b, setting, 400))):
            if x != y:
                changed += 1
                # a tie member was drawn, or dropped out of the kept set (top-k / top-p cut)
                assert x in tied or y in tied, f"seed {seed} draw {i}: {x} -> {y}"
    assert changed > 0  # the perturbation does reach the draws: the check above has teeth


@pytest.mark.parametrize("setting", [s for s in SETTINGS if s.values[0][2] == 0.0])
def test_sglang_draw_by_rank_flips_far_more_often(setting):
    """The control: SGLang's seeded sorted sampler keeps the noise on the rank, so every draw
    that lands on a swapped rank flips (~70 % of these draws); by vocabulary id a draw flips
    only when a tie member crosses the top-k / top-p cut (<1 %)."""
    by_rank = by_id = 0
    for seed in range(4):
        a, b, _ = _near_tied(seed)
        by_rank += sum(x != y for x, y in zip(_draws(a, setting, 400, sglang=True),
                                              _draws(b, setting, 400, sglang=True)))
        by_id += sum(x != y for x, y in zip(_draws(a, setting, 400), _draws(b, setting, 400)))
    assert by_rank >= 20 * max(by_id, 1), (by_rank, by_id)


@pytest.mark.parametrize("setting", SETTINGS)
def test_draws_follow_the_truncated_distribution(setting):
    """Only kept tokens are drawn, at their renormalized frequencies (4,000 draws, loose bound)."""
    top_k, top_p, min_p = setting
    probs = torch.softmax(torch.randn(VOCAB, generator=torch.Generator().manual_seed(9)) * 2.5, 0)
    sorted_p, order = probs.sort(descending=True)
    kept = torch.zeros(VOCAB, dtype=torch.bool)
    cum = 0.0
    for rank, (p, tok) in enumerate(zip(sorted_p.tolist(), order.tolist())):
        if rank < top_k and cum <= top_p and p >= sorted_p[0].item() * min_p:
            kept[tok] = True
        cum += p
    expected = torch.where(kept, probs, 0.0)
    expected /= expected.sum()
    counts = torch.bincount(torch.tensor(_draws(probs, setting, 4000)), minlength=VOCAB).float()
    assert counts[~kept].sum() == 0, "a truncated token was drawn"
    assert (counts / 4000 - expected).abs().max() < 0.03


def test_noise_is_finite_and_keyed_by_seed_position_and_id():
    seeds = torch.tensor([1, 1, 2], dtype=torch.int64)
    positions = torch.tensor([5, 6, 5], dtype=torch.int64)
    noise = vocab_noise.gumbel_noise(seeds, positions, VOCAB, "cpu")
    assert torch.isfinite(noise).all()
    again = vocab_noise.gumbel_noise(seeds[:1], positions[:1], VOCAB, "cpu")
    assert torch.equal(noise[:1], again)  # a row's noise does not depend on its batch mates
    assert not torch.equal(noise[0], noise[1]) and not torch.equal(noise[0], noise[2])
