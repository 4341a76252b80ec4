"""`LLM42_HOOK_TIMES=1` with `--llm42-timeline-dir`: each llm42 hook's own host time.

On the H100 an online prefill iteration is host-bound and llm42's launch of its forward takes
1.1 ms longer than plain SGLang's (`benchmarks/results/h100-2026-12-07-diagnostics`), but a step
timeline cannot say which hook spends it. With this variable set, `plugin.register` wraps every
hook it registers: an AROUND hook's time less the time inside SGLang's original, a BEFORE or
AFTER hook's whole time. The totals per hook go beside the timeline (`hooks-<pid>.json`) and each
iteration's record carries the sum of its own (`hook_s`), so a prefill iteration's share is read
directly (`benchmarks/timeline.py` tables both). The file also splits each hook's time by the
class of iteration it fell in (`iteration_class`: a plain decode step apart from one with a pass
or an inline verification), because the H100 run's totals mixed a plain step's 0.36 ms with the
passes' and inline steps' own forwards.

Work a hook starts itself is its own: a verification pass's forward, the rows an inline step
or prefill runs (even through a nested, separately counted ModelRunner.forward), fp32 logits
(on CPU their computation, on CUDA their launch). So compare plain fast-path iterations, as
the diagnostic is meant for.

A wait a hook does on behalf of something measured elsewhere is not its own: the step
timeline's wait for a result's GPU work inside `Scheduler.process_batch_result`'s hook, which
SGLang's processors would do next anyway, counted 4 ms a call as the hook's in the H100 run
(`benchmarks/results/h100-2026-12-08-prompt-rows`). Such a hook reports it with `not_own`.

Two clock reads and a closure per call. Off (the default), hooks are registered unwrapped.
"""

from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path

ENV = "LLM42_HOOK_TIMES"
TIMES: dict[str, list] = {}  # hook name -> [calls, own seconds]
_PENDING = [0.0]  # own seconds since the last `take`
_PENDING_BY_HOOK: dict[str, float] = {}  # the same, per hook
_TAKEN_BY_HOOK: dict[str, float] = {}  # what the last `take` took, per hook (for `attribute`)
# iteration class -> [iterations, {hook -> own seconds}]
BY_CLASS: dict[str, list] = {}
_NOT_OWN = [0.0]  # seconds hooks reported with `not_own`, ever (wrappers read the difference)


def enabled() -> bool:
    return os.environ.get(ENV, "0") == "1"


def take() -> float:
    """Own hook seconds since the last call (a timeline iteration's)."""
    global _PENDING_BY_HOOK, _TAKEN_BY_HOOK
    seconds, _PENDING[0] = _PENDING[0], 0.0
    _TAKEN_BY_HOOK, _PENDING_BY_HOOK = _PENDING_BY_HOOK, {}
    return seconds


def iteration_class(record: dict) -> str:
    """"decode", "decode inline", "decode pass", "prefill", ...: what a timeline record launched,
    and whether it also ran a pass (or a folded one's decision, or drained a result for one) or
    launched an inline verification."""
    cls = record.get("kind") or "none"
    if record.get("passes") or record.get("folded") or record.get("drained"):
        return cls + " pass"
    return cls + " inline" if record.get("inline") else cls


def attribute(record: dict) -> None:
    """`StepTimeline.on_close`: the hooks' time its counter just took goes to `record`'s class."""
    entry = BY_CLASS.setdefault(iteration_class(record), [0, {}])
    entry[0] += 1
    for name, seconds in _TAKEN_BY_HOOK.items():
        entry[1][name] = entry[1].get(name, 0.0) + seconds


def not_own(seconds: float) -> None:
    """Charge `seconds` of the running hook to no hook (a wait measured elsewhere)."""
    _NOT_OWN[0] += seconds


def timed(name: str, hook, around: bool):
    """`hook` counting its own time under `name`; `around`: it gets SGLang's original first."""
    record = TIMES.setdefault(name, [0, 0.0])
    clock = time.perf_counter

    def account(started: float, inner: float, not_own_before: float) -> None:
        own = clock() - started - inner - (_NOT_OWN[0] - not_own_before)
        record[0] += 1
        record[1] += own
        _PENDING[0] += own
        _PENDING_BY_HOOK[name] = _PENDING_BY_HOOK.get(name, 0.0) + own

    if around:
        def wrapper(original, *args, **kwargs):
            inner = 0.0

            def call(*a, **k):
                nonlocal inner
                t, reported = clock(), _NOT_OWN[0]
                try:
                    return original(*a, **k)
                finally:  # SGLang's time, less what hooks inside it reported (not counted twice)
                    inner += clock() - t - (_NOT_OWN[0] - reported)

            started, reported = clock(), _NOT_OWN[0]
            try:
                return hook(call, *args, **kwargs)
            finally:
                account(started, inner, reported)
    else:
        def wrapper(*args, **kwargs):
            started, reported = clock(), _NOT_OWN[0]
            try:
                return hook(*args, **kwargs)
            finally:
                account(started, 0.0, reported)
    return functools.update_wrapper(wrapper, hook)


_LAST_WRITE = [float("-inf")]
BY_ITERATION = "by_iteration"  # the file's key for the split by iteration class


def write(path: str | Path, min_interval_s: float = 2.0) -> None:
    """The totals, at most every `min_interval_s` (the timeline flushes at every idle poll)."""
    now = time.monotonic()
    if now - _LAST_WRITE[0] < min_interval_s:
        return
    _LAST_WRITE[0] = now
    body = {name: {"calls": calls, "own_s": round(own, 6),
                   "own_us_per_call": round(1e6 * own / calls, 2) if calls else None}
            for name, (calls, own) in sorted(TIMES.items(), key=lambda kv: -kv[1][1])}
    body[BY_ITERATION] = {
        cls: {"iterations": n, "own_us_per_iteration": {
            name: round(1e6 * own / n, 2)
            for name, own in sorted(hooks.items(), key=lambda kv: -kv[1]) if own > 0}}
        for cls, (n, hooks) in sorted(BY_CLASS.items())}
    Path(path).write_text(json.dumps(body, indent=1))
