"""Bitwise comparison of repeated generations (`benchmarks/proof_compare.py`).
"""

from __future__ import annotations

import struct

import pytest

from benchmarks.proof_compare import compare_pair, compare_repetitions, expectation_holds

IDS, LPS = [5, 6, 7, 8], [-0.5, -1.25, -0.125, -2.0]


@pytest.mark.parametrize("got, first, first_token, max_diff", [
    pytest.param((IDS, LPS), None, None, 0.0, id="identical"),
    pytest.param(([5, 6, 9, 8], [-0.5, -1.25, -0.3, -2.0]), 2, 2, 0.0,
                 id="token diverges at 2 (logprobs of different tokens not compared)"),
    pytest.param((IDS, [-0.5, -1.25, -0.125 + 2**-20, -2.0]), 2, None, 2**-20,
                 id="same tokens, logprob bits differ at 2"),
    pytest.param(([5, 6, 7], LPS[:3]), 3, 3, 0.0, id="shorter output: diverges at its end"),
    pytest.param(([5, 6, 7, 8], [-0.5, -1.25, -0.125, -2.0]), None, None, 0.0,
                 id="equal values from separate lists"),
])
def test_compare_pair(got, first, first_token, max_diff):
    d = compare_pair((IDS, LPS), got)
    assert d.first_divergence == first
    assert d.first_token_divergence == first_token
    assert d.max_abs_logprob_diff == pytest.approx(max_diff)
    assert d.identical is (first is None)


def test_compare_is_bitwise():
    assert not compare_pair(([1], [0.0]), ([1], [-0.0])).identical, "-0.0 and 0.0 differ in bits"
    nan = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000000))[0]
    assert compare_pair(([1], [nan]), ([1], [nan])).identical


def test_compare_repetitions_and_expectations():
    same = compare_repetitions([(IDS, LPS)] * 5)
    assert same.identical and same.first_divergence is None and same.num_repetitions == 5
    late = (IDS[:3] + [9], LPS)
    mixed = compare_repetitions([(IDS, LPS), (IDS, LPS), late, (IDS, LPS)])
    assert not mixed.identical and mixed.first_divergence == 3 and mixed.num_divergent == 1
    assert expectation_holds("llm42", [same]) and not expectation_holds("llm42", [same, mixed])
    assert expectation_holds("control", [same, mixed]) and not expectation_holds("control", [same])
    with pytest.raises(ValueError, match="at least 2"):
        compare_repetitions([(IDS, LPS)])
