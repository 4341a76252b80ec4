"""`LLM42_SYNC_DEBUG=1` with `--llm42-timeline-dir`: where the scheduler process blocks on the GPU.

SGLang's overlap loop hides the host's work behind the GPU only while nothing on the host waits
for the GPU: one `.tolist()` of a CUDA tensor in a hook, or an op the WAR barrier fences behind
the forward just launched, and the host stalls until the forward ends. Such a stall shows in a
step timeline only as a longer iteration. torch's sync debug mode warns at every synchronizing
CUDA call; this module counts those warnings by the Python line that made the call and the
llm42 / SGLang frames around it, and writes the counts beside the timeline
(`syncs-<pid>.json`), so a baseline's sites and llm42's can be set side by side
(`benchmarks/timeline.py` tables them). Each iteration's record counts its own (`syncs`).

A diagnostic: every warning costs tens of microseconds, so runs with it on are not measurements.
Off (the default), nothing is installed. Without CUDA there is nothing to count.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from collections import Counter
from pathlib import Path

ENV = "LLM42_SYNC_DEBUG"
_MESSAGE = "called a synchronizing CUDA operation"
_CONTEXT_FRAMES = 4  # enclosing llm42 / sglang frames kept per site


class SyncSites:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.sites: Counter[str] = Counter()
        self.total = 0
        self._written = 0
        self._pending = 0  # since the last `take`

    def observe(self, filename: str, lineno: int, frame=None) -> None:
        """One synchronizing call made at `filename:lineno`; `frame`: the caller's frame, whose
        enclosing llm42 / SGLang functions name the site."""
        self.total += 1
        self._pending += 1
        self.sites[_site(filename, lineno, frame)] += 1

    def take(self) -> int:
        """Syncs since the last call (a timeline iteration's, `StepTimeline.add_counter`)."""
        count, self._pending = self._pending, 0
        return count

    def write(self) -> None:
        """Rewrite the file if a sync came since the last write (the timeline flushes at every
        idle poll)."""
        if self.total == self._written:
            return
        self._written = self.total
        body = {"total": self.total,
                "sites": [{"site": s, "count": n} for s, n in self.sites.most_common()]}
        self.path.write_text(json.dumps(body, indent=1))


def _short(filename: str) -> str:
    for root in ("/llm42/", "/sglang/"):
        if root in filename:
            return root.strip("/") + "/" + filename.rsplit(root, 1)[1]
    return filename.rsplit("/", 1)[-1]


def _site(filename: str, lineno: int, frame) -> str:
    chain = []
    while frame is not None and len(chain) < _CONTEXT_FRAMES:
        name = frame.f_code.co_filename
        if ("/llm42/" in name or "/sglang/" in name) and (
                name != filename or frame.f_lineno != lineno):
            chain.append(f"{frame.f_code.co_name} ({_short(name)}:{frame.f_lineno})")
        frame = frame.f_back
    return f"{_short(filename)}:{lineno}" + ("  <  " + "  <  ".join(chain) if chain else "")


def install(folder: str | Path) -> SyncSites | None:
    """With `LLM42_SYNC_DEBUG=1` and CUDA: turn torch's sync debug mode to warnings and count
    them. Other warnings go to the handler that was there."""
    if os.environ.get(ENV, "0") != "1":
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    sites = SyncSites(Path(folder) / f"syncs-{os.getpid()}.json")
    shown = warnings.showwarning

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if _MESSAGE not in str(message):
            return shown(message, category, filename, lineno, file, line)
        sites.observe(filename, lineno, sys._getframe(1))
        return None

    warnings.showwarning = showwarning
    warnings.filterwarnings("always", message=f".*{_MESSAGE}.*")
    torch.cuda.set_sync_debug_mode("warn")
    return sites
