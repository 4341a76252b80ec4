"""`LLM42_START_GATE=PATH`: a server started early imports SGLang, then waits for PATH before
its subprocesses touch the GPU.

A server start on the H100 machine takes 100-130 s, about 50 of them Python imports in the
launcher and again in the spawned scheduler (docs/benchmarks.md). A benchmark call that compares
four servers in the device's 600 s spends a third of it importing. So the benchmark driver
(`--prestart-next`, `SGLangServer.prestart`) launches the next server while the current one
runs, gated, and creates PATH once the current one has stopped: the imports overlap the run, the
GPU work of the start (weights, KV pool, CUDA graphs) does not. SGLang's scheduler calls
`register` first thing, before any CUDA call; the launcher, whose work before it spawns the
scheduler touches no GPU memory, does not wait.

The gated processes are not pinned to other cores: pinning would also size the thread pools
that torch and OpenMP create at import by the narrow mask, so a prestarted server would not run
as a cold-started one does. Their imports take about two cores of the host's sixteen for ~50 s
of the current server's run.
"""

from __future__ import annotations

import os
import sys
import time

ENV = "LLM42_START_GATE"
POLL_S = 0.2
MAX_WAIT_S = 3600.0  # an orphan left by a killed driver must not wait for ever


def wait(is_main_process: bool) -> float:
    """In a gated SGLang subprocess, block until the gate opens; seconds waited (0 in the
    launcher or when not gated)."""
    path = os.environ.get(ENV)
    if not path or is_main_process:
        return 0.0
    t0 = time.monotonic()
    while not os.path.exists(path) and time.monotonic() - t0 < MAX_WAIT_S:
        time.sleep(POLL_S)
    waited = time.monotonic() - t0
    # SGLang's logging is not set up yet in this process; the server log gets it either way
    print(f"llm42: pid {os.getpid()} waited {waited:.1f} s at the start gate", file=sys.stderr,
          flush=True)
    return waited
