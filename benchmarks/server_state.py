"""What a running SGLang server says about itself: JSON endpoints, load, llm42 counters.

    stats = llm42_stats(url)     # /llm42_stats, or None
    load = wait_idle(url, 300)   # {running, waiting, used_tokens} once nothing runs

Every function answers None (or a None status) instead of raising when the server does not
answer: the callers decide whether that is a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import requests


def get_json(url: str, timeout: float = 30.0) -> tuple[int | None, Any]:
    """(HTTP status, JSON body) of GET url; the body is None when it is not JSON, the status
    None when the server did not answer."""
    try:
        r = requests.get(url, timeout=timeout)
        is_json = r.headers.get("content-type", "").startswith("application/json")
        return r.status_code, (r.json() if is_json else None)
    except (requests.RequestException, ValueError):
        return None, None


def json_of(url: str, timeout: float = 30.0) -> Any:
    """The JSON body of a 200 answer to GET url, else None."""
    code, data = get_json(url, timeout)
    return data if code == 200 else None


def llm42_stats(url: str) -> dict | None:
    return json_of(url + "/llm42_stats")


def server_load(url: str) -> dict | None:
    """{running, waiting, used_tokens} summed over DP ranks (`/v1/loads`, else `/get_load`,
    which has no waiting requests and no KV figure)."""
    code, data = get_json(url + "/v1/loads")
    if code == 200 and isinstance(data, dict) and "loads" in data:
        loads = data["loads"]
        return {"running": sum(int(x.get("num_running_reqs", 0)) for x in loads),
                "waiting": sum(int(x.get("num_waiting_reqs", 0)) for x in loads),
                "used_tokens": sum(int(x.get("num_used_tokens", 0)) for x in loads)}
    code, data = get_json(url + "/get_load")
    if code == 200 and data is not None:
        loads = data if isinstance(data, list) else [data]
        return {"running": sum(int(x.get("num_reqs", 0)) for x in loads), "waiting": 0,
                "used_tokens": None}
    return None


def is_idle(load: dict | None) -> bool:
    return bool(load) and not load["running"] and not load["waiting"]


def wait_idle(url: str, timeout_s: float, unreachable_s: float = 30.0) -> dict | None:
    """The first load with nothing running or waiting, or the last one seen at the deadline;
    None once the server has not answered for `unreachable_s`."""
    deadline = time.monotonic() + timeout_s
    last_answer = time.monotonic()
    while True:
        load = server_load(url)
        now = time.monotonic()
        if load is None:
            if now - last_answer > unreachable_s:
                return None
        else:
            last_answer = now
            if is_idle(load):
                return load
        if now > deadline:
            return load
        time.sleep(0.25)


class LoadPoller:
    """Peak running/waiting requests and KV tokens in use while a run lasts (every 2 s): a gauge
    read only at the end of the run would miss them."""

    def __init__(self, url: str):
        self.url, self.peak = url, {"running": 0, "waiting": 0, "used_tokens": 0}
        self._stop = asyncio.Event()

    async def run(self) -> None:
        while not self._stop.is_set():
            load = await asyncio.to_thread(server_load, self.url)
            for k, v in (load or {}).items():
                if v is not None:
                    self.peak[k] = max(self.peak[k], v)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), 2.0)

    def stop(self) -> None:
        self._stop.set()
