"""The output-streamer hook on fake requests: what a deterministic request may stream."""

from __future__ import annotations

from array import array
from types import SimpleNamespace

import pytest

from llm42.core import DetRequestState
from llm42.sglang.hooks_output import stream_accept_hook
from llm42.sglang.request_state import Llm42Req


def _req(verified: int, outputs: list[int], logprobs: list[float], finished: bool):
    state = DetRequestState(rid="r", window_size=4, num_prompt_tokens=3, verify_prompt=True,
                            num_verified_tokens=verified, num_output_tokens=len(outputs))
    lp = SimpleNamespace(output_token_logprobs_val=list(logprobs),
                         output_token_logprobs_idx=list(outputs[: len(logprobs)]))
    return SimpleNamespace(_llm42=Llm42Req(det=state), output_ids=array("q", outputs), logprob=lp,
                           finished=lambda: finished)


def _accept(req) -> bool:
    seen = []
    stream_accept_hook(lambda acc, *, req: seen.append(req), object(), req=req)
    return bool(seen)


@pytest.mark.parametrize(("verified", "outputs", "streams"), [
    (0, [5], False),  # prompt pass pending: o_0 and its logprob are fast-path values
    (0, [], False),  # restarted after a retraction, nothing regenerated yet
    (1, [5, 6], True),  # o_0 verified: SGLang streams, showing only verified tokens
])
def test_unfinished_requests_stream_only_once_something_is_verified(verified, outputs, streams):
    assert _accept(_req(verified, outputs, [-0.5] * len(outputs), finished=False)) == streams


def test_aborted_before_any_verification_finishes_without_logprobs():
    # The abort cut the output to nothing; SGLang then appended the fast-path token's logprob.
    req = _req(0, [], [-0.25], finished=True)
    assert _accept(req), "a finished request must always reach the client"
    assert req.logprob.output_token_logprobs_val == []
    assert req.logprob.output_token_logprobs_idx == []


def test_normal_requests_pass_through():
    req = SimpleNamespace(output_ids=array("q", [1]), finished=lambda: False)
    assert _accept(req)


def test_counters_attach_to_the_finishing_output_only():
    req = _req(2, [5, 6], [-0.5, -0.5], finished=False)
    req._llm42.det.num_verify_passes = 3
    _accept(req)
    assert req.customized_info is None, "an unfinished step carries no counters"
    req.finished = lambda: True
    _accept(req)
    info = req.customized_info
    assert info["llm42_verify_passes"][0:2] == [3, 3]  # SGLang slices it per token
    assert info["llm42_rollbacks"][1] == 0


def test_collapse_keeps_a_deterministic_requests_counters_and_drops_a_normal_ones():
    from llm42.sglang.endpoints import _collapse

    det = {"meta_info": {"llm42_verify_passes": [None, 4], "llm42_rollbacks": [1]}}
    normal = {"meta_info": {"llm42_verify_passes": [None, None], "id": "x"}}
    _collapse(det)
    _collapse(normal)
    assert det["meta_info"] == {"llm42_verify_passes": 4, "llm42_rollbacks": 1}
    assert normal["meta_info"] == {"id": "x"}
