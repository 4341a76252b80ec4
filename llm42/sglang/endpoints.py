"""HTTP surface in the tokenizer (main) process: `/llm42_stats`, `/reset_llm42_stats`,
`/llm42_benchmark_mode` (with --llm42-benchmark-modes), meta_info.

Statistics live in the scheduler processes; they travel over SGLang's own internal-state RPC
(`get_internal_state` / `set_internal_state`), summed over data-parallel ranks.
"""

from __future__ import annotations

from fastapi import Request  # at module level: FastAPI resolves the route's annotations here

from llm42.core.config import (
    BENCHMARK_MODE_FIELDS,
    parse_benchmark_mode,
    with_benchmark_mode,
)
from llm42.core.rank_ledger import ranks_agree
from llm42.core.stats import Llm42Stats, recompute_pct
from llm42.sglang.keys import META_KEYS, MODE_KEY, RESET_KEY
from llm42.sglang.server_args import config_from_server_args

# Counters (Llm42Stats' flat keys) are summed over ranks; every other key is a setting, identical
# on every rank, and kept as it is. The per-kind split is merged by `_merge_kinds`.
_COUNTERS = {k for k, v in Llm42Stats().snapshot().items() if not isinstance(v, dict)}


def _merge_kinds(per_rank: list[dict]) -> dict:
    merged: dict[str, dict] = {}
    for kinds in per_rank:
        for kind, counts in kinds.items():
            into = merged.setdefault(kind, dict.fromkeys(counts, 0))
            for key, value in counts.items():
                into[key] += value
    for counts in merged.values():
        counts["recompute_pct"] = recompute_pct(counts["verified_tokens"],
                                                counts["tokens_rolled_back"])
    return dict(sorted(merged.items()))


def merge_snapshots(snapshots: list[dict]) -> dict:
    """One view over DP ranks; recompute_pct is recomputed from the summed counts. The TP ranks'
    decision ledgers are listed, not summed (`rank_ledgers`, checked in `tp_ranks_agree`)."""
    live = [s for s in snapshots if s.get("enabled")]
    if not live:
        timelines = [s["timeline"] for s in snapshots if s.get("timeline")]
        return {"enabled": False, **({"timelines": timelines} if timelines else {})}
    merged = dict(live[0])
    for key in _COUNTERS & merged.keys():
        merged[key] = sum(s.get(key, 0) for s in live)
    merged["recompute_pct"] = recompute_pct(merged["verified_tokens"], merged["tokens_rolled_back"])
    merged["by_sampling_kind"] = _merge_kinds([s.get("by_sampling_kind", {}) for s in live])
    merged["dp_ranks"] = len(live)
    # one entry per scheduler (DP replica x TP rank); a replica's TP ranks must agree
    per_replica = [s.get("rank_ledgers", []) for s in live]
    merged["rank_ledgers"] = [entry for ledgers in per_replica for entry in ledgers]
    merged["tp_ranks_agree"] = all(ranks_agree(ledgers) for ledgers in per_replica)
    return merged


def tokenizer_manager_init_hook(result, tokenizer_manager, *args, **kwargs):
    """AFTER TokenizerManager.__init__: add llm42's routes to SGLang's FastAPI app."""
    from fastapi.responses import ORJSONResponse
    from sglang.srt.entrypoints import http_server
    from sglang.srt.managers.io_struct import SetInternalStateReq

    app = http_server.app
    if any(getattr(r, "path", None) == "/llm42_stats" for r in app.routes):
        return

    async def llm42_stats():
        states = await tokenizer_manager.get_internal_state()
        return ORJSONResponse(merge_snapshots([s.get("llm42", {}) for s in states]))

    async def reset_llm42_stats():
        updated = await tokenizer_manager.set_internal_state(
            SetInternalStateReq(server_args={RESET_KEY: 1})
        )
        return ORJSONResponse({"success": bool(updated) and all(updated)})

    async def llm42_benchmark_mode(request: Request):
        args = tokenizer_manager.server_args
        if not (getattr(args, "enable_llm42", False) and getattr(args, "llm42_benchmark_modes",
                                                                  False)):
            return _error(403, "benchmark modes are off: start the server with --enable-llm42 "
                               "--llm42-benchmark-modes to switch "
                               f"{', '.join(BENCHMARK_MODE_FIELDS)} at runtime")
        try:
            mode = parse_benchmark_mode(await request.json())
            # flag-dependent checks of a new window (max verify wait, context length) here too,
            # so that they are a 400 before the scheduler is asked
            with_benchmark_mode(config_from_server_args(args), mode, _context_length(
                tokenizer_manager))
        except ValueError as exc:  # malformed JSON is a ValueError too
            return _error(400, str(exc))
        updated = await tokenizer_manager.set_internal_state(
            SetInternalStateReq(server_args={MODE_KEY: mode}))
        ranks = [s.get("llm42", {}) for s in await tokenizer_manager.get_internal_state()]
        if not (updated and all(updated)):
            refusals = [r["benchmark_mode_refusal"] for r in ranks
                        if r.get("benchmark_mode_refusal")]
            busy = [r for r in refusals if r["busy"]]
            if refusals:
                return _error(409 if busy else 400, (busy or refusals)[0]["message"])
        states = merge_snapshots(ranks)
        return ORJSONResponse({"success": bool(updated) and all(updated),
                               **{k: states.get(k) for k in BENCHMARK_MODE_FIELDS}})

    app.add_api_route("/llm42_stats", llm42_stats, methods=["GET"])
    app.add_api_route("/reset_llm42_stats", reset_llm42_stats, methods=["POST"])
    app.add_api_route("/llm42_benchmark_mode", llm42_benchmark_mode, methods=["POST"])


def _context_length(tokenizer_manager) -> int | None:
    return getattr(getattr(tokenizer_manager, "model_config", None), "context_len", None)


def _error(status: int, message: str):
    from fastapi.responses import ORJSONResponse

    return ORJSONResponse({"error": {"message": message, "code": status}}, status_code=status)


def _collapse(out) -> None:
    """SGLang ships customized_info per token; llm42's per-request counters are scalars. A
    normal request that shared a step with a finishing deterministic one got Nones only: it
    shows no llm42 key."""
    meta = out.get("meta_info") if isinstance(out, dict) else None
    if not meta:
        return
    for key in META_KEYS:
        values = meta.get(key)
        if isinstance(values, list):
            value = next((v for v in reversed(values) if v is not None), None)
            if value is None:
                del meta[key]
            else:
                meta[key] = value


async def wait_one_response_hook(original, tokenizer_manager, *args, **kwargs):
    """AROUND TokenizerManager._wait_one_response (an async generator)."""
    async for out in original(tokenizer_manager, *args, **kwargs):
        _collapse(out)
        yield out
