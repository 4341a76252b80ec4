"""Per-iteration timeline of the scheduler loop: where the time between two decode steps goes.

One JSON line per scheduler iteration that launched a batch or verified something: when it began
(seconds since the timeline opened), when it launched its batch (`launch`, seconds after it
began) and how long it lasted (until the next iteration began), the kind and size of that batch,
and the verification passes that ran at its top, before the batch was built. Per-batch GPU
times would not answer the question: in SGLang's overlap loop an iteration launches one batch and
then processes the previous one's result, so what a running request waits between two of its
tokens is the sum of the iterations between two decode launches.
`benchmarks/timeline.py` turns the lines into that breakdown.

    timeline = StepTimeline("/tmp/tl/timeline-123.jsonl")
    timeline.begin(now)                    # top of an iteration (closes the previous one)
    timeline.observe_pass(8, 3, 0.024)     # a verification pass ran
    timeline.launched("decode", reqs=97, tokens=97, running=97, queued=4)
    timeline.observe_result("prefill", 0.006, 0.002)  # the previous batch's result processed

A record's `result_wait` is the host blocked on the GPU for a result (the batch it launched
before), `result_s` the host processing that result after: with `launch` they split an
iteration into GPU-bound and host-bound time, which `dt` alone cannot.
"""

from __future__ import annotations

import json
import time
from pathlib import Path


class StepTimeline:
    def __init__(self, path: str | Path, flush_every: int = 256, clock=time.perf_counter):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        self._flush_every = flush_every
        self._clock = clock
        self._t0 = clock()
        self._open: dict | None = None  # the running iteration's record
        self._pending: list[str] = []
        self.on_flush: list = []  # callables run after each flush (e.g. the sync sites' file)
        # name -> callable giving what was counted since its last call, for each record as it
        # closes (the diagnostics' syncs and hooks' time)
        self.per_record: dict = {}
        self.on_close: list = []  # callables given each record as it closes, counts included

    def add_counter(self, name: str, take) -> None:
        """Each record gets `name`: what `take()` counted since its last call. What it counted
        before the first record is nobody's, so it is dropped here."""
        take()
        self.per_record[name] = take

    def begin(self, now: float | None = None) -> None:
        """Top of a scheduler iteration: close the previous record, open a new one."""
        now = self._clock() if now is None else now
        self._close(now)
        self._open = {"t": round(now - self._t0, 6), "kind": None, "passes": 0, "rows": 0,
                      "prompt_rows": 0, "verify_s": 0.0, "drained": False, "overlapped": 0,
                      "folded": 0, "folded_s": 0.0, "folded_rows": 0, "inline": False,
                      "result_kind": None, "result_wait": 0.0, "result_s": 0.0}

    def observe_pass(self, num_real_rows: int, num_prompt_rows: int, seconds: float,
                     folded: bool = False) -> None:
        """`folded`: the decision of a pass that rode in the previous decode step
        (`--llm42-fold-passes`): its forward was that step's, only its sampling ran here
        (`folded_s`, apart from the passes' `verify_s`)."""
        rec = self._open
        if rec is not None:
            rec["folded" if folded else "passes"] += 1
            rec["rows"] += num_real_rows
            rec["prompt_rows"] += num_prompt_rows
            key = "folded_s" if folded else "verify_s"
            rec[key] = round(rec[key] + seconds, 6)

    def observe_fold(self, num_rows: int) -> None:
        """The batch this iteration launches carries `num_rows` rows of a folded pass."""
        if self._open is not None:
            self._open["folded_rows"] += num_rows

    def observe_inline(self) -> None:
        """The decode batch this iteration launches verifies deterministic rows inline (a
        row-invariant forward of R rows, `inline_verify`): not a plain step."""
        if self._open is not None:
            self._open["inline"] = True

    def observe_drain(self) -> None:
        """The overlap loop's in-flight result was processed early, before a pass."""
        if self._open is not None:
            self._open["drained"] = True

    def observe_result(self, kind: str, wait_s: float, process_s: float) -> None:
        """A batch result processed in this iteration: `wait_s` until its GPU work was done,
        then `process_s` on the host. `result_kind` names the last one (an early drain and the
        loop's own can both land in one iteration: their times add up)."""
        rec = self._open
        if rec is not None:
            rec["result_kind"] = kind
            rec["result_wait"] = round(rec["result_wait"] + wait_s, 6)
            rec["result_s"] = round(rec["result_s"] + process_s, 6)

    def observe_overlap(self, num_passes: int) -> None:
        """That result was processed while `num_passes` passes ran (--llm42-overlap-verify)."""
        if self._open is not None:
            self._open["overlapped"] += num_passes

    def launched(self, kind: str | None, *, reqs: int, tokens: int, running: int,
                 queued: int) -> None:
        """What the iteration launched (None: nothing, the loop is idle or waiting)."""
        rec = self._open
        if rec is None:
            return
        if kind is None and rec["passes"] == 0 and rec["folded"] == 0:
            self._open = None  # idle polling: not worth a line (and far too many of them)
            for value in self.per_record.values():
                value()  # nor is its share of the counts: the next record starts afresh
            self.flush()
            return
        rec.update(kind=kind, reqs=reqs, tokens=tokens, running=running, queued=queued,
                   launch=round(self._clock() - self._t0 - rec["t"], 6))

    def _close(self, now: float) -> None:
        rec, self._open = self._open, None
        if rec is None:
            return
        rec["dt"] = round(now - self._t0 - rec["t"], 6)
        for name, value in self.per_record.items():
            rec[name] = round(value(), 6)
        for call in self.on_close:
            call(rec)
        self._pending.append(json.dumps(rec, separators=(",", ":")))
        if len(self._pending) >= self._flush_every:
            self.flush()

    def event(self, name: str) -> None:
        """A marker line, e.g. "reset" when /reset_llm42_stats starts a benchmark run."""
        now = self._clock()
        self._close(now)
        self._pending.append(json.dumps({"t": round(now - self._t0, 6), "event": name}))
        self.flush()

    def flush(self) -> None:
        if self._pending:
            self._file.write("\n".join(self._pending) + "\n")
            self._pending.clear()
        self._file.flush()
        for hook in self.on_flush:
            hook()

    def close(self) -> None:
        self._close(self._clock())
        self.flush()
        self._file.close()
