"""`inline_verify.plan_step`: which rows of a decode step are verified as they are made, and how
each deterministic row's exact-KV mark moves (the chain that makes an inline token verified)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from sglang.srt.model_executor.forward_batch_info import ForwardMode

from llm42.core.stats import Llm42Stats
from llm42.core.window import DetRequestState
from llm42.sglang import inline_prefill, inline_verify
from llm42.sglang.request_state import attach

PROMPT = 5  # prompt tokens of every request here
ROWS = 4  # R: rows of a row-invariant forward


def _req(exact_kv, det=True):
    req = SimpleNamespace(origin_input_ids=[1] * PROMPT, output_ids=[], rid="r",
                          finished=lambda: False)
    fields = attach(req, DetRequestState("r", 8, PROMPT, verify_prompt=True) if det else None)
    fields.exact_kv = exact_kv
    return req


def _batch(reqs, positions, mode=ForwardMode.DECODE):
    return SimpleNamespace(reqs=reqs, seq_lens_cpu=torch.tensor([p + 1 for p in positions]),
                           forward_mode=mode)


def _rt(pad_ratio: float, inline_prefill: bool = True):
    return SimpleNamespace(inline_verify=True, row_pass_rows=ROWS, stats=Llm42Stats(),
                           riders=None, folded=None, fold_missed=False,
                           config=SimpleNamespace(inline_pad_ratio=pad_ratio,
                                                  inline_prefill=inline_prefill,
                                                  fold_passes=True, window_size=8))


@pytest.fixture
def rt():
    """Every step of at most R rows is worth inline here (padding R - 1 per row at most)."""
    inline_verify._LAUNCH = None
    yield _rt(ROWS)
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
    forward = SimpleNamespace(forward_mode=ForwardMode.EXTEND, batch_size=1)
    assert inline_verify.take_launch(forward) is None  # an extend forward ran instead
    assert req._llm42.exact_kv is None and inline_verify._LAUNCH is None


def test_off_without_the_flag_or_outside_decode_and_prefill(rt):
    req = _req(3)
    off = _rt(ROWS)
    off.inline_verify = False
    inline_verify.plan_step(off, _batch([req], [3]))
    inline_verify.plan_step(rt, _batch([req], [3], mode=ForwardMode.IDLE))
    assert inline_verify._LAUNCH is None and req._llm42.exact_kv == 3


def _prompt_req(prompt_len: int, exact_kv=None, det=True, cached=0):
    req = _req(exact_kv, det=det)
    req.origin_input_ids = list(range(100, 100 + prompt_len))
    req.full_untruncated_fill_ids = list(req.origin_input_ids)
    if det:
        req._llm42.det = DetRequestState("r", 8, prompt_len, verify_prompt=True)
        req._llm42.det.use_cached_prompt(cached)
    return req


def _prefill(reqs, chunks, mode=ForwardMode.EXTEND):
    """A prefill batch; chunks: (start, end) of each request's extend."""
    return SimpleNamespace(reqs=reqs, forward_mode=mode, prefix_lens=[s for s, _ in chunks],
                           extend_lens=[e - s for s, e in chunks])


def test_a_prefill_runs_its_verified_prompts_rows_inline(rt):
    """Rows of a prompt whose KV before its chunk is exact: its chunk's tokens at their
    positions, o_0 predicted by the last one; a normal request and a deterministic one whose KV
    before its chunk is the fast path's are left out, and the latter's mark is forgotten."""
    fresh, normal, behind = _prompt_req(5), _prompt_req(3, det=False), _prompt_req(6, exact_kv=2)
    inline_verify.plan_step(rt, _prefill([normal, fresh, behind], [(0, 3), (0, 5), (3, 6)]))
    step = inline_verify._LAUNCH
    assert isinstance(step, inline_prefill.PrefillStep)
    assert [(p, t) for _, p, t in step.entries] == [(p, 100 + p) for p in range(5)]
    assert [(i, k) for i, _, k in step.eligible] == [(1, 0)] and step.positions == {1: 4}
    assert step.last_entries == [4] and [r for r, _, _ in step.claimed] == [fresh]
    assert fresh._llm42.exact_kv == 5 and behind._llm42.exact_kv is None
    forward = SimpleNamespace(forward_mode=ForwardMode.EXTEND, batch_size=3)
    assert inline_verify.take_launch(forward) is step and inline_verify._LAUNCH is None


def test_a_chunked_prompt_chains_its_chunks_and_only_the_last_predicts_o0(rt):
    req = _prompt_req(7, cached=0)
    inline_verify.plan_step(rt, _prefill([req], [(0, 4)]))
    first = inline_verify._LAUNCH
    assert len(first.entries) == 4 and first.eligible == [] and req._llm42.exact_kv == 4
    inline_verify._LAUNCH = None
    inline_verify.plan_step(rt, _prefill([req], [(4, 7)]))
    last = inline_verify._LAUNCH
    assert [p for _, p, _ in last.entries] == [4, 5, 6] and last.positions == {0: 6}
    assert req._llm42.exact_kv == 7


def test_a_verified_prefix_cache_match_starts_the_chain(rt):
    req = _prompt_req(20, cached=16)
    inline_verify.plan_step(rt, _prefill([req], [(16, 20)]))
    assert [p for _, p, _ in inline_verify._LAUNCH.entries] == [16, 17, 18, 19]


@pytest.mark.parametrize("case", ["flag off", "mixed batch", "o_0 exists", "not verified"])
def test_prompts_go_to_passes_where_inline_rows_do_not_apply(case):
    rt = _rt(ROWS, inline_prefill=case != "flag off")
    inline_verify._LAUNCH = None
    req = _prompt_req(5)
    if case == "o_0 exists":
        req._llm42.det.on_first_token()
    if case == "not verified":
        req._llm42.det.verify_prompt = False
    mode = ForwardMode.MIXED if case == "mixed batch" else ForwardMode.EXTEND
    inline_verify.plan_step(rt, _prefill([req], [(0, 5)], mode))
    assert inline_verify._LAUNCH is None and req._llm42.exact_kv is None


@pytest.mark.parametrize(("pad_ratio", "num_det", "inline"), [
    (1.0, 1, False),  # 4 rows, 2 of them padding for 1 deterministic row: passes are cheaper
    (1.0, 2, True),  # 2 padding rows for 2 deterministic rows
    (0.0, 2, False),  # only full steps
    (ROWS, 1, True),
])
def test_a_step_runs_inline_only_where_its_padding_is_worth_it(pad_ratio, num_det, inline):
    """R = 4, a step of 2 rows: R - N = 2 padding rows against pad_ratio x d. A declined step
    cuts its rows' chains, and no partial window is caught up for a batch that stays so."""
    rt = _rt(pad_ratio)
    inline_verify._LAUNCH = None
    reqs = [_req(7), _req(7, det=num_det == 2)]
    inline_verify.plan_step(rt, _batch(reqs, [7, 7]))
    assert (inline_verify._LAUNCH is not None) == inline
    assert reqs[0]._llm42.exact_kv == (8 if inline else 7)
    assert rt.stats.inline_declined_steps == int(not inline)
    inline_verify._LAUNCH = None
    state = reqs[0]._llm42.det
    state.on_first_token()
    state.apply(SimpleNamespace(new_num_verified=1, num_committed=1, new_num_output_tokens=1,
                                num_rejected=0, is_rollback=False))
    state.append_candidates(2)
    assert inline_verify.catching_up(rt, reqs[0], state, 2, num_det) == inline
    full = _rt(0.0)
    assert inline_verify.worth_inline(full, ROWS, 1) and not inline_verify.worth_inline(full, 3, 3)
    assert not inline_verify.worth_inline(_rt(100.0), ROWS + 1, ROWS + 1)
    assert not inline_verify.worth_inline(_rt(100.0), 1, 0)


def test_a_rolled_back_request_runs_inline_whatever_the_padding(rt):
    """A lone request (R - 1 padding rows) decodes as usual until a pass rolls one of its
    windows back: from then on its steps are inline, and its partial window is caught up."""
    thin = _rt(0.0)
    req, normal = _req(7), _req(None, det=False)
    inline_verify.plan_step(thin, _batch([req, normal], [7, 3]))
    assert inline_verify._LAUNCH is None and thin.stats.inline_declined_steps == 1
    assert inline_verify.chained_rows([req, normal]) == (1, False)
    req._llm42.rolled_back = True
    req._llm42.exact_kv = 7
    assert inline_verify.chained_rows([req, normal]) == (1, True)
    inline_verify.plan_step(thin, _batch([req, normal], [7, 3]))
    assert inline_verify._LAUNCH is not None and req._llm42.exact_kv == 8
    inline_verify._LAUNCH = None
    assert not inline_verify.worth_inline(thin, ROWS + 1, ROWS + 1, rolled_back=True)


@pytest.mark.parametrize("num_rows, device, can_run, graph_logits, own", [
    (ROWS, "cpu", False, False, True),  # exactly R rows: SGLang's own forward, graph or not
    (ROWS - 1, "cuda", True, True, True),  # the graph of R rows replays, padded by SGLang
    (ROWS - 2, "cuda", True, True, False),  # pads to the smaller captured size 2
    (ROWS - 1, "cuda", False, True, False),  # eager: the GEMMs would run at N rows
    (ROWS - 1, "cuda", True, False, False),  # fp32 logits recomputed from N rows after it
    (ROWS - 1, "cpu", True, True, False),
])
def test_a_step_runs_sglangs_own_forward_only_where_it_computes_r_rows(
        monkeypatch, num_rows, device, can_run, graph_logits, own):
    """A step that SGLang's decode graph pads to R rows is the row pass already; any step that
    would run a GEMM at another row count goes through `row_pass.forward_rows`."""
    from llm42.sglang import fp32_logits

    monkeypatch.setattr(fp32_logits, "logits_at_graph_rows", lambda n: graph_logits)
    runner = SimpleNamespace(capture_bs=[1, 2, ROWS], can_run_graph=lambda fb: can_run)
    model_runner = SimpleNamespace(device=device, decode_cuda_graph_runner=runner)
    forward_batch = SimpleNamespace(forward_mode=ForwardMode.DECODE)
    assert inline_verify.own_forward(model_runner, forward_batch, num_rows, ROWS) == own
    no_graph = SimpleNamespace(device=device, decode_cuda_graph_runner=None)
    assert inline_verify.own_forward(no_graph, forward_batch, num_rows, ROWS) == (
        num_rows == ROWS)
