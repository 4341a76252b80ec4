"""Streaming requests (`benchmarks/request_funcs.py`): TTFT and ITL when one chunk carries
several tokens.
"""

from __future__ import annotations

import pytest

from benchmarks.request_funcs import RequestOutput, _Timer


def test_timer_spreads_multi_token_chunks():
    out = RequestOutput(start_time=10.0)
    timer = _Timer(out)
    timer.observe(10.5, 1)  # first token: TTFT only
    timer.observe(10.6, 2)
    timer.observe(10.6, 2)  # no new token: ignored
    timer.observe(11.0, 6)  # a window of 4 tokens at once: 0.1 s each
    assert out.ttft == pytest.approx(0.5)
    assert out.itl == pytest.approx([0.1, 0.1, 0.1, 0.1, 0.1])


def test_a_speculative_servers_step_count_reaches_the_output():
    """SGLang puts a request's speculative steps (`spec_verify_ct`) into its last chunk's
    meta_info; the client keeps it for the run's accept length (tokens per step)."""
    import asyncio
    import json

    from aiohttp import web

    from benchmarks.metrics import spec_accept_length
    from benchmarks.request_funcs import RequestInput, make_session, send_request

    chunks = [{"text": "a", "meta_info": {"completion_tokens": 1}},
              {"text": "a b c d", "meta_info": {"completion_tokens": 4}},
              {"text": "a b c d e f", "meta_info": {"completion_tokens": 6, "spec_verify_ct": 4,
                                                    "spec_accept_length": 1.5}}]

    async def generate(request):
        response = web.StreamResponse()
        await response.prepare(request)
        for chunk in chunks:
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response

    async def run():
        app = web.Application()
        app.router.add_post("/generate", generate)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            async with make_session(30) as session:
                return await send_request(session, "sglang", f"http://127.0.0.1:{port}",
                                          RequestInput("hi", 1, 6, "m", 0.0, False, False))
        finally:
            await runner.cleanup()

    out = asyncio.run(run())
    assert out.success and out.output_len == 6, out.error
    assert out.meta == {"spec_verify_ct": 4}
    assert spec_accept_length([out]) == 1.5
