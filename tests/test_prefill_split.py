"""The prefill hook's split of SGLang's waiting queue (deterministic solo prefills apart from the
rest), on fake schedulers: it is O(queue) per scheduler step, so it is skipped exactly when
SGLang's `_get_new_batch_prefill_raw` would admit nothing anyway."""

from __future__ import annotations

import types

import pytest

from llm42.core.config import Llm42Config
from llm42.core.window import DetRequestState
from llm42.sglang import hooks_prefill, runtime
from llm42.sglang.request_state import attach


class Req:
    def __init__(self, name: str, det: bool, prompt_len: int):
        self.name, self.origin_input_ids = name, list(range(prompt_len))
        self.return_logprob, self.logprob_start_len = False, -1
        if det:
            attach(self, DetRequestState(rid=name, window_size=8, num_prompt_tokens=prompt_len))


class Unreadable:
    """A queued request the split must not look at."""

    @property
    def _llm42(self):
        raise AssertionError("the waiting queue was scanned")


class GrammarManager:
    """SGLang's grammar manager as the hook uses it: every queued grammar has compiled."""

    def __init__(self, ready):
        self.grammar_queue = list(ready)

    def has_waiting_grammars(self):
        return bool(self.grammar_queue)

    def get_ready_grammar_requests(self):
        ready, self.grammar_queue = self.grammar_queue, []
        return ready


def _scheduler(queue, *, full: bool, grammars=()):
    sched = types.SimpleNamespace(
        waiting_queue=list(queue), chunked_req=None, enable_priority_preemption=False,
        is_hybrid_swa=False, grammar_manager=GrammarManager(grammars),
        running_batch=types.SimpleNamespace(batch_is_full=full))
    sched._add_request_to_queue = sched.waiting_queue.append
    return sched


@pytest.fixture(autouse=True)
def llm42_runtime(monkeypatch):
    # prompts of 1,024 tokens or more prefill alone (the default threshold)
    monkeypatch.setattr(runtime, "RUNTIME", types.SimpleNamespace(
        config=Llm42Config(), prefer_det_prefill=True))


def _run(scheduler):
    seen = []

    def original(sched, prefill_delayer_single_pass=None, running_batch=None):
        assert not sched.grammar_manager.grammar_queue, "SGLang would admit grammars itself"
        seen.append([getattr(r, "name", "?") for r in sched.waiting_queue])
        return None, running_batch

    hooks_prefill.prefill_batch_hook(original, scheduler, prefill_delayer_single_pass=None,
                                       running_batch=scheduler.running_batch)
    return seen[0]


def test_a_full_running_batch_skips_the_split():
    queue = [Unreadable() for _ in range(3)]
    sched = _scheduler(queue, full=True)
    assert len(_run(sched)) == 3  # SGLang saw its own queue, and returns at once
    assert sched.waiting_queue == queue


def test_room_in_the_batch_shows_a_solo_prefill_alone_and_restores_the_queue():
    queue = [Req("normal", False, 20), Req("long-det", True, 2000), Req("short-det", True, 20)]
    sched = _scheduler(queue, full=False)
    assert _run(sched) == ["long-det"]  # deterministic solo prefills go first, one at a time
    assert [r.name for r in sched.waiting_queue] == ["normal", "long-det", "short-det"]


@pytest.mark.parametrize("case", ["grammar-ready", "preemption"])
def test_a_full_batch_that_sglang_may_still_change_takes_the_split(case):
    queue = [Req("normal", False, 20), Req("long-det", True, 2000)]
    sched = _scheduler(queue, full=True,
                       grammars=[Req("json", False, 20)] if case == "grammar-ready" else ())
    sched.enable_priority_preemption = case == "preemption"
    assert _run(sched) == ["long-det"]


def test_compiled_grammar_requests_join_the_queue_before_the_split():
    """A deterministic request whose grammar just compiled must prefill alone too: admitted by
    SGLang's original, it would join the batch the split built for the others."""
    queue = [Req("normal", False, 20)]
    sched = _scheduler(queue, full=False, grammars=[Req("long-det-json", True, 2000)])
    assert _run(sched) == ["long-det-json"]
    assert [r.name for r in sched.waiting_queue] == ["normal", "long-det-json"]
    assert sched.grammar_manager.grammar_queue == []


@pytest.mark.parametrize("verifier", ["row-invariant", "fixed-shape"])
def test_deterministic_prompts_share_their_own_batch_under_the_row_invariant_verifier(
        monkeypatch, verifier):
    """`--no-llm42-batched-prefill`: under the row-invariant verifier prompt rows give every
    prompt's KV and o_0 whatever its batch, so the waiting deterministic prompts share one batch
    with no normal request in it (its extend can then be skipped); a prompt asking for prompt
    logprobs, whose o_0 comes from its prefill, goes alone, in its turn. Fixed-shape: one a
    batch."""
    config = Llm42Config(verifier=verifier, batched_prefill=False)
    monkeypatch.setattr(runtime, "RUNTIME", types.SimpleNamespace(
        config=config, prefer_det_prefill=True))
    logprobs = Req("det-logprobs", True, 20)
    logprobs.return_logprob, logprobs.logprob_start_len = True, 0
    queue = [Req("normal", False, 20), Req("det-a", True, 20), Req("det-b", True, 2000),
             logprobs, Req("det-c", True, 30)]
    sched = _scheduler(queue, full=False)
    shared = verifier == "row-invariant"
    assert _run(sched) == (["det-a", "det-b", "det-c"] if shared else ["det-a"])
    assert _run(sched) == ["normal"]  # deterministic and normal batches alternate
    assert [r.name for r in sched.waiting_queue] == [r.name for r in queue]
    # once the others have prefilled, the one asking for prompt logprobs goes alone
    sched.waiting_queue = [logprobs, Req("det-d", True, 20)]
    assert _run(sched) == ["det-logprobs"]
