"""Sends the planned requests (with their aborts) at a given concurrency; never raises.

    outcomes = asyncio.run(run_requests(url, plan.requests, concurrency=64, timeout_s=900))
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import aiohttp

from benchmarks.request_funcs import DONE, make_session, sse_payloads
from benchmarks.soak.plan import DetSpec, PlannedRequest, det_body
from benchmarks.soak.responses import Assembler, Outcome

PATHS = {"generate": "/generate", "completions": "/v1/completions",
         "chat": "/v1/chat/completions"}


async def _abort(session: aiohttp.ClientSession, url: str, out: Outcome) -> None:
    out.abort_sent = True
    try:
        async with session.post(url + "/abort_request", json={"rid": out.rid}) as r:
            out.abort_status = r.status
            await r.read()
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        out.error = out.error or f"/abort_request: {type(e).__name__}: {e}"


async def execute(session: aiohttp.ClientSession, url: str, req: PlannedRequest) -> Outcome:
    """Send one planned request (with its abort, if any); never raises."""
    out = Outcome(req.index, req.rid, req.endpoint, req.stream, req.spec_id, req.abort,
                  req.max_new_tokens)
    asm = Assembler(req.endpoint)
    t0 = time.perf_counter()
    abort_task = None
    if req.abort == "rid" and not req.stream:  # the answer comes in one piece: abort meanwhile
        abort_task = asyncio.create_task(_delayed_abort(session, url, out, req.abort_delay_s))
    try:
        async with session.post(url + PATHS[req.endpoint], json=req.body) as resp:
            out.status = resp.status
            if resp.status != 200:
                out.error = (await resp.text())[:500]
            elif not req.stream:
                asm.add_body(json.loads(await resp.read()))
            else:
                async for data in sse_payloads(resp.content):
                    if data == DONE:
                        out.stream_done = True
                        continue
                    chunk = json.loads(data)
                    if "error" in chunk:
                        err = chunk["error"] if isinstance(chunk["error"], dict) else {}
                        out.error_code = int(err.get("code") or 500)
                        out.error = str(err.get("message") or chunk["error"])[:500]
                        continue
                    asm.add_chunk(chunk)
                    out.chunks += 1
                    if req.abort and out.chunks == req.abort_after_chunks and not out.abort_sent:
                        if req.abort == "disconnect":
                            out.disconnected = True
                            resp.close()  # the connection, mid-stream
                            break
                        await _abort(session, url, out)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
        out.error = f"{type(e).__name__}: {e}"[:500]
    if abort_task is not None and not out.abort_sent:  # answered before the abort was due
        abort_task.cancel()
    if abort_task is not None:
        with contextlib.suppress(asyncio.CancelledError):
            await abort_task
    out.latency_s = round(time.perf_counter() - t0, 4)
    out.output = asm.output()
    out.rollbacks, out.retractions = asm.rollbacks, asm.retractions
    return out


async def _delayed_abort(session, url, out: Outcome, delay: float) -> None:
    await asyncio.sleep(delay)
    await _abort(session, url, out)


async def run_requests(url: str, requests_: list[PlannedRequest], concurrency: int,
                       timeout_s: float, progress: bool = False,
                       desc: str = "soak") -> list[Outcome]:
    """All requests, `concurrency` at a time, in plan order; outcomes in plan order."""
    from tqdm import tqdm

    results: list[Outcome | None] = [None] * len(requests_)
    it = iter(enumerate(requests_))
    counts = {"5xx": 0, "4xx": 0, "err": 0, "abort": 0}
    bar = tqdm(total=len(requests_), desc=desc, disable=not progress, smoothing=0.05)

    async def worker(session):
        for k, req in it:
            out = await execute(session, url, req)
            results[k] = out
            code = out.error_code or out.status or 0
            counts["5xx"] += code >= 500 or (out.abort_status or 0) >= 500
            counts["4xx"] += 400 <= code < 500
            counts["err"] += bool(out.error) and code < 400
            counts["abort"] += out.aborted
            bar.update(1)
            bar.set_postfix(counts, refresh=False)

    async with make_session(timeout_s) as session:
        await asyncio.gather(*(worker(session) for _ in range(max(1, concurrency))))
    bar.close()
    return results  # type: ignore[return-value]


async def take_references(url: str, specs: list[DetSpec], timeout_s: float,
                          tag: str) -> list[Outcome]:
    """Each spec alone on the server, one after the other, not streamed."""
    reqs = [PlannedRequest(-1 - s.spec_id, f"{tag}-{s.spec_id:04d}", s.endpoint, False,
                           s.spec_id, None, 0, 0.0,
                           det_body(s, stream=False, rid=f"{tag}-{s.spec_id:04d}"),
                           s.max_new_tokens) for s in specs]
    return await run_requests(url, reqs, 1, timeout_s)
