"""Structured output (json_schema, regex, ebnf, structural_tag) for deterministic requests.

SGLang keeps one grammar matcher per request (`req.grammar`, xgrammar's `GrammarMatcher` behind
SGLang's `XGrammarGrammar`) and advances it on every token it appends: `o_0` after the prefill,
each decode token after its step. Before sampling `o_k` it masks the logits with the matcher's
allowed-token bitmask *after* `o_0 .. o_{k-1}`, unless the matcher has terminated (then the row
is not masked at all). Two things follow for llm42:

- **Rollback.** When llm42 drops candidates it rolls the matcher back by as many tokens as it
  had accepted among them (`rewind`), and a verifier correction is accepted in their place
  (`replace_last`); the fast path then masks the next step from the corrected state.
- **Verification.** Row entry k of a window must see the mask the fast path saw for `o_k`: the
  matcher's bitmask after the first k accepted tokens. `masks` rolls the matcher back to the
  window's first entry, fills one bitmask row per entry while re-accepting the tokens it had
  accepted, and ends where it started. The mask is a pure function of the tokens before k, so
  it is the same however the request was batched; the verifier's token at a mismatch is
  always allowed by the grammar.

The count of tokens a matcher accepted is `len(grammar.accepted_tokens)`: it stops at the
token that terminated the grammar, and the overlap loop may feed the matcher a token that
llm42 then cut (one past a withheld finish, `hooks_lifecycle.update_finish_state_hook`), so
it is not always `len(output_ids)`. Only SGLang's xgrammar backend (its default) keeps that list
and an unlimited rollback; deterministic requests with a grammar need it
(`request_fields.grammar_backend_problem`).

    grammar_replay.rewind(req, num_kept)               # kv_rollback.truncate_output
    grammar_replay.replace_last(req, index, token_id)  # kv_rollback.replace_tail
    grammar_replay.apply_masks(logits, reqs, output_indices)   # verify_logits.apply
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)


def _grammar(req):
    grammar = getattr(req, "grammar", None)
    # Still compiling (a Future) or none: nothing was accepted, nothing to replay.
    return grammar if hasattr(grammar, "accepted_tokens") else None


def rewind(req, num_kept: int) -> None:
    """The matcher forgets every accepted token from output index `num_kept` on."""
    grammar = _grammar(req)
    if grammar is None:
        return
    extra = len(grammar.accepted_tokens) - num_kept
    if extra > 0:
        grammar.rollback(extra)


def replace_last(req, index: int, token_id: int) -> None:
    """Output token `index` became `token_id` (a verifier correction, the last output token)."""
    grammar = _grammar(req)
    if grammar is None:
        return
    rewind(req, index)
    if len(grammar.accepted_tokens) < index:  # terminated before `index`: nothing more to feed
        return
    try:
        grammar.accept_token(token_id)
    except ValueError:
        # The verifier masked its logits with this very state, so this is a bug, not bad input:
        # finish the request with an error rather than the scheduler.
        from sglang.srt.managers.schedule_batch import FINISH_ABORT

        logger.error("llm42: the grammar of %s rejected the verifier's token %d at output %d",
                     req.rid, token_id, index)
        req.to_finish = FINISH_ABORT("llm42: the grammar rejected a verified token")


def apply_masks(logits: torch.Tensor, reqs: list, output_indices: list[int]) -> None:
    """Mask row i of `logits` ([n, vocab], in place) as the fast path masked the logits of
    output token `output_indices[i]` of `reqs[i]`; rows without a grammar are left alone."""
    grammared = {}
    for i, (req, k) in enumerate(zip(reqs, output_indices)):
        grammar = _grammar(req)
        if grammar is not None:
            grammared.setdefault(id(req), (grammar, []))[1].append((k, i))
    if not grammared:
        return
    first = next(iter(grammared.values()))[0]
    vocab_size = logits.shape[1]
    mask = first.allocate_vocab_mask(vocab_size, logits.shape[0], logits.device)
    for grammar, entries in grammared.values():
        _fill_rows(grammar, entries, mask)
    first.apply_vocab_mask(logits, first.move_vocab_mask(mask, logits.device))


def _fill_rows(grammar, entries: list[tuple[int, int]], mask: torch.Tensor) -> None:
    """Fill `mask[row]` with the matcher's bitmask after the first k accepted tokens, for each
    (k, row) of `entries`; the matcher ends as it began. Entries past the accepted tokens, or
    at a terminated state, stay unmasked, as on the fast path."""
    accepted = list(grammar.accepted_tokens)
    rows_at: dict[int, list[int]] = {}
    for k, row in entries:
        if k <= len(accepted):
            rows_at.setdefault(k, []).append(row)
    if not rows_at:
        return
    first = min(rows_at)
    if len(accepted) > first:
        grammar.rollback(len(accepted) - first)
    for k in range(first, len(accepted) + 1):
        if k in rows_at and not grammar.is_terminated():
            for row in rows_at[k]:
                grammar.fill_vocab_mask(mask, row)
        if k < len(accepted):
            grammar.accept_token(accepted[k])
