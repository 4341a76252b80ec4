"""`--profile-steps`: one torch.profiler trace of a benchmark run's server at steady load.

A trigger thread polls the server's load and asks SGLang's /start_profile once the batch is full
and nothing waits (the steps a throughput number is made of), then `finish_profile` waits for the
trace and summarizes it with `benchmarks.step_profile`. Apart from the driver because nothing
here decides what runs: a profile that fails only warns.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

PROFILE_POLL_S = 0.5  # how often the trigger asks the server for its load
PROFILE_WAIT_S = 60.0  # after the client ends: the longest wait for the server's trace
PROFILE_STABLE_S = 2.0  # a trace whose size held this long is written


class ProfileTrigger(threading.Thread):
    """--profile-steps: polls GET /get_load every `poll_s`; the first time `running` or more
    requests run (SGLang's num_reqs less num_waiting_reqs, summed over its list) and none
    wait, it sleeps `settle_s` and POSTs /start_profile for `num_steps` forward steps into
    `folder` (SGLang stops its profiler by itself after them and writes *.trace.json.gz
    there). At most once; never raises: what goes wrong is printed."""

    def __init__(self, url: str, folder: Path, prefix: str, num_steps: int, running: int,
                 settle_s: float, poll_s: float | None = None):
        super().__init__(name="profile-trigger", daemon=True)
        self.url, self.folder, self.prefix = url.rstrip("/"), Path(folder), prefix
        self.num_steps, self.running, self.settle_s = num_steps, running, settle_s
        self.poll_s = PROFILE_POLL_S if poll_s is None else poll_s
        self.stopping = threading.Event()
        self.posted = False  # /start_profile asked (and not refused)
        self.load_seen: tuple[int, int] | None = None  # (running, waiting) when it fired

    def load(self) -> tuple[int, int]:
        import requests

        r = requests.get(self.url + "/get_load", timeout=10)
        r.raise_for_status()
        body = r.json()
        loads = body if isinstance(body, list) else [body]
        waiting = sum(int(d.get("num_waiting_reqs") or 0) for d in loads)
        return sum(int(d.get("num_reqs") or 0) for d in loads) - waiting, waiting

    def run(self) -> None:
        try:
            self._poll()
        except Exception as exc:  # noqa: BLE001 - never the run's failure
            print(f"[driver] warning: profile trigger: {exc!r}", flush=True)

    def _poll(self) -> None:
        failures = 0
        while not self.stopping.is_set():
            try:
                running, waiting = self.load()
            except Exception as exc:  # noqa: BLE001
                failures += 1
                if failures == 1:
                    print(f"[driver] warning: profile trigger: GET /get_load: {exc!r}",
                          flush=True)
            else:
                if running >= self.running and waiting == 0:
                    if not self.stopping.wait(self.settle_s):
                        self.load_seen = (running, waiting)
                        self.start_profile()
                    return
            self.stopping.wait(self.poll_s)

    def start_profile(self) -> None:
        import requests

        body = {"output_dir": str(self.folder), "num_steps": self.num_steps,
                "activities": ["CPU", "GPU"], "with_stack": True, "record_shapes": False,
                "profile_prefix": self.prefix}
        self.posted = True  # a timed-out request may still have started it: look for a trace
        try:
            r = requests.post(self.url + "/start_profile", json=body, timeout=60)
        except requests.RequestException as exc:
            print(f"[driver] warning: POST /start_profile: {exc!r}", flush=True)
            return
        if r.status_code != 200:
            self.posted = False
            print(f"[driver] warning: POST /start_profile: HTTP {r.status_code} "
                  f"{r.text[:300]!r}", flush=True)
            return
        print(f"[driver] profile: {self.num_steps} steps from {self.load_seen[0]} running "
              f"requests into {self.folder}", flush=True)

    def stop(self, timeout: float = 75.0) -> None:
        self.stopping.set()
        self.join(timeout)


def _trace_in(folder: Path) -> Path | None:
    traces = sorted(folder.glob("*.trace.json.gz"))
    return next((p for p in traces if "TP-0" in p.name), traces[0] if traces else None)


def finish_profile(trigger: ProfileTrigger, wait_s: float | None = None) -> dict | None:
    """After a run's client ended: stop the trigger; if it asked for a profile, wait (up to
    `wait_s`, default PROFILE_WAIT_S) for the server's trace to be complete (its size held
    PROFILE_STABLE_S and it reads), summarize it into profile.md / profile.json beside it and
    print one line. Only warns; the summary, or None."""
    from benchmarks import step_profile

    folder = trigger.folder
    try:
        trigger.stop()
        if not trigger.posted:
            print(f"[driver] profile {folder.name}: not taken (never {trigger.running}+ "
                  "running requests with none waiting)", flush=True)
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
            return None
        deadline = time.monotonic() + (PROFILE_WAIT_S if wait_s is None else wait_s)
        seen, since, problem = None, 0.0, "no *.trace.json.gz written"
        while True:
            trace = _trace_in(folder)
            if trace is not None:
                size = trace.stat().st_size
                if seen != (trace, size):
                    seen, since = (trace, size), time.monotonic()
                elif time.monotonic() - since >= PROFILE_STABLE_S:
                    try:
                        summary = step_profile.summarize(trace)
                    except (EOFError, OSError, ValueError) as exc:  # still being written
                        problem, since = f"{trace.name}: {exc!r}", time.monotonic()
                    else:
                        step_profile.write(summary, folder, trace.name)
                        print(f"[driver] profile {folder}: {step_profile.one_line(summary)}",
                              flush=True)
                        return summary
            if time.monotonic() >= deadline:
                break
            time.sleep(0.25)
        print(f"[driver] warning: profile {folder}: {problem} within the wait", flush=True)
        if trace is None:  # a profiler still waiting for its steps would refuse the next one
            import requests

            try:
                requests.post(trigger.url + "/stop_profile", timeout=30)
            except requests.RequestException:
                pass
    except Exception as exc:  # noqa: BLE001 - the benchmark rows matter more than the profile
        print(f"[driver] warning: profile {folder} not summarized: {exc!r}", flush=True)
    return None
