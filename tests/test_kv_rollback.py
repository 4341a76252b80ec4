"""`kv_rollback` on fake SGLang objects: which KV slots a truncation frees, and which lengths move.

Slots of request row `ROW` are numbered 100 + position, so a freed slot names its position."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from llm42.sglang import kv_rollback

ROW = 1  # the request's row in req_to_token
P = 3  # prompt length


def _setup(n: int, committed: int, logprobs: int | None = None, in_batch: bool = True):
    freed = []
    req_to_token = torch.zeros((2, 32), dtype=torch.int32)
    req_to_token[ROW] = torch.arange(100, 132, dtype=torch.int32)
    scheduler = SimpleNamespace(
        req_to_token_pool=SimpleNamespace(req_to_token=req_to_token),
        token_to_kv_pool_allocator=SimpleNamespace(free=lambda slots: freed.extend(slots.tolist())),
        future_map=SimpleNamespace(output_tokens_buf=torch.zeros(4, dtype=torch.int64)))
    lp = None if logprobs is None else SimpleNamespace(**{
        name: list(range(logprobs)) for name in kv_rollback._LOGPROB_LISTS})
    req = SimpleNamespace(
        output_ids=list(range(10, 10 + n)), origin_input_ids=[1] * P, req_pool_idx=ROW,
        kv=SimpleNamespace(kv_allocated_len=committed), kv_committed_len=committed,
        decode_batch_idx=n, logprob=lp)
    other = SimpleNamespace()
    seq_lens = torch.tensor([7, committed])
    batch = SimpleNamespace(reqs=[other, req] if in_batch else [other], seq_lens=seq_lens,
                            seq_lens_cpu=seq_lens.clone(), orig_seq_lens=None, seq_lens_sum=9)
    return scheduler, req, batch, freed


TRUNCATIONS = [
    # (n, kv_committed_len, new_len) -> freed positions
    (5, P + 4, 2, [P + 1, P + 2, P + 3]),  # o_2..o_4 go; the KV of o_0 and o_1 stays
    (5, P + 4, 4, [P + 3]),  # only the last token: its predecessor's KV goes
    (5, P + 5, 2, [P + 1, P + 2, P + 3, P + 4]),  # overlap built the next batch: one slot more
    (5, P + 4, 5, []),  # nothing to drop
    (5, P + 4, 9, []),  # longer than the output: nothing to drop
]


@pytest.mark.parametrize(("n", "committed", "new_len", "freed_positions"), TRUNCATIONS)
def test_truncate_output_frees_exactly_the_dropped_tokens_kv(n, committed, new_len,
                                                             freed_positions):
    scheduler, req, batch, freed = _setup(n, committed, logprobs=n)
    seq_lens = batch.seq_lens
    assert kv_rollback.truncate_output(scheduler, req, new_len, batch) == max(n - new_len, 0)
    assert freed == [100 + p for p in freed_positions]
    num = len(freed_positions)
    assert req.output_ids == list(range(10, 10 + min(n, new_len)))
    assert (req.kv_committed_len, req.kv.kv_allocated_len) == (committed - num, committed - num)
    assert req.decode_batch_idx == n - num
    assert batch.seq_lens.tolist() == [7, committed - num], "only the request's own row shrinks"
    assert batch.seq_lens_cpu.tolist() == [7, committed - num]
    assert seq_lens.tolist() == [7, committed], "rebound, never edited in place (aliased)"
    assert batch.seq_lens_sum == (None if num else 9)
    assert all(len(getattr(req.logprob, name)) == min(n, new_len)
               for name in kv_rollback._LOGPROB_LISTS)


def test_truncate_output_of_a_request_without_kv_cuts_only_the_lists():
    # a retraction released the KV before the restart cuts the output
    scheduler, req, batch, freed = _setup(5, P + 4)
    req.req_pool_idx = None
    assert kv_rollback.truncate_output(scheduler, req, 0, batch) == 5
    assert (freed, req.output_ids, req.kv_committed_len) == ([], [], P + 4)


def test_truncate_output_of_a_request_not_in_the_batch_leaves_the_batch_alone():
    scheduler, req, batch, freed = _setup(5, P + 4, in_batch=False)
    kv_rollback.truncate_output(scheduler, req, 3, batch)
    assert freed == [100 + P + 2, 100 + P + 3] and batch.seq_lens.tolist() == [7, P + 4]


@pytest.mark.parametrize(("index", "freed_positions"), [
    (2, [P + 2, P + 3]),  # mismatch at o_2: keep o_0, o_1 (and o_1's KV), o_2 corrected
    (4, []),  # mismatch at the last token: it has no KV yet, only the token changes
])
def test_replace_tail_keeps_the_prefix_and_relays_the_corrected_token(index, freed_positions):
    scheduler, req, batch, freed = _setup(5, P + 4)
    assert kv_rollback.replace_tail(scheduler, req, index, 77, batch) == 4 - index
    assert req.output_ids == [*range(10, 10 + index), 77]
    assert freed == [100 + p for p in freed_positions]
    assert scheduler.future_map.output_tokens_buf[ROW] == 77, "the next decode input"


@pytest.mark.parametrize(("lengths", "new_len", "expected"), [
    ({"output_token_logprobs_val": 4}, 2, {"output_token_logprobs_val": 2}),  # cut
    ({"output_token_logprobs_val": 1}, 2, {"output_token_logprobs_val": 1}),  # shorter: kept
    ({"output_top_logprobs_val": 3, "output_token_ids_logprobs_val": None}, 0,
     {"output_top_logprobs_val": 0, "output_token_ids_logprobs_val": None}),  # None stays None
])
def test_truncate_logprobs(lengths, new_len, expected):
    lp = SimpleNamespace(**{k: None if v is None else list(range(v)) for k, v in lengths.items()})
    kv_rollback.truncate_logprobs(SimpleNamespace(logprob=lp), new_len)
    assert {k: None if (v := getattr(lp, k)) is None else len(v) for k in lengths} == expected
    kv_rollback.truncate_logprobs(SimpleNamespace(logprob=None), 0)  # no logprobs asked: no-op
