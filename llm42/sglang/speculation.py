"""Deterministic requests on a speculative-decoding server (NGRAM, STANDALONE, EAGLE topk 1).

Speculation is a faster fast path: the tokens a speculative step accepts for a deterministic
request are candidates like any decode step's, and the window verifier alone decides what is
committed, so outputs do not depend on speculation (nor on its acceptance). Three things make
the two fit:

  * **Candidates.** SGLang's verify step (`eagle_sample`) draws non-greedy rows with its own
    coins, which the verifier would reject at almost every window. A deterministic row instead
    takes, at every node of its draft tree, the token llm42's sampler draws from the target's
    logits at that node's position (the seeded, vocabulary-keyed draw of decode and passes), and
    accepts the drafts greedily along it. Normal rows keep SGLang's verification.
  * **Rollback.** SGLang over-allocates each request's KV tail for the drafts
    (`kv_allocated_len > kv_committed_len`); `kv_rollback` frees that tail with the rolled-back
    slots. The next step's root token, the bonus token SGLang keeps in the batch's draft input
    (EAGLE / STANDALONE), becomes the verifier's token (`rewind`); NGRAM reads it from the
    output, and its per-request match state is dropped. A draft model's KV and hidden state of
    rolled-back positions are left stale: they only shape the next drafts, which the target
    verifies and the window verifier re-verifies.
  * **Finishes.** A step may accept tokens past a stop: they are dropped at once, so the
    withheld finish ends the candidates (`hooks_lifecycle`).

The overlap scheduler is turned off on such servers: under it SGLang relays the next step's
sequence lengths and draft state through device buffers written before llm42 could roll back.
On the fast path the deterministic rows keep bf16 logits (passes stay fp32): the verify step
may replay a CUDA graph and the draft model shares the LM-head hook.
"""

from __future__ import annotations

import os

from llm42.sglang import det_rows, runtime

SUPPORTED_ALGORITHMS = ("NGRAM", "STANDALONE", "EAGLE")
# Test runs: check at every verify step that each deterministic row's draft tree starts from its
# last output token (a rollback that left the draft state behind fails loudly).
CHECK_ROOTS_ENV = "LLM42_TEST_CHECK_SPEC_ROOTS"


def check_server_args(server_args) -> str | None:
    """The reason llm42 refuses this speculative setting (None: accepted, or none is set)."""
    algorithm = getattr(server_args, "speculative_algorithm", None)
    if algorithm is None:
        return None
    name = str(algorithm).upper()
    if name not in SUPPORTED_ALGORITHMS:
        return (f"llm42 supports --speculative-algorithm {', '.join(SUPPORTED_ALGORITHMS)} "
                f"(got {algorithm})")
    topk = getattr(server_args, "speculative_eagle_topk", None)
    if name != "NGRAM" and topk not in (None, 1):
        return (f"llm42 supports --speculative-algorithm {name} with --speculative-eagle-topk 1 "
                f"only (got {topk})")
    if getattr(server_args, "enable_dp_attention", False):
        return "llm42 does not support speculative decoding with --enable-dp-attention"
    return None


def is_speculative(server_args) -> bool:
    return getattr(server_args, "speculative_algorithm", None) is not None


def eagle_sample_hook(original, verify_input, batch, logits_output, grammar_mask=None):
    """AROUND eagle_sample: deterministic rows accept their drafts along llm42's draws."""
    predict, accept_lens, accept_index = original(verify_input, batch, logits_output,
                                                  grammar_mask)
    if runtime.RUNTIME is None or batch.forward_mode.is_idle():
        return predict, accept_lens, accept_index
    rows = [i for i, is_det in enumerate(det_rows.of(batch.sampling_info)) if is_det]
    if not rows:
        return predict, accept_lens, accept_index
    n = verify_input.draft_token_num
    candidates = verify_input.draft_token.reshape(len(batch.reqs), n)
    if os.environ.get(CHECK_ROOTS_ENV) == "1":
        _check_roots(batch, rows, candidates)
    return _det_accept(verify_input, batch, logits_output.next_token_logits, rows, candidates,
                       (predict, accept_lens, accept_index))


def _det_accept(verify_input, batch, logits, rows, candidates, sglang_result):
    """Overwrite the deterministic rows of SGLang's (predict, accept_lens, accept_index).

    `logits` already carry what SGLang's verify added (penalties, logit bias, grammar mask)."""
    import torch
    from sglang.srt.speculative.eagle_utils import verify_tree_greedy_func

    from llm42.sglang import verifier

    predict, accept_lens, accept_index = sglang_result
    bs, n = candidates.shape
    device = logits.device
    flat = [i * n + j for i in rows for j in range(n)]
    index = verifier.to_device(flat, torch.int64, device)
    reqs = [batch.reqs[i] for i in rows for _ in range(n)]
    positions = verify_input.positions.reshape(-1)[index].to(torch.int64)
    drawn = verifier.sample_tokens(reqs, logits[index], positions)
    target = torch.zeros((bs * n,), dtype=torch.int64, device=device)
    target[index] = drawn.to(torch.int64)
    det_predict = torch.zeros_like(predict)
    det_index = torch.full_like(accept_index, -1)
    det_correct = torch.empty((bs,), dtype=torch.int32, device=device)
    verify_tree_greedy_func(
        predicts=det_predict, accept_index=det_index, accept_token_num=det_correct,
        candidates=candidates, retrieve_index=verify_input.retrieve_index,
        retrieve_next_token=verify_input.retrieve_next_token,
        retrieve_next_sibling=verify_input.retrieve_next_sibling,
        target_predict=target.reshape(bs, n), topk=verify_input.tree_topk)
    row_index = verifier.to_device(rows, torch.int64, device)
    predict = predict.clone()
    predict[index] = det_predict[index]
    accept_index = accept_index.clone()
    accept_index[row_index] = det_index[row_index]
    accept_lens = accept_lens.clone()
    accept_lens[row_index] = (det_correct[row_index] + 1).to(accept_lens.dtype)
    return predict, accept_lens, accept_index


def _check_roots(batch, rows, candidates) -> None:
    roots = candidates[:, 0].tolist()
    for i in rows:
        req = batch.reqs[i]
        if req.output_ids and roots[i] != req.output_ids[-1]:
            raise RuntimeError(
                f"llm42 {CHECK_ROOTS_ENV}: {req.rid}'s draft tree starts from token {roots[i]}, "
                f"its last output token is {req.output_ids[-1]} (speculative state not rewound)")


def rewind(scheduler, batch, req, token_id: int) -> None:
    """After a correction put `token_id` last in `req`'s output: the next speculative step of
    `req` starts from it (EAGLE / STANDALONE bonus token), and NGRAM forgets its match state."""
    algorithm = getattr(batch, "spec_algorithm", None)
    if algorithm is None or algorithm.is_none():
        return
    worker = getattr(scheduler, "draft_worker", None)
    corpus = getattr(worker, "ngram_corpus", None)
    if corpus is not None:
        corpus.erase_match_state([req.rid])
    bonus = getattr(batch.spec_info, "bonus_tokens", None)
    if bonus is None:
        return
    i = next((i for i, r in enumerate(batch.reqs) if r is req), None)
    if i is None or i >= bonus.shape[0]:
        return
    bonus = bonus.clone()  # rebind: the old tensor may be aliased by a queued batch
    bonus[i] = token_id
    batch.spec_info.bonus_tokens = bonus


def past_stop(req) -> int:
    """How many output tokens a just-found finish leaves past its stop (a speculative step may
    accept tokens beyond it)."""
    finished_len = getattr(req, "finished_len", None)
    if not req.finished() or finished_len is None:
        return 0
    return max(len(req.output_ids) - finished_len, 0)
