"""Streaming requests (`benchmarks/request_funcs.py`): TTFT and ITL when one chunk carries
several tokens.
"""

from __future__ import annotations

import pytest

from benchmarks.request_funcs import RequestOutput, _Timer


def test_timer_spreads_multi_token_chunks():
    out = RequestOutput(start_time=10.0)
    timer = _Timer(out)
    timer.observe(10.5, 1)  # first token: TTFT only
    timer.observe(10.6, 2)
    timer.observe(10.6, 2)  # no new token: ignored
    timer.observe(11.0, 6)  # a window of 4 tokens at once: 0.1 s each
    assert out.ttft == pytest.approx(0.5)
    assert out.itl == pytest.approx([0.1, 0.1, 0.1, 0.1, 0.1])
