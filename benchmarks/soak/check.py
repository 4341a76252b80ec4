"""The soak's verdicts: each request's outcome against the plan and the references (figures
and failures), and the server's state once the load has drained (leaks).

    figures, failures = evaluate(plan, outcomes, references)
    leaks = leak_checks(checks, server, new_log)
"""

from __future__ import annotations

from benchmarks.soak.compare import chat_stream_upstream_diffs, compare_full, compare_prefix
from benchmarks.soak.plan import ENDPOINTS, Plan, PlannedRequest
from benchmarks.soak.responses import Outcome

# in the server log of a launched server: SGLang's idle leak checks (warnings when not strict),
# and any traceback
LOG_MARKERS = ("memory leak detected", "double free", "use-after-free",
               "Traceback (most recent call last)")


def leak_checks(checks: dict, drain_timeout: float, new_log: str | None) -> list[str]:
    """What the drained server shows of a leak: not idle, unhealthy (SGLang's strict idle leak
    check kills the scheduler on a leaked KV slot or request row), dead, KV tokens still in use
    (radix cache excluded), or leak warnings and tracebacks in what it logged during the soak."""
    leaks = []
    if not checks["idle_after_drain"]:
        leaks.append(f"server not idle {drain_timeout:.0f} s after the load: "
                     f"{checks['load_at_idle']}")
    if checks["health_after_drain"] != 200:
        leaks.append(f"/health answered {checks['health_after_drain']} after the drain (leak "
                     "check crashed the scheduler?)")
    if checks["server_process_alive"] is False:
        leaks.append("the server process died")
    if checks["kv_used_tokens_at_idle"] not in (0, None):
        leaks.append(f"{checks['kv_used_tokens_at_idle']} KV tokens in use at idle")
    for marker in LOG_MARKERS if new_log else ():
        if marker in new_log:
            leaks.append(f"the server log says {marker!r} ({new_log.count(marker)} times)")
    return leaks


def evaluate(plan: Plan, outcomes: list[Outcome],
             references: dict[int, dict]) -> tuple[dict, list[str]]:
    """Figures and failures of the load phase (sets each outcome's `verdict`)."""
    failures: list[str] = []
    f = dict(requests=len(outcomes), completed=0, aborted=0, abort_attempts=0,
             aborts_by_rid=0, aborts_by_disconnect=0, streamed=0,
             by_endpoint={e: 0 for e in ENDPOINTS}, det=0, det_completed=0, det_identical=0,
             det_mismatched=0, det_aborted=0, det_aborted_partial=0, det_prefix_ok=0,
             status_5xx=0, status_4xx=0, transport_errors=0, output_tokens=0,
             native_det_rollbacks=0, retractions=0, chat_stream_logprobs_dropped=0,
             chat_stream_top_logprobs_wrong=0)
    for req, out in zip(plan.requests, outcomes):
        f["by_endpoint"][out.endpoint] += 1
        f["streamed"] += out.stream
        f["det"] += req.det
        f["abort_attempts"] += bool(req.abort) and (out.abort_sent or out.disconnected)
        code = out.error_code or out.status or 0
        problem = None
        if code >= 500 or (out.abort_status or 0) >= 500:
            f["status_5xx"] += 1
            problem = f"HTTP {code} (abort {out.abort_status}): {out.error[:200]}"
        elif 400 <= code < 500 or (out.abort_status or 200) != 200:
            f["status_4xx"] += 1
            problem = f"HTTP {code} (abort {out.abort_status}): {out.error[:200]}"
        elif out.error:
            f["transport_errors"] += 1
            problem = f"error: {out.error[:200]}"
        elif out.stream and not out.disconnected and not out.stream_done:
            f["transport_errors"] += 1
            problem = "stream ended without [DONE]"
        if problem:
            out.verdict = "error"
            failures.append(f"request {out.rid} ({_desc(out)}): {problem}")
            continue
        f["output_tokens"] += out.num_tokens()
        f["retractions"] += out.retractions or 0
        if out.aborted:
            f["aborted"] += 1
            f["aborts_by_disconnect"] += out.disconnected
            f["aborts_by_rid"] += not out.disconnected
        elif out.completed:
            f["completed"] += 1
        else:
            out.verdict = "error"
            failures.append(f"request {out.rid} ({_desc(out)}): no finish reason")
            continue
        problem = _sanity(req, out)
        if problem:
            out.verdict = "malformed"
            failures.append(f"request {out.rid} ({_desc(out)}): {problem}")
            continue
        if not req.det:
            out.verdict = "aborted" if out.aborted else "ok"
            continue
        ref = references.get(req.spec_id)
        if out.aborted:
            f["det_aborted"] += 1
            partial = bool((out.output or {}).get("ids") or (out.output or {}).get("text")
                           or (out.output or {}).get("logprobs"))
            f["det_aborted_partial"] += partial
            diff = _judge(out, ref, compare_prefix, "prefix-ok", "prefix-mismatch")
            if diff:
                failures.append(f"aborted deterministic {out.rid} ({_desc(out)}): {diff}")
            f["det_prefix_ok"] += out.verdict == "prefix-ok"
            continue
        f["det_completed"] += 1
        f["native_det_rollbacks"] += out.rollbacks or 0
        diff = _judge(out, ref, compare_full, "identical", "mismatch")
        if diff:
            f["det_mismatched"] += 1
            failures.append(f"deterministic {out.rid} ({_desc(out)}) differs from its solo "
                            f"reference: {diff}")
        elif out.verdict == "identical":
            f["det_identical"] += 1
            if out.output.get("chat_stream"):
                dropped, wrong_top = chat_stream_upstream_diffs(ref["logprobs"],
                                                                out.output["logprobs"])
                f["chat_stream_logprobs_dropped"] += dropped
                f["chat_stream_top_logprobs_wrong"] += wrong_top
    return f, failures


def _judge(out: Outcome, ref: dict | None, compare, same: str, differs: str) -> str | None:
    """Sets `out.verdict` from `compare(ref, output)` (no reference: nothing to compare with);
    returns the difference, if any."""
    if ref is None:
        out.verdict = "no-reference"
        return None
    diff = compare(ref, out.output)
    out.verdict = differs if diff else same
    return diff


def _sanity(req: PlannedRequest, out: Outcome) -> str | None:
    """Shape checks every (completed or aborted) response passes, deterministic or not."""
    o = out.output or {}
    n = out.num_tokens()
    if n > req.max_new_tokens:
        return f"{n} tokens for max {req.max_new_tokens}"
    if out.endpoint == "generate" and o.get("completion_tokens") not in (None, n):
        return f"completion_tokens {o.get('completion_tokens')} but {n} output ids"
    if out.completed and o.get("finish") not in ("length", "stop"):
        return f"finish reason {o.get('finish')!r}"
    if out.completed and o.get("completion_tokens") is None:
        return "no completion_tokens"
    if out.completed and o.get("finish") == "length" and n != req.max_new_tokens:
        return f"finish 'length' after {n} of {req.max_new_tokens} tokens"
    return None


def _desc(out: Outcome) -> str:
    kind = f"det spec {out.spec_id}" if out.spec_id is not None else "normal"
    return (f"{out.endpoint} {'stream' if out.stream else 'non-stream'} {kind}"
            f"{' abort ' + out.abort if out.abort else ''}")
