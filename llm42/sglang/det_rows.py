"""Which rows of a SamplingBatchInfo belong to deterministic requests, kept aligned with SGLang.

The Sampler sees only a SamplingBatchInfo, not the requests, yet deterministic rows must be
sampled differently (`vocab_noise`). SGLang filters, merges and copies that object on its own
schedule, so the per-row list rides on it and these AFTER hooks keep it in step:

    info = SamplingBatchInfo.from_schedule_batch(batch, vocab)   # sampling_info_hook: mark()
    info.filter_batch(keep, keep_device)                          # adjusted_filter_batch: filtered
    info.merge_batch(other)                                       # adjusted_merge_batch: merged
    info.copy_for_forward()                                       # dataclasses.replace: copied

A SamplingBatchInfo without the list (built before llm42 was installed, or by other code) has no
deterministic rows.
"""

from __future__ import annotations

ATTR = "llm42_det_rows"


def mark(info, flags: list[bool]) -> None:
    setattr(info, ATTR, list(flags))


def of_batch(batch) -> list[bool] | None:
    """The flags of a ScheduleBatch's sampling info, None where it has none (they are aligned
    with `batch.reqs` whenever they exist: SGLang filters and merges both together)."""
    return getattr(getattr(batch, "sampling_info", None), ATTR, None)


def of(info) -> list[bool]:
    """One flag per row of `info`."""
    flags = getattr(info, ATTR, None)
    return flags if flags is not None else [False] * len(info)


def filter_hook(result, info, keep_indices, keep_indices_device=None):
    """AFTER SamplingBatchInfo.adjusted_filter_batch (called last in filter_batch)."""
    flags = getattr(info, ATTR, None)
    if flags is not None:
        setattr(info, ATTR, [flags[i] for i in keep_indices])
    return result


def merge_hook(result, info, other):
    """AFTER SamplingBatchInfo.adjusted_merge_batch (called last in merge_batch, when `info`
    already has the merged length)."""
    mine, theirs = getattr(info, ATTR, None), getattr(other, ATTR, None)
    if mine is None and theirs is None:
        return result
    num_other = len(other)
    mine = mine if mine is not None else [False] * (len(info) - num_other)
    theirs = theirs if theirs is not None else [False] * num_other
    setattr(info, ATTR, mine + theirs)
    return result


def copy_hook(result, info, *args, **kwargs):
    """AFTER SamplingBatchInfo.copy_for_forward: dataclasses.replace copies fields only."""
    flags = getattr(info, ATTR, None)
    if flags is not None:
        setattr(result, ATTR, list(flags))
    return result
