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
