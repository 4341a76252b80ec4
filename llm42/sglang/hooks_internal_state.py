"""llm42's statistics and benchmark-mode switches over SGLang's internal-state RPC (scheduler
side; the HTTP routes are in `endpoints`, in the tokenizer process)."""

from __future__ import annotations

from llm42.sglang import runtime, tp_share
from llm42.sglang.keys import MODE_KEY, RESET_KEY
from llm42.sglang.request_state import det_state


def get_internal_state_hook(result, scheduler, *args, **kwargs):
    rt = runtime.RUNTIME
    if rt is None:
        result.internal_state["llm42"] = {"enabled": False, "timeline": runtime.timeline_path()}
        return result
    snap = rt.snapshot()
    snap["rank_ledgers"] = tp_share.gather_ledgers(scheduler, rt.ledger_entry())
    result.internal_state["llm42"] = snap
    return result


def set_internal_state_hook(original, scheduler, recv_req):
    """AROUND Scheduler.set_internal_state: llm42's own keys (from its endpoints, or from
    SGLang's /set_internal_state, hence the gate is checked here too); others go to SGLang."""
    args = recv_req.server_args or {}
    if RESET_KEY not in args and MODE_KEY not in args:
        return original(scheduler, recv_req)
    from sglang.srt.managers.io_struct import SetInternalStateReqOutput

    rt, timeline = runtime.RUNTIME, runtime.TIMELINE
    if MODE_KEY in args:
        return SetInternalStateReqOutput(updated=rt is not None and rt.switch_benchmark_mode(
            args[MODE_KEY], num_det_in_flight(scheduler)))
    if rt is not None:
        rt.stats.reset()
        rt.ledger.reset()
    if timeline is not None:
        timeline.event("reset")
    return SetInternalStateReqOutput(updated=rt is not None or timeline is not None)


def num_det_in_flight(scheduler) -> int:
    """Unfinished deterministic requests anywhere in this scheduler: waiting (retracted ones
    included), in a grammar's queue, prefilling in chunks, running, or in a batch whose result
    is still in flight (overlap loop). A request the scheduler has not received yet is not in
    flight: it is created after the switch, with the new window."""
    reqs = list(scheduler.waiting_queue)
    grammars = getattr(scheduler, "grammar_manager", None)
    reqs += list(getattr(grammars, "grammar_queue", None) or [])
    reqs.append(scheduler.chunked_req)
    batches = [scheduler.running_batch, getattr(scheduler, "last_batch", None)]
    batches += [batch for batch, _ in getattr(scheduler, "result_queue", None) or []]
    for batch in batches:
        reqs += list(getattr(batch, "reqs", None) or [])
    live = {id(r) for r in reqs if r is not None and det_state(r) is not None and not r.finished()}
    return len(live)
