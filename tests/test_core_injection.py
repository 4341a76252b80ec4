"""MismatchInjector: seeded, one corruption at most per window, always a different valid id."""

from __future__ import annotations

import math

import pytest

from llm42.core import MismatchInjector

VOCAB = 50


def run_injector(
    rate: float, seed: int, num_calls: int = 200
) -> list[tuple[list[int], int | None]]:
    injector = MismatchInjector(rate=rate, seed=seed)
    return [injector.corrupt([i % VOCAB, 7, 8, 9], VOCAB) for i in range(num_calls)]


def assert_one_valid_change(original: list[int], corrupted: list[int], index: int | None) -> None:
    changed = [i for i, (a, b) in enumerate(zip(original, corrupted, strict=True)) if a != b]
    if index is None:
        assert changed == [], f"no injection reported but positions {changed} changed"
        return
    assert changed == [index], f"expected only index {index} changed, found {changed}"
    assert 0 <= corrupted[index] < VOCAB, f"corrupted id {corrupted[index]} outside the vocab"


def test_same_seed_same_sequence() -> None:
    assert run_injector(0.5, seed=3) == run_injector(0.5, seed=3)
    assert run_injector(0.5, seed=3) != run_injector(0.5, seed=4), "seeds should matter"


@pytest.mark.parametrize(
    ("rate", "expect_all", "expect_none"),
    [
        (0.0, False, True),  # rate 0 never corrupts
        (1.0, True, False),  # rate 1 corrupts every window
        (0.5, False, False),  # rate 0.5 corrupts some windows
    ],
)
def test_rate(rate: float, expect_all: bool, expect_none: bool) -> None:
    injector = MismatchInjector(rate=rate, seed=0)
    indices = []
    for call in range(200):
        original = [call % VOCAB, 3, VOCAB - 1, 0]
        corrupted, index = injector.corrupt(original, VOCAB)
        assert original == [call % VOCAB, 3, VOCAB - 1, 0], "input list must not be mutated"
        assert_one_valid_change(original, corrupted, index)
        indices.append(index)
    num_injected = sum(index is not None for index in indices)
    assert injector.num_injected == num_injected and injector.num_calls == 200
    assert (num_injected == 200) == expect_all and (num_injected == 0) == expect_none
    if rate == 1.0:
        assert set(indices) == {0, 1, 2, 3}, "indices should be spread over the window"


@pytest.mark.parametrize("original_id", [-1, VOCAB, VOCAB + 9])  # out-of-range inputs
def test_corrupted_id_in_range_even_for_odd_input(original_id: int) -> None:
    corrupted, index = MismatchInjector(rate=1.0, seed=1).corrupt([original_id], VOCAB)
    assert index == 0 and corrupted[0] != original_id and 0 <= corrupted[0] < VOCAB


def test_two_token_vocab_always_flips() -> None:
    injector = MismatchInjector(rate=1.0, seed=0)
    for token_id in (0, 1) * 20:
        assert injector.corrupt([token_id], 2) == ([1 - token_id], 0)


def test_empty_window_is_never_corrupted() -> None:
    injector = MismatchInjector(rate=1.0, seed=0)
    assert injector.corrupt([], VOCAB) == ([], None)
    assert (injector.num_calls, injector.num_injected) == (1, 0)


@pytest.mark.parametrize("rate", [-0.1, 1.5, math.nan])  # below, above, NaN
def test_invalid_rate_raises(rate: float) -> None:
    with pytest.raises(ValueError, match="--llm42-inject-mismatch-rate"):
        MismatchInjector(rate=rate, seed=0)


def test_tiny_vocab_raises() -> None:
    with pytest.raises(ValueError, match="vocabulary"):
        MismatchInjector(rate=1.0, seed=0).corrupt([0], 1)
