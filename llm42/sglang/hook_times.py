"""`LLM42_HOOK_TIMES=1` with `--llm42-timeline-dir`: each llm42 hook's own host time.

On the H100 an online prefill iteration is host-bound and llm42's launch of its forward takes
1.1 ms longer than plain SGLang's (`benchmarks/results/h100-2026-12-07-diagnostics`), but a step
timeline cannot say which hook spends it. With this variable set, `plugin.register` wraps every
hook it registers: an AROUND hook's time less the time inside SGLang's original, a BEFORE or
AFTER hook's whole time. The totals per hook go beside the timeline (`hooks-<pid>.json`) and each
iteration's record carries the sum of its own (`hook_s`), so a prefill iteration's share is read
directly (`benchmarks/timeline.py` tables both).

Work a hook starts itself is its own: a verification pass's forward, the rows an inline step
or prefill runs (even through a nested, separately counted ModelRunner.forward), fp32 logits
(on CPU their computation, on CUDA their launch). So compare plain fast-path iterations, as
the diagnostic is meant for.

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


def enabled() -> bool:
    return os.environ.get(ENV, "0") == "1"


def take() -> float:
    """Own hook seconds since the last call (a timeline iteration's)."""
    seconds, _PENDING[0] = _PENDING[0], 0.0
    return seconds


def timed(name: str, hook, around: bool):
    """`hook` counting its own time under `name`; `around`: it gets SGLang's original first."""
    record = TIMES.setdefault(name, [0, 0.0])
    clock = time.perf_counter

    def account(started: float, inner: float) -> None:
        own = clock() - started - inner
        record[0] += 1
        record[1] += own
        _PENDING[0] += own

    if around:
        def wrapper(original, *args, **kwargs):
            inner = 0.0

            def call(*a, **k):
                nonlocal inner
                t = clock()
                try:
                    return original(*a, **k)
                finally:
                    inner += clock() - t

            started = clock()
            try:
                return hook(call, *args, **kwargs)
            finally:
                account(started, inner)
    else:
        def wrapper(*args, **kwargs):
            started = clock()
            try:
                return hook(*args, **kwargs)
            finally:
                account(started, 0.0)
    return functools.update_wrapper(wrapper, hook)


_LAST_WRITE = [float("-inf")]


def write(path: str | Path, min_interval_s: float = 2.0) -> None:
    """The totals, at most every `min_interval_s` (the timeline flushes at every idle poll)."""
    now = time.monotonic()
    if now - _LAST_WRITE[0] < min_interval_s:
        return
    _LAST_WRITE[0] = now
    body = {name: {"calls": calls, "own_s": round(own, 6),
                   "own_us_per_call": round(1e6 * own / calls, 2) if calls else None}
            for name, (calls, own) in sorted(TIMES.items(), key=lambda kv: -kv[1][1])}
    Path(path).write_text(json.dumps(body, indent=1))
