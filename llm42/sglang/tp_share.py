"""Tensor parallelism: TP rank 0 samples for every rank, and every rank's decisions are compared.

Under TP each rank runs a scheduler of its own over its shard of the KV cache and decides every
commit and rollback itself. The ranks stay in step only if each decision sees the same inputs:
the candidates (the fast path's sampled tokens), the verifier's tokens and the injector's draws.
The logits those tokens come from are the same on every rank only as long as the last
all-reduce and the LM head give every rank the same bits. One bit off on one rank, and a sampled
token can differ there: that rank's decision, its KV and every later step diverge from the
others', and nothing in the outputs has to show it.

So llm42 shares the tokens where SGLang itself does: at the end of every `Sampler.forward`,
`Sampler._sync_token_ids_across_tp` all-reduces the sampled ids with MIN over the TP group
(`Sampler.tp_sync_group`), but only with `SYNC_TOKEN_IDS_ACROSS_TP` or a grammar in the batch.
With `--enable-llm42` and TP > 1 the hook below instead broadcasts TP rank 0's ids over that
group, on every call: decode and prefill batches, and the verification passes, which sample
through the same Sampler (`verifier._sample_rows`). Rank 0's ids rather than the minimum, because
rank 0's logprobs are the ones SGLang returns: token and logprob stay a pair.

Every decision then has the same inputs on every rank (each token of `output_ids` and each
verifier token is rank 0's; the injector is seeded alike and called in the same order), so
`decide()` gives the same result everywhere without a second collective. Each rank records its
decisions in a `DecisionLedger` (`llm42.core.rank_ledger`); `/llm42_stats` gathers the ledgers
(`gather_ledgers`) and reports whether the ranks agree (`tp_ranks_agree`).

Cost: one broadcast of a step's token ids per Sampler call (per sampling kind of a mixed batch),
which SGLang skips by default.
"""

from __future__ import annotations

from llm42.sglang import rank_faults, runtime


def sync_token_ids_hook(original, sampler, batch_next_token_ids, sampling_info):
    """AROUND Sampler._sync_token_ids_across_tp: with llm42 on, TP rank 0's ids on every rank."""
    import torch.distributed as dist

    group = sampler.tp_sync_group
    if runtime.RUNTIME is None or group is None or dist.get_world_size(group) == 1:
        return original(sampler, batch_next_token_ids, sampling_info)
    rank_faults.skew_tokens(batch_next_token_ids, sampling_info.vocab_size)  # tests only
    ids = batch_next_token_ids.contiguous()
    dist.broadcast(ids, src=dist.get_global_rank(group, 0), group=group)
    if ids.data_ptr() != batch_next_token_ids.data_ptr():
        batch_next_token_ids.copy_(ids)
    return None


def observe_decision(rt, req, first_index: int, decision) -> None:
    """Record an applied decision in this rank's ledger: the verified tokens now in
    `req.output_ids[first_index : new_num_verified)` (the corrected token last on a rollback)."""
    committed = list(req.output_ids[first_index : decision.new_num_verified])
    rt.ledger.observe(req.rid, first_index, committed, decision.num_rejected,
                      decision.mismatch_index)


def observe_inline(rt, req, index: int) -> None:
    """Under TP, record a token verified on arrival (an inline step, `inline_verify.on_token`)
    as a decision of one committed token: a rank whose inline steps verify what its peers leave
    to a pass would otherwise keep an equal ledger. Without TP peers there is nothing to compare
    it with, and it would cost host time for every token of a host-bound step."""
    if rt.tp_size > 1:
        rt.ledger.observe(req.rid, index, [req.output_ids[index]], 0, None)


def gather_ledgers(scheduler, own: dict) -> list[dict]:
    """Every TP rank's ledger entry, in rank order, on every rank.

    Called from `get_internal_state`, which every rank of the group runs for the same request
    at the same point of its loop (SGLang broadcasts each received request to all TP ranks), so
    the collective cannot deadlock. The group is SGLang's request-coordination group
    (`dp_tp_group`: the TP group, or the attention-TP group under DP attention)."""
    group = getattr(scheduler, "dp_tp_group", None)
    if group is None or group.world_size == 1:
        return [own]
    return group.all_gather_object(own)
