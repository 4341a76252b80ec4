"""Sampling that depends on the row alone: one path for decode batches and verification passes.

SGLang's Sampler picks its code path from batch-wide flags: a single greedy (top_k=1), top-k,
top-p or min-p row sends the whole batch through the sorted top-k/top-p sampler, where seeded
noise is drawn by rank instead of by vocabulary index. A seeded temperature > 0 row would then
draw other tokens depending on its batch mates, disagree with the verifier and roll back at
almost every window. With llm42 on, `sampler_forward_hook` splits a batch that mixes kinds into
one call of SGLang's own forward per kind, so every row is sampled as in a batch of its own kind.
The verifier samples through the same hooked Sampler, so the two cannot drift apart.

Deterministic top-k / top-p / min-p rows form kinds of their own: they draw by vocabulary id
(`vocab_noise`), normal rows of the same kind keep SGLang's sorted draw.
"""

from __future__ import annotations

import copy
from collections import defaultdict

import torch

from llm42.sglang import det_rows, runtime, vocab_noise

# A row's kind: (greedy, top_p, top_k, min_p), the flags SGLang's Sampler branches on, and
# whether it draws by vocabulary id (a deterministic truncated row, `vocab_noise`).
GREEDY = (True, False, False, False, False)
PLAIN = (False, False, False, False, False)
_LIST_FIELDS = (  # per-row lists the Sampler writes into LogitsProcessorOutput
    "next_token_top_logprobs_val", "next_token_top_logprobs_idx",
    "next_token_token_ids_logprobs_val", "next_token_token_ids_logprobs_idx",
    "next_token_sampling_mask_idx", "next_token_sampling_logprobs",
)


def sampler_forward_hook(original, sampler, logits_output, sampling_info, return_logprob,
                         top_logprobs_nums, token_ids_logprobs, positions):
    """AROUND Sampler.forward: sample each kind of row on its own (same contract as SGLang's)."""
    args = (return_logprob, top_logprobs_nums, token_ids_logprobs)
    if runtime.RUNTIME is None or _batch_kind(sampling_info) is not None:
        return original(sampler, logits_output, sampling_info, *args, positions)
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, kind in enumerate(row_kinds(sampling_info)):
        groups[kind].append(i)
    if len(groups) == 1:  # SGLang's flags only ever grow when batches merge: may be stale
        (kind,) = groups
        return original(sampler, logits_output, _for_kind(sampling_info, kind), *args, positions)
    return _sample_groups(original, sampler, logits_output, sampling_info, groups, args, positions)


def _batch_kind(info):
    """The kind of every row when the batch-wide flags already prove there is only one."""
    if info.is_all_greedy:
        return GREEDY
    if not (info.is_any_greedy or info.need_top_p_sampling or info.need_top_k_sampling
            or info.need_min_p_sampling):
        return PLAIN
    return None


def row_kinds(info) -> list[tuple]:
    """Each row's kind, from its own parameters (one device-to-host copy). A row draws by
    vocabulary id when it is deterministic and truncated: any of its top-p / top-k / min-p flags
    (greedy rows have none)."""
    from sglang.srt.sampling.sampling_params import TOP_K_ALL

    greedy = info.top_ks <= 1
    flags = torch.stack([greedy, ~greedy & (info.top_ps != 1.0),
                         ~greedy & (info.top_ks != TOP_K_ALL), ~greedy & (info.min_ps > 0)], dim=1)
    det = det_rows.of(info)
    return [(*row, det[i] and any(row[1:])) for i, row in enumerate(flags.tolist())]


def _for_kind(info, kind):
    """A copy of `info` whose batch-wide flags are those of `kind`.

    SGLang has no seeded min-p sampler (it asserts there is no seed); llm42 seeds every row, so
    normal min-p rows are sampled unseeded, as SGLang samples them without llm42. Deterministic
    min-p rows draw by vocabulary id, seeded."""
    greedy, top_p, top_k, min_p, by_id = kind
    info = copy.copy(info)
    info.is_all_greedy = info.is_any_greedy = greedy
    info.need_top_p_sampling, info.need_top_k_sampling = top_p, top_k
    info.need_min_p_sampling = min_p
    setattr(info, vocab_noise.GROUP_ATTR, by_id)
    if min_p and not by_id:
        info.sampling_seed = None
    return info


def _sample_groups(original, sampler, logits_output, info, groups, args, positions):
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput
    from sglang.srt.layers.sampler import apply_custom_logit_processor

    return_logprob, top_logprobs_nums, token_ids_logprobs = args
    logits = logits_output.next_token_logits
    if info.has_custom_logit_processor:  # its masks index the whole batch: apply it once here
        apply_custom_logit_processor(logits, info)
    n = logits.shape[0]
    ids, logprobs, lists = [], [], {f: [None] * n for f in _LIST_FIELDS}
    produced = set()
    for kind, rows in groups.items():
        index = torch.tensor(rows, dtype=torch.int64, device=logits.device)
        out = LogitsProcessorOutput(next_token_logits=logits.index_select(0, index))
        ids.append(original(
            sampler, out, _subset(info, kind, rows, index), return_logprob,
            _pick(top_logprobs_nums, rows), _pick(token_ids_logprobs, rows),
            positions.index_select(0, index),
        ).to(torch.int32))  # SGLang's dtype for a batch that is not all greedy
        if out.next_token_logprobs is not None:
            logprobs.append(out.next_token_logprobs)
        for field in _LIST_FIELDS:
            values = getattr(out, field)
            if values is not None:
                produced.add(field)
                for i, v in zip(rows, values):
                    lists[field][i] = v
    order = torch.tensor([i for rows in groups.values() for i in rows], device=logits.device)
    inverse = torch.argsort(order)
    if logprobs:
        logits_output.next_token_logprobs = torch.cat(logprobs)[inverse]
    for field in produced:
        setattr(logits_output, field, _fill_missing(field, lists[field]))
    return torch.cat(ids)[inverse]


def _subset(info, kind, rows, index):
    sub = _for_kind(info, kind)
    for name in ("temperatures", "top_ps", "top_ks", "min_ps", "sampling_seed"):
        value = getattr(sub, name)
        if value is not None:
            setattr(sub, name, value.index_select(0, index))
    sub.has_custom_logit_processor = False  # applied to the whole batch already
    sub.custom_logit_processor = sub.custom_params = None
    sub.logit_bias = None  # applied before the sampler (ModelRunner._preprocess_logits)
    sub.return_sampling_masks = _pick(info.return_sampling_masks, rows)
    det_rows.mark(sub, _pick(det_rows.of(info), rows))
    return sub


def _pick(values, rows):
    return None if values is None else [values[i] for i in rows]


def _fill_missing(field: str, values: list) -> list:
    """Rows of groups that asked for nothing get what SGLang gives such rows in a mixed batch."""
    if field.startswith("next_token_sampling_"):
        return values  # None for rows that did not ask for a sampling mask
    ref = next(v for v in values if v is not None)
    empty = ref[:0] if torch.is_tensor(ref) else []  # top-k slice of length 0 / no token ids
    return [empty if v is None else v for v in values]
