"""`inline_verify.plan_step`: which rows of a decode step are verified as they are made, and how
each deterministic row's exact-KV mark moves (the chain that makes an inline token verified)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from llm42.core.window import DetRequestState
from llm42.sglang import inline_verify
from llm42.sglang.request_state import attach

PROMPT = 5  # prompt tokens of every request here
ROWS = 4  # R: rows of a row-invariant forward


def _req(exact_kv, det=True):
    req = SimpleNamespace(origin_input_ids=[1] * PROMPT, output_ids=[], rid="r")
    fields = attach(req, DetRequestState("r", 8, PROMPT, verify_prompt=True) if det else None)
    fields.exact_kv = exact_kv
    return req


def _batch(reqs, positions, mode="decode"):
    return SimpleNamespace(reqs=reqs, seq_lens_cpu=torch.tensor([p + 1 for p in positions]),
                           forward_mode=SimpleNamespace(is_decode=lambda: mode == "decode"))


@pytest.fixture
def rt():
    inline_verify._LAUNCH = None
    yield SimpleNamespace(inline_verify=True, row_pass_rows=ROWS)
    inline_verify._LAUNCH = None


def test_a_row_whose_exact_kv_reaches_its_position_is_inline_and_extends_the_chain(rt):
    chained, behind, normal = _req(7), _req(5), _req(None, det=False)
    inline_verify.plan_step(rt, _batch([chained, behind, normal], [7, 8, 3]))
    step = inline_verify._LAUNCH
    assert step is not None and [(i, k) for i, _, k in step.eligible] == [(0, 7 + 1 - PROMPT)]
    assert chained._llm42.exact_kv == 8, "KV at 7 is written by the inline forward"
    assert behind._llm42.exact_kv == 5, "a row behind its chain stays behind"


def test_a_step_over_r_rows_runs_normally_and_cuts_the_chain(rt):
    reqs = [_req(p) for p in range(ROWS + 1)]
    inline_verify.plan_step(rt, _batch(reqs, list(range(ROWS + 1))))
    assert inline_verify._LAUNCH is None
    assert [r._llm42.exact_kv for r in reqs] == list(range(ROWS + 1)), \
        "KV from p on is the fast path's: the next step at p + 1 is not eligible"


def test_a_position_before_the_mark_rewrites_from_there(rt):
    """Tokens were dropped since the mark (a finish past the stop): the KV before the step's
    position is still exact, so it is inline, and the mark moves back to just past it."""
    req = _req(9)
    inline_verify.plan_step(rt, _batch([req], [6]))
    assert inline_verify._LAUNCH is not None and req._llm42.exact_kv == 7
    inline_verify._LAUNCH = None
    other = _req(9)
    inline_verify.plan_step(rt, _batch([other] + [_req(None) for _ in range(ROWS)], [6] * 5))
    assert other._llm42.exact_kv == 6, "a step over R rows rewrites KV at 6 on the fast path"


def test_a_planned_step_that_never_ran_forgets_its_claims(rt, caplog):
    req = _req(3)
    inline_verify.plan_step(rt, _batch([req], [3]))
    assert req._llm42.exact_kv == 4
    forward = SimpleNamespace(forward_mode=SimpleNamespace(is_decode=lambda: False), batch_size=1)
    assert inline_verify.take_launch(forward) is None  # an extend forward ran instead
    assert req._llm42.exact_kv is None and inline_verify._LAUNCH is None


def test_off_without_the_flag_or_outside_decode(rt):
    req = _req(3)
    inline_verify.plan_step(SimpleNamespace(inline_verify=False, row_pass_rows=ROWS),
                            _batch([req], [3]))
    inline_verify.plan_step(rt, _batch([req], [3], mode="extend"))
    assert inline_verify._LAUNCH is None and req._llm42.exact_kv == 3
