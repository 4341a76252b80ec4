"""`fold_pass`: which due rounds ride in the next decode step, which miss it (and run as a pass a
step later), and what a step carrying riders computes: its rows, then the entries."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from sglang.srt.model_executor.forward_batch_info import ForwardMode

from llm42.core.config import Llm42Config
from llm42.core.stats import Llm42Stats
from llm42.core.window import DetRequestState
from llm42.sglang import fold_pass, inline_verify
from llm42.sglang.request_state import attach

PROMPT = 5  # prompt tokens of every request here
W = 4
ROWS = 8  # R: rows of a row-invariant forward


def _rt(fold: bool = True, pad_ratio: float = 0.0):
    """Pad ratio 0: no step short of R rows is inline by itself."""
    return SimpleNamespace(inline_verify=True, row_pass_rows=ROWS, stats=Llm42Stats(),
                           riders=None, folded=None, fold_missed=False,
                           config=Llm42Config(fold_passes=fold, window_size=W,
                                              verifier="row-invariant",
                                              inline_pad_ratio=pad_ratio))


def _windowed(rid: str = "r"):
    """A deterministic request with o_0 verified and its first window full: outputs o_0..o_W,
    the row's inputs o_0..o_{W-1} at positions P..P+W-1."""
    req = SimpleNamespace(origin_input_ids=[1] * PROMPT, output_ids=[10], rid=rid,
                          finished=lambda: False)
    state = DetRequestState(rid, W, PROMPT, verify_prompt=False)
    state.on_first_token()
    req.output_ids += [11 + i for i in range(W)]
    state.append_candidates(W)
    attach(req, state)
    return req


def _normal():
    req = SimpleNamespace(origin_input_ids=[1] * PROMPT, output_ids=[], rid="n",
                          finished=lambda: False)
    attach(req, None)
    return req


def _decode(reqs, positions):
    return SimpleNamespace(reqs=reqs, seq_lens_cpu=torch.tensor([p + 1 for p in positions]),
                           forward_mode=ForwardMode.DECODE)


@pytest.fixture(autouse=True)
def _no_launch():
    inline_verify._LAUNCH = None
    yield
    inline_verify._LAUNCH = None


def test_a_due_window_rides_in_the_next_decode_step_after_its_rows():
    rt, req, other = _rt(), _windowed(), _normal()
    running = _decode([other, req], [3, PROMPT + W])
    assert fold_pass.offer(rt, running, [req], prefill_coming=False)
    riders = rt.riders
    assert [(p, t) for _, p, t in riders.entries] == [(PROMPT + i, 10 + i) for i in range(W)]
    assert [i for _, i in riders.sampled[0]] == list(range(W)), "every entry is compared"
    inline_verify.plan_step(rt, running)
    step = inline_verify._LAUNCH
    assert step is not None and step.riders is riders and rt.riders is None
    assert step.eligible == [], "the riding request's KV is not exact: not inline itself"
    # the forward's logits: the step's 2 rows, then the W entries (row = its index here)
    logits = torch.arange(ROWS, dtype=torch.float32)[:, None].repeat(1, 3)
    fold_pass.keep(rt, riders, logits, 2, graphed=True, seconds=0.0)
    launched = riders.launched[0]
    assert launched.logits[:, 0].tolist() == [2.0, 3.0, 4.0, 5.0] and launched.graphed
    assert rt.folded is riders and rt.stats.folded_passes == 1 and rt.stats.fold_missed == 0


def test_a_step_carrying_riders_verifies_its_chained_rows_inline():
    """It runs at R rows anyway: a row whose KV is exact is inline whatever the pad ratio."""
    rt, req = _rt(pad_ratio=0.0), _windowed()
    chained = _windowed("c")
    chained._llm42.det.verify_prompt = True
    chained._llm42.exact_kv = 20
    running = _decode([req, chained], [PROMPT + W, 20])
    assert fold_pass.offer(rt, running, [req], prefill_coming=False)
    inline_verify.plan_step(rt, running)
    step = inline_verify._LAUNCH
    assert [i for i, _, _ in step.eligible] == [1] and chained._llm42.exact_kv == 21


@pytest.mark.parametrize("why", ["prefill coming", "no room", "flag off", "partial window"])
def test_a_round_is_not_offered_where_it_cannot_ride(why):
    """A partial window (a catch-up) would grow with the token of the step it rides in, before
    its decision: it runs as a pass now."""
    rt, req = _rt(fold=why != "flag off"), _windowed()
    if why == "partial window":
        req.output_ids.pop()
        req._llm42.det = DetRequestState("r", W, PROMPT, verify_prompt=False)
        req._llm42.det.on_first_token()
        req._llm42.det.append_candidates(W - 1)
    crowd = [_normal() for _ in range(ROWS - W + 1 if why == "no room" else 1)]
    running = _decode(crowd + [req], [3] * len(crowd) + [PROMPT + W])
    assert not fold_pass.offer(rt, running, [req], prefill_coming=why == "prefill coming")
    assert rt.riders is None


@pytest.mark.parametrize("why", ["prefill", "grew", "left", "row on an entry"])
def test_a_step_that_cannot_take_its_riders_misses_and_the_next_round_runs_as_a_pass(why):
    rt, req = _rt(), _windowed()
    position = PROMPT + W - 1 if why == "row on an entry" else PROMPT + W
    assert fold_pass.offer(rt, _decode([req], [PROMPT + W]), [req], prefill_coming=False)
    if why == "prefill":
        built = SimpleNamespace(reqs=[req], forward_mode=ForwardMode.EXTEND,
                                prefix_lens=[0], extend_lens=[1])
    elif why == "grew":
        built = _decode([_normal() for _ in range(ROWS - W + 1)] + [req],
                        [3] * (ROWS - W + 1) + [position])
    elif why == "left":
        built = _decode([_normal()], [3])
    else:
        built = _decode([req], [position])
    inline_verify.plan_step(rt, built)
    launch = inline_verify._LAUNCH
    assert launch is None or getattr(launch, "riders", None) is None
    assert rt.riders is None and rt.fold_missed and rt.stats.fold_missed == 1
    # the same jobs, due again at the next step: not offered, so they run as a pass
    assert not fold_pass.offer(rt, _decode([req], [PROMPT + W]), [req], prefill_coming=False)
    assert not rt.fold_missed, "one miss makes one pass"
    assert fold_pass.offer(rt, _decode([req], [PROMPT + W]), [req], prefill_coming=False)


def test_a_planned_step_with_riders_that_ran_otherwise_is_a_miss():
    rt, req = _rt(), _windowed()
    running = _decode([req], [PROMPT + W])
    assert fold_pass.offer(rt, running, [req], prefill_coming=False)
    from llm42.sglang import runtime

    runtime.RUNTIME, saved = rt, runtime.RUNTIME
    try:
        inline_verify.plan_step(rt, running)
        forward = SimpleNamespace(forward_mode=ForwardMode.EXTEND, batch_size=1)
        assert inline_verify.take_launch(forward) is None
    finally:
        runtime.RUNTIME = saved
    assert rt.fold_missed and rt.stats.fold_missed == 1 and rt.folded is None


def test_a_folded_round_is_decided_after_its_steps_result_for_the_requests_still_there(
        monkeypatch):
    """The next verify_due drains the step in flight first (its result may append candidates
    and the decision may roll them back), then decides each job whose request is still in the
    batch; a round whose requests all left is dropped unsampled."""
    from llm42.sglang import hooks_verify, in_flight, verify_passes

    rt, req, gone = _rt(), _windowed(), _windowed("g")
    order = []
    monkeypatch.setattr(in_flight, "in_flight", lambda scheduler: not order)
    monkeypatch.setattr(in_flight, "drain", lambda scheduler: order.append("drain"))
    monkeypatch.setattr(verify_passes, "sample_and_decide",
                        lambda rt, s, b, reqs, partial, plan, launched, folded: order.append(
                            list(reqs) if folded else "not folded"))
    rt.folded = fold_pass.Riders([req, gone], ["plan"], [], [[]], ["launched"])
    assert hooks_verify.decide_folded(rt, None, _decode([req], [PROMPT + W + 1])) == [req]
    assert order == ["drain", [req, None]] and rt.folded is None
    order.clear()
    rt.folded = fold_pass.Riders([gone], ["plan"], [], [[]], ["launched"])
    assert hooks_verify.decide_folded(rt, None, _decode([req], [PROMPT + W + 1])) == []
    assert order == ["drain"], "nothing left to decide: not sampled"
