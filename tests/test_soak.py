"""Load soak (issue 6): the short version against the session's fault-injecting server, and fast
tests of the soak's plan, response assembly and comparisons (no server).

The full 2,000-request soak is `make soak` (benchmarks/soak/, results in
benchmarks/results/cpu-soak/). No retries anywhere, no timing assertions.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from benchmarks.soak.check import evaluate
from benchmarks.soak.compare import chat_stream_upstream_diffs, compare_full, compare_prefix
from benchmarks.soak.plan import ENDPOINTS, SoakConfig, build_plan, det_body
from benchmarks.soak.report import figures_table, markdown
from benchmarks.soak.responses import Assembler, Outcome
from benchmarks.soak.run import run_soak

# Aborts at 10 % (not the full soak's 5 %) so that a short run still aborts over a dozen requests.
CI_SOAK = SoakConfig(num_requests=150, det_fraction=0.3, abort_fraction=0.1, concurrency=32,
                     seed=11, min_new_tokens=4, max_new_tokens=16, pool_size=6, recheck=2,
                     drain_timeout=300.0, progress=False, run_tag="ci-soak")


@pytest.mark.server
def test_short_soak_on_the_injecting_server(inject_server):
    """150 mixed requests (30 % deterministic, 10 % aborted) at concurrency 32 on the server
    with fault injection 0.5: no 5xx/4xx/transport error, every completed deterministic request
    identical to its solo reference, aborted ones a prefix of it, nothing leaked, rechecks equal.
    """
    result = run_soak(inject_server.url, CI_SOAK, server=inject_server, log=print)
    f = result.figures
    print(figures_table(f))
    assert result.passed, "soak failures:\n" + "\n".join(result.failures[:40])
    assert f["status_5xx"] == 0 and f["status_4xx"] == 0 and f["transport_errors"] == 0
    assert f["leaks"] == 0 and f["kv_used_tokens_at_idle"] == 0
    assert f["completed"] + f["aborted"] == f["requests"] == CI_SOAK.num_requests
    assert f["det_mismatched"] == 0 and f["det_identical"] == f["det_completed"] > 0
    assert f["recheck_identical"] == f["recheck"] == CI_SOAK.recheck
    # the soak really exercised what it claims to check
    assert f["aborted"] > 0 and f["abort_attempts"] > 0
    assert f["rollbacks"] > 0 and f["injected_mismatches"] > 0 and f["verify_passes"] > 0
    assert f["inconsistent_tokens"] == 0
    assert all(n > 0 for n in f["by_endpoint"].values())


@pytest.mark.slow
@pytest.mark.server
def test_full_soak(tmp_path):
    """The full soak of `make soak` (defaults: 2,000 requests at concurrency 64, its own server
    with fault injection 0.2); not in CI (`-m "not slow"`), several minutes on 2 cores."""
    from benchmarks.soak.cli import main

    assert main(["--launch", "--out-dir", str(tmp_path), "--no-progress"]) == 0


# -- plan --------------------------------------------------------------------------------------
def test_plan_is_seeded_and_covers_the_mix():
    cfg = SoakConfig(num_requests=400, seed=5, run_tag="t")
    plan = build_plan(cfg)
    assert plan == build_plan(cfg)
    assert plan != build_plan(dataclasses.replace(cfg, seed=6))
    reqs = plan.requests
    assert len(reqs) == 400
    assert sum(r.det for r in reqs) == 120 and sum(bool(r.abort) for r in reqs) == 20
    assert {r.endpoint for r in reqs} == set(ENDPOINTS)
    assert {r.stream for r in reqs} == {True, False}
    assert {r.abort for r in reqs} == {None, "rid", "disconnect"}
    assert all(r.stream for r in reqs if r.abort == "disconnect")
    assert {r.spec_id for r in reqs if r.det} == {s.spec_id for s in plan.specs}
    assert {(s.endpoint, s.temperature > 0) for s in plan.specs} == {
        (e, t) for e in ENDPOINTS for t in (False, True)}
    for r in reqs:
        if r.det:  # the spec's own request: only stream/rid differ between its copies
            assert r.body == det_body(plan.specs[r.spec_id], stream=r.stream, rid=r.rid)
        else:
            sp = r.body.get("sampling_params", r.body)
            assert sp.get("is_deterministic") in (None, False)
        assert cfg.min_new_tokens <= r.max_new_tokens <= cfg.max_new_tokens
    # SGLang aborts every request whose rid starts with the aborted rid: no rid prefixes another
    rids = sorted(r.rid for r in reqs)
    assert len(set(rids)) == len(rids)
    assert not any(b.startswith(a) for a, b in zip(rids, rids[1:]))


def test_plan_rejects_bad_configs():
    with pytest.raises(ValueError):
        build_plan(SoakConfig(num_requests=0))
    with pytest.raises(ValueError):
        build_plan(SoakConfig(det_fraction=1.5))
    with pytest.raises(ValueError):
        build_plan(SoakConfig(min_new_tokens=9, max_new_tokens=8))


# -- assembling responses ----------------------------------------------------------------------
def _assemble(endpoint, body=None, chunks=()):
    asm = Assembler(endpoint)
    if body is not None:
        asm.add_body(body)
    for c in chunks:
        asm.add_chunk(c)
    return asm.output()


LPS = [-1.5, -0.25, -3.0]


def test_native_stream_equals_body():
    def native(n, finish=None):
        return {"text": "abc"[:n], "output_ids": [5, 6, 7][:n],
                "meta_info": {"completion_tokens": n, "finish_reason": finish,
                              "output_token_logprobs": [[lp, i, None] for lp, i in
                                                        zip(LPS[:n], [5, 6, 7])]}}
    body = _assemble("generate", native(3, {"type": "length"}))
    streamed = _assemble("generate", chunks=[native(1), native(3, {"type": "length"})])
    assert body == streamed and body["ids"] == [5, 6, 7] and body["finish"] == "length"
    assert compare_full(body, streamed) is None


def _completion_lp(tokens, lps):
    return {"tokens": tokens, "token_logprobs": lps, "text_offset": [-1] * len(tokens),
            "top_logprobs": [{t: lp} for t, lp in zip(tokens, lps)]}


def test_completions_stream_equals_body():
    body = {"choices": [{"text": " a bc", "finish_reason": "length",
                         "logprobs": _completion_lp([" a", " b", "c"], LPS)}],
            "usage": {"completion_tokens": 3}}
    chunks = [{"choices": [{"text": " a", "logprobs": _completion_lp([" a"], LPS[:1]),
                            "finish_reason": None}], "usage": None},
              {"choices": [{"text": "", "logprobs": None, "finish_reason": None}]},
              {"choices": [{"text": " bc", "logprobs": _completion_lp([" b", "c"], LPS[1:]),
                            "finish_reason": "length"}]},
              {"choices": [], "usage": {"completion_tokens": 3}}]
    ref, got = _assemble("completions", body), _assemble("completions", chunks=chunks)
    assert ref["text"] == " a bc" and ref["completion_tokens"] == 3
    assert compare_full(ref, got) is None


def _chat_entry(token, lp, top_lp=None):
    return {"token": token, "bytes": list(token.encode()), "logprob": lp,
            "top_logprobs": [{"token": "x", "bytes": [120], "logprob": top_lp or lp}]}


def _chat(entries_per_chunk, texts, finish="length", n=None):
    ref = {"choices": [{"message": {"role": "assistant", "content": "".join(texts)},
                        "finish_reason": finish,
                        "logprobs": {"content": [e for es in entries_per_chunk for e in es]}}],
           "usage": {"completion_tokens": n}}
    chunks = [{"choices": [{"delta": {"role": "assistant", "content": ""}, "logprobs": None,
                            "finish_reason": None}]}]
    chunks += [{"choices": [{"delta": {"content": t}, "logprobs": {"content": es},
                             "finish_reason": None}]} for es, t in zip(entries_per_chunk, texts)]
    chunks += [{"choices": [{"delta": {}, "finish_reason": finish}]},
               {"choices": [], "usage": {"completion_tokens": n}}]
    return ref, chunks


def test_chat_stream_equals_body_and_tolerates_sglangs_two_stream_bugs():
    a, b, c, d = (_chat_entry(" a", -1.0), _chat_entry(" b", -2.0), _chat_entry("\ufffd", -3.0),
                  _chat_entry("é", -4.0))
    body, chunks = _chat([[a, b], [c, d]], [" a b", "é"], n=4)
    ref, got = _assemble("chat", body), _assemble("chat", chunks=chunks)
    assert got["chat_stream"] and compare_full(ref, got) is None
    # SGLang bug 1: every token of a multi-token chunk gets the first token's top_logprobs
    b_wrong_top = {**b, "top_logprobs": a["top_logprobs"]}
    _, chunks = _chat([[a, b_wrong_top], [c, d]], [" a b", "é"], n=4)
    got = _assemble("chat", chunks=chunks)
    assert compare_full(ref, got) is None
    assert chat_stream_upstream_diffs(ref["logprobs"], got["logprobs"]) == (0, 1)
    # SGLang bug 2: a step whose text delta is empty (incomplete UTF-8) loses its logprobs
    _, chunks = _chat([[a, b], [d]], [" a b", "é"], n=4)
    got = _assemble("chat", chunks=chunks)
    assert compare_full(ref, got) is None
    assert chat_stream_upstream_diffs(ref["logprobs"], got["logprobs"]) == (1, 0)
    # ... but no other entry may go missing or change, and the top logprobs of a non-streamed
    # response are compared exactly
    _, chunks = _chat([[a], [c, d]], [" a b", "é"], n=4)
    assert "!= reference entry" in compare_full(ref, _assemble("chat", chunks=chunks))
    _, chunks = _chat([[a, _chat_entry(" b", math.nextafter(-2.0, 0))], [c, d]], [" a b", "é"],
                      n=4)
    assert compare_full(ref, _assemble("chat", chunks=chunks)) is not None
    body2, _ = _chat([[a, b_wrong_top], [c, d]], [" a b", "é"], n=4)
    assert "logprobs differ at token 1" in compare_full(ref, _assemble("chat", body2))


# -- comparisons -------------------------------------------------------------------------------
REF = {"ids": [1, 2, 3, 4], "logprobs": [[-0.5, 1], [-1.25, 2], [0.0, 3], [-2.0, 4]],
       "completion_tokens": 4, "finish": "length"}


def _with(**kw):
    return {**REF, **kw}


def test_compare_full_is_bitwise():
    assert compare_full(REF, _with()) is None
    one_ulp = [list(x) for x in REF["logprobs"]]
    one_ulp[1][0] = math.nextafter(-1.25, 0.0)
    assert "logprobs differ at token 1" in compare_full(REF, _with(logprobs=one_ulp))
    neg_zero = [list(x) for x in REF["logprobs"]]
    neg_zero[2][0] = -0.0  # == 0.0 for Python, not for the bits
    assert "logprobs differ at token 2" in compare_full(REF, _with(logprobs=neg_zero))
    assert "ids differ" in compare_full(REF, _with(ids=[1, 2, 3, 5]))
    assert "completion_tokens differ" in compare_full(REF, _with(completion_tokens=3))
    assert "finish differ" in compare_full(REF, _with(finish="stop"))
    assert "logprobs differ" in compare_full(REF, _with(logprobs=REF["logprobs"][:3]))
    text_ref = {"text": "hello world", "logprobs": [], "completion_tokens": 2, "finish": "length"}
    assert "text differs" in compare_full(text_ref, {**text_ref, "text": "hello World"})


def test_compare_prefix():
    assert compare_prefix(REF, {"ids": [], "logprobs": []}) is None
    assert compare_prefix(REF, {"ids": [1, 2], "logprobs": REF["logprobs"][:2]}) is None
    assert compare_prefix(REF, {"ids": [1, 3], "logprobs": REF["logprobs"][:2]}) is not None
    assert compare_prefix(REF, {"ids": [1, 2, 3, 4, 5], "logprobs": []}) is not None
    bad = [[-0.5, 1], [math.nextafter(-1.25, 0.0), 2]]
    assert compare_prefix(REF, {"ids": [1, 2], "logprobs": bad}) is not None
    text_ref = {"text": "hello world", "logprobs": [], "completion_tokens": 2, "finish": "length"}
    assert compare_prefix(text_ref, {"text": "hello", "logprobs": []}) is None
    assert compare_prefix(text_ref, {"text": "help", "logprobs": []}) is not None


# -- evaluation --------------------------------------------------------------------------------
def _native_output(n, finish="length"):
    return {"ids": list(range(n)), "logprobs": [[-1.0 - i, i] for i in range(n)],
            "completion_tokens": n, "finish": finish}


def test_evaluate_counts_and_fails():
    plan = build_plan(SoakConfig(num_requests=60, det_fraction=0.5, abort_fraction=0.0, seed=2,
                                 pool_size=1, run_tag="e"))
    assert plan.specs[0].endpoint == "generate"
    refs = {0: _native_output(plan.specs[0].max_new_tokens)}
    outcomes = []
    for r in plan.requests:
        out = Outcome(r.index, r.rid, r.endpoint, r.stream, r.spec_id, r.abort, r.max_new_tokens,
                      status=200, stream_done=r.stream)
        if r.det or r.endpoint == "generate":
            out.output = _native_output(r.max_new_tokens)
        else:
            out.output = {"text": "x", "logprobs": [], "completion_tokens": r.max_new_tokens,
                          "finish": "length"}
        outcomes.append(out)
    figures, failures = evaluate(plan, outcomes, refs)
    assert failures == [] and figures["det_identical"] == figures["det"] == 30
    assert figures["completed"] == 60 and figures["aborted"] == 0
    # a 5xx, a differing deterministic output, an aborted one that is a prefix of its
    # reference and one that is not
    a, b, c, d = [outcomes[r.index] for r in plan.requests if r.det][:4]
    ref = refs[0]
    a.status, a.error = 500, "Internal Server Error"
    b.output = {**ref, "ids": ref["ids"][:-1] + [999]}
    c.output = {**ref, "ids": ref["ids"][:2], "logprobs": ref["logprobs"][:2], "finish": "abort",
                "completion_tokens": 2}
    d.output = {**ref, "ids": [7], "logprobs": ref["logprobs"][:1], "finish": "abort",
                "completion_tokens": 1}
    figures, failures = evaluate(plan, outcomes, refs)
    assert figures["status_5xx"] == 1 and figures["det_mismatched"] == 1
    assert figures["det_aborted"] == 2 and figures["det_prefix_ok"] == 1
    assert figures["aborted"] == 2 and figures["completed"] == 57
    assert len(failures) == 3
    assert any("HTTP 500" in x for x in failures)
    assert any("differs from its solo reference" in x for x in failures)
    assert any("no prefix" in x for x in failures)


def test_markdown_report():
    row = {"passed": False, "failures": ["request x: HTTP 500"], "timestamp": "T", "url": "U",
           "model": "M", "server_args": "--enable-llm42", "git_commit": "C", "cpu": "CPU",
           "command": "python -m benchmarks.soak", "checks": {"host_load_avg_1m": [1.0, 2.0]},
           "config": dataclasses.asdict(SoakConfig()),
           "figures": {"requests": 2000, "status_5xx": 1, "recheck": 4, "recheck_identical": 4,
                       "by_endpoint": {"generate": 700, "completions": 650, "chat": 650}}}
    md = markdown(row)
    assert md.startswith("# Soak FAILED (1 failures)")
    assert "| requests | 2000 |" in md and "| 5xx | 1 |" in md and "| 4xx | - |" in md
    assert "| recheck identical after soak | 4/4 |" in md
    assert "generate 700, completions 650, chat 650" in md
    assert "- request x: HTTP 500" in md
