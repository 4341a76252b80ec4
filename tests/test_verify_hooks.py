"""The verify loop's adapter on small fakes: when rounds run (`hooks_verify.verify_due`), how a
decision is applied to a request (`verify_passes.apply_result`) and how finishes are deferred
(`hooks_lifecycle.update_finish_state_hook`). No model, no server: milliseconds."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from llm42.core import DetRequestState, Llm42Config, Llm42Stats, MismatchInjector, decide
from llm42.core.rank_ledger import DecisionLedger
from llm42.sglang import det_rows, hooks_lifecycle, hooks_verify, in_flight, runtime, verify_passes
from llm42.sglang.request_state import attach
from llm42.sglang.verifier import RowResult

W = 4
EOS = 0


class Req:
    """What the hooks read of SGLang's Req; `update_finish_state` runs through the llm42 hook
    as in a hooked server, and finishes on EOS or `max_new_tokens`."""

    def __init__(self, rid: str, outputs: list[int], verified: int, max_new_tokens: int = 99):
        self.rid, self.origin_input_ids = rid, [5, 6, 7]
        self.output_ids = list(outputs)
        self.max_new_tokens = max_new_tokens
        self.to_finish = self.finished_reason = self.finished_len = None
        self.req_pool_idx = None  # no KV: kv_rollback cuts only the lists
        self.return_logprob, self.logprob = False, None
        self.extra_key = f"llm42-det:{rid}"
        self.sampling_params = SimpleNamespace(temperature=1.0, top_p=1.0, top_k=1, min_p=0.0)
        state = DetRequestState(rid=rid, window_size=W, num_prompt_tokens=3,
                                num_verified_tokens=verified, num_output_tokens=len(outputs))
        self.state = attach(self, state).det

    def finished(self) -> bool:
        return self.finished_reason is not None

    def update_finish_state(self, new_accepted_len: int = 1):
        return hooks_lifecycle.update_finish_state_hook(_sglang_finish_check, self,
                                                        new_accepted_len)


def _sglang_finish_check(req, new_accepted_len=1):
    """SGLang's own check, reduced to EOS and length."""
    if req.to_finish is not None:
        req.finished_reason, req.finished_len = req.to_finish, len(req.output_ids)
    elif req.output_ids and req.output_ids[-1] == EOS:
        req.finished_reason, req.finished_len = "eos", len(req.output_ids)
    elif len(req.output_ids) >= req.max_new_tokens:
        req.finished_reason, req.finished_len = "length", req.max_new_tokens


@pytest.fixture
def rt(monkeypatch):
    handled = []
    scheduler = SimpleNamespace(
        running_batch=None, chunked_req=None, waiting_queue=[], max_running_requests=8,
        enable_overlap=False, streamed=[],
        batch_result_processor=SimpleNamespace(
            _handle_finish_state_updated_req=lambda req, batch, *a: handled.append(req),
            output_streamer=SimpleNamespace(
                stream_output=lambda reqs, logprob: scheduler.streamed.append(list(reqs)))))
    fake = SimpleNamespace(
        scheduler=scheduler, config=Llm42Config(window_size=W, verify_batch_size=2,
                                                max_verify_wait=2),
        decode_step=10, stats=Llm42Stats(), metrics=None, vocab_size=50,
        injector=MismatchInjector(0.0, 0), handled=handled, ledger=DecisionLedger(),
        riders=None, folded=None, fold_missed=False)
    monkeypatch.setattr(runtime, "RUNTIME", fake)
    monkeypatch.setattr(runtime, "TIMELINE", None)
    return fake


# ---------------------------------------------------------------- update_finish_state_hook


@pytest.mark.parametrize(("outputs", "verified", "new", "finished", "deferred"), [
    ([4, 4], 1, [EOS], False, ("eos", 3)),  # EOS on a candidate: withheld until verified
    ([4, 4], 1, [9], False, None),  # no finish: decode on
    ([], 0, [EOS], True, None),  # o_0 of a solo prefill is verified: its EOS stands
])
def test_a_finish_waits_for_the_tokens_that_caused_it(rt, outputs, verified, new, finished,
                                                      deferred):
    req = Req("r", outputs, verified)
    req.output_ids += new
    req.update_finish_state()
    assert req.finished() is finished
    assert req.state.deferred_finish == deferred
    assert req.state.num_output_tokens == len(outputs) + len(new), "new tokens counted"


def test_a_deferred_request_drops_what_the_overlap_loop_decoded_past_its_finish(rt):
    rt.scheduler.running_batch = SimpleNamespace(reqs=[])
    req = Req("r", [4, 4], 1)
    req.output_ids.append(EOS)
    req.update_finish_state()
    req.output_ids.append(8)  # the batch launched before the finish was seen
    req.update_finish_state()
    assert req.output_ids == [4, 4, EOS] and not req.finished()
    assert req.state.num_output_tokens == 3 and req.state.is_finishing


def test_an_abort_drops_the_candidates_and_finishes_at_once(rt):
    req = Req("r", [4, 4, 4], 1)
    req.output_ids.append(EOS)
    req.update_finish_state()  # deferred
    req.to_finish = "abort"
    req.update_finish_state()
    assert req.finished_reason == "abort" and req.output_ids == [4]
    assert req.state.num_output_tokens == 1 and not req.state.is_finishing


# ---------------------------------------------------------------- apply_result


def _result(verifier_ids: list[int], logprobs: list[float] | None = None) -> RowResult:
    return RowResult(token_ids=verifier_ids, logprobs=logprobs, top_logprobs_val=None,
                     top_logprobs_idx=None)


def _apply(rt, req, verifier_ids, logprobs=None):
    batch = SimpleNamespace(reqs=[SimpleNamespace(), req])
    verify_passes.apply_result(rt, rt.scheduler, batch, req, _result(verifier_ids, logprobs))


def test_an_accept_of_the_last_candidates_releases_the_deferred_finish(rt):
    req = Req("r", [4, 4, 4], 1)
    req.output_ids.append(EOS)
    req.update_finish_state()
    _apply(rt, req, [4, 4, EOS])  # window 0: entries predict o_1..o_3
    assert (req.finished_reason, req.finished_len) == ("eos", 4)
    assert rt.handled == [req] and rt.stats.snapshot()["det_requests_finished"] == 1


def test_an_accept_with_candidates_past_the_window_keeps_the_finish_deferred(rt):
    req = Req("r", [4, 4, 4, 4, 4, 4], 1, max_new_tokens=7)
    req.output_ids.append(4)
    req.update_finish_state()  # length 7 reached on a candidate of window 1
    _apply(rt, req, [4, 4, 4, 4])  # window 0 accepted: o_5, o_6 still candidates
    assert not req.finished() and req.state.is_finishing and rt.handled == []
    assert req.state.num_verified_tokens == 5


@pytest.mark.parametrize(("corrected", "finished"), [
    (EOS, True),  # the verifier's token is EOS: the request finishes on it
    (9, False),  # the EOS was rolled back: decode on
])
def test_a_rollback_rechecks_the_finish_on_the_corrected_token(rt, corrected, finished):
    req = Req("r", [4, 4, 4], 1)
    req.output_ids.append(EOS)
    req.update_finish_state()
    _apply(rt, req, [4, corrected, 3])  # mismatch at o_2
    assert req.output_ids == [4, 4, corrected]
    assert (req.state.num_verified_tokens, req.state.num_output_tokens) == (3, 3)
    assert req.finished() is finished and not req.state.is_finishing
    assert rt.stats.snapshot()["rollbacks"] == 1


def test_verified_tokens_carry_the_verifiers_logprobs(rt):
    req = Req("r", [4, 4, 4, 4, 4], 1)
    req.return_logprob = True
    req.logprob = SimpleNamespace(output_token_logprobs_val=[-9.0] * 5,
                                  output_token_logprobs_idx=[4] * 5, top_logprobs_num=0)
    _apply(rt, req, [4, 4, 7, 4], logprobs=[-0.1, -0.2, -0.3, -0.4])
    assert req.output_ids == [4, 4, 4, 7], "entry j predicts o_(1+j): mismatch at o_3"
    assert req.logprob.output_token_logprobs_val == [-9.0, -0.1, -0.2, -0.3], "the verifier's"
    assert req.logprob.output_token_logprobs_idx == [4, 4, 4, 7]


# ---------------------------------------------------------------- verify_due


@pytest.fixture
def rounds(monkeypatch):
    """Replaces the passes: every job of a round is accepted as it is."""
    seen = []

    def run_round(rt, scheduler, batch, reqs, overlap=False):
        seen.append(([r.rid for r in reqs], overlap))
        for req in reqs:
            decision = decide(req.state, req.output_ids, [1] * W, skip_compare=True)
            req.state.apply(decision)

    monkeypatch.setattr(verify_passes, "run_round", run_round)
    return seen


def _batch(*reqs):
    return SimpleNamespace(reqs=list(reqs), return_logprob=False)


def test_a_lone_full_window_waits_for_a_mate_then_runs_when_its_wait_is_up(rt, rounds):
    full, short = Req("full", [4] * 5, 1), Req("short", [4] * 3, 1)
    hooks_verify.verify_due(rt, rt.scheduler, _batch(full, short))
    assert rounds == [] and full.state.ready_since_step == 10, "1 row of B = 2: it waits"
    assert short.state.ready_since_step is None, "not ready: not stamped"
    rt.decode_step = 12  # max verify wait 2
    hooks_verify.verify_due(rt, rt.scheduler, _batch(full, short))
    assert rounds == [(["full"], False)] and rt.scheduler.streamed == [[full]]
    assert full.state.ready_since_step is None and full.state.num_verified_tokens == 5


def test_folded_passes_hold_a_round_while_a_prefill_comes(rt, rounds):
    """With folded passes a due round is offered to the next decode step instead of run; while
    a prefill comes it waits (no pass in the prefill's gap) until overdue, then runs as a pass.
    Without them, it runs at once."""
    rt.config = Llm42Config(window_size=W, verifier="row-invariant", fold_passes=True)  # wait 0
    rt.inline_verify, rt.row_pass_rows = True, 16
    a = Req("a", [4] * 5, 1)
    rt.scheduler.waiting_queue = ["a prompt"]
    hooks_verify.verify_due(rt, rt.scheduler, _batch(a))
    assert rounds == [] and rt.riders is None, "held while the prefill comes"
    rt.scheduler.waiting_queue = []
    hooks_verify.verify_due(rt, rt.scheduler, _batch(a))
    assert rounds == [] and rt.riders.reqs == [a], "offered to the decode step after it"
    rt.riders = None
    rt.scheduler.waiting_queue = ["another"]
    rt.decode_step += 1  # overdue: a pass, prefill or not
    hooks_verify.verify_due(rt, rt.scheduler, _batch(a))
    assert rounds == [(["a"], False)] and rt.riders is None
    b = Req("b", [4] * 5, 1)
    rt.config = replace(rt.config, fold_passes=False)
    rt.scheduler.waiting_queue = []
    hooks_verify.verify_due(rt, rt.scheduler, _batch(b))
    assert rounds[1:] == [(["b"], False)], "passes apart: at once"


def test_a_full_pass_and_a_finish_run_at_once(rt, rounds):
    """--llm42-max-finish-wait 0: a window a finish waits on is verified the step it is seen;
    by default (W // 4, 1 step here) it waits that long for a shared pass."""
    a, b = Req("a", [4] * 5, 1), Req("b", [4] * 5, 1)
    hooks_verify.verify_due(rt, rt.scheduler, _batch(a, b))
    assert rounds == [(["a", "b"], False)], "two rows fill B = 2: no reason to wait"
    c = Req("c", [4, 4], 1)
    c.output_ids.append(EOS)
    c.update_finish_state()
    hooks_verify.verify_due(rt, rt.scheduler, _batch(a, b, c))
    assert rounds[1:] == [], "the default finish wait: it waits for a shared pass"
    rt.decode_step += 1
    hooks_verify.verify_due(rt, rt.scheduler, _batch(a, b, c))
    assert rounds[1] == (["c"], False), "waited W // 4 steps: due"
    d = Req("d", [4, 4], 1)
    d.output_ids.append(EOS)
    d.update_finish_state()
    rt.config = replace(rt.config, max_finish_wait=0)
    hooks_verify.verify_due(rt, rt.scheduler, _batch(a, b, d))
    assert rounds[2] == (["d"], False), "a finish waits on it: urgent"


def test_a_result_in_flight_is_processed_before_the_round(rt, rounds, monkeypatch):
    """--no-llm42-overlap-verify: the in-flight result is processed first, whatever the jobs."""
    rt.config = replace(rt.config, overlap_verify=False)
    rt.scheduler.enable_overlap = True
    a, b = Req("a", [4] * 5, 1), Req("b", [4] * 5, 1)
    drained = []

    def drain(scheduler):  # the in-flight step appended a candidate to each
        drained.append(True)
        for req in (a, b):
            req.output_ids.append(4)
            req.state.append_candidates(1)
        rt.scheduler.result_queue[0] = (None, in_flight.DRAINED)

    rt.scheduler.result_queue = [(None, object())]
    monkeypatch.setattr(in_flight, "drain", drain)
    hooks_verify.verify_due(rt, rt.scheduler, _batch(a, b))
    assert drained == [True] and rounds == [(["a", "b"], False)]
    assert a.state.num_verified_tokens == 5 and a.state.num_output_tokens == 6


def test_overlap_verify_runs_fixed_ranges_while_the_result_is_in_flight(rt, rounds):
    rt.config = Llm42Config(window_size=W, verify_batch_size=2, max_verify_wait=2,
                            overlap_verify=True)
    rt.scheduler.enable_overlap = True
    rt.scheduler.result_queue = [(None, object())]
    a, b = Req("a", [4] * 5, 1), Req("b", [4] * 5, 1)
    hooks_verify.verify_due(rt, rt.scheduler, _batch(a, b))
    assert rounds == [(["a", "b"], True)], "full windows: the passes may go first"


def test_overlap_verify_runs_a_finishing_partial_window_while_the_result_is_in_flight(
        rt, rounds):
    """The in-flight step decoded one token past the withheld finish, which is dropped when its
    result is processed: the partial window's compared range is fixed, so its pass may go
    first too (overlap-verify is the default). Finish wait 0: it is due the step it is seen."""
    rt.config = replace(rt.config, max_finish_wait=0)
    rt.scheduler.enable_overlap = True
    rt.scheduler.result_queue = [(None, object())]
    req = Req("f", [4, 4], 1)
    req.output_ids.append(EOS)
    req.update_finish_state()  # EOS on a candidate: withheld, the window partial (3 of 4)
    assert req.state.is_finishing and req.state.num_output_tokens < req.state.window_end
    hooks_verify.verify_due(rt, rt.scheduler, _batch(req))
    assert rounds == [(["f"], True)], "no drain first"


def test_a_pass_cap_runs_one_round_per_step(rt, rounds):
    rt.config = Llm42Config(window_size=W, verify_batch_size=1, max_verify_wait=0,
                            max_passes_per_step=1)
    reqs = [Req(f"r{i}", [4] * 9, 1) for i in range(2)]  # two full windows each
    hooks_verify.verify_due(rt, rt.scheduler, _batch(*reqs))
    assert rounds == [(["r0"], False)], "one pass this step; r1 waits its turn"


def test_only_deterministic_requests_with_penalties_or_processors_need_fed_outputs():
    """The overlap loop processes the in-flight result first only for a deterministic request
    whose logits read its past outputs (penalties, a custom processor); the scan looks at the
    deterministic requests alone (`request_state.deterministic`), so a normal request with a
    penalty, or a plain one, never forces it."""
    from llm42.sglang.request_state import deterministic

    def req(det: bool, penalty: float = 0.0, processor=None):
        sampling = SimpleNamespace(frequency_penalty=penalty, presence_penalty=0.0,
                                   repetition_penalty=1.0)
        r = SimpleNamespace(sampling_params=sampling, custom_logit_processor=processor)
        attach(r, DetRequestState(rid="d", window_size=W, num_prompt_tokens=3) if det else None)
        return r

    plain, normal_penalty = req(True), req(False, penalty=0.5)
    bare = SimpleNamespace(sampling_params=None)  # never attached: not deterministic
    assert deterministic([normal_penalty, plain, bare]) == [plain]
    assert not in_flight.needs_fed_outputs([plain, normal_penalty, bare])
    assert in_flight.needs_fed_outputs([normal_penalty, req(True, penalty=0.5)])
    assert in_flight.needs_fed_outputs([req(True, processor="p"), plain])
    # the batch's per-row flags (the Sampler's, aligned with its requests) are read instead of
    # the requests where they have the batch's length; another length: the requests are read
    penalized = req(True, penalty=0.5)
    assert deterministic([normal_penalty, plain, bare], [False, False, True]) == [bare]
    assert deterministic([normal_penalty, plain, bare], [True]) == [plain]
    assert not in_flight.needs_fed_outputs([penalized, plain], [False, True])
    assert in_flight.needs_fed_outputs([penalized, plain], [True, True])
    batch = SimpleNamespace(reqs=[plain], sampling_info=SimpleNamespace(llm42_det_rows=[True]))
    assert det_rows.of_batch(batch) == [True] and det_rows.of_batch(_batch(plain)) is None


def test_finish_hook_is_bound_on_deterministic_requests_only(monkeypatch):
    """`around_det_req` (patches/): Req.update_finish_state goes through llm42's hook for a
    deterministic request, bound when it is created, and stays SGLang's own method for every
    other request (no per-request wrapper on a host-bound decode step)."""
    from llm42.sglang import plugin

    class SGLangReq:
        def update_finish_state(self, new_accepted_len: int = 1):
            return ("sglang", new_accepted_len)

    def hook(original, req, new_accepted_len=1):
        return ("llm42", original(req, new_accepted_len))

    monkeypatch.setattr(plugin, "DET_REQUEST_HOOKS", [("update_finish_state", hook)])
    det, normal = SGLangReq(), SGLangReq()
    hooks_lifecycle._bind_det_request_hooks(det)
    assert det.update_finish_state() == ("llm42", ("sglang", 1))
    assert det.update_finish_state(3) == det.update_finish_state(new_accepted_len=3) == (
        "llm42", ("sglang", 3))
    assert normal.update_finish_state(2) == ("sglang", 2)
    assert "update_finish_state" not in vars(normal)
