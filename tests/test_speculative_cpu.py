"""Plain SGLang speculative decoding on CPU through llm42's compat shims (issue 37, part 1).

The plain-torch sgl-kernel speculative ops (`llm42/compat/sgl_kernel/speculative.py`) by hand and
against SGLang's own Triton kernels (run in Triton's interpreter) and NGRAM host reference; the
torch_native verify and draft-decode attention (`spec_attention.py`) against torch_native's own
extend / decode and a float64 reference; the draft-backend and NGRAM-build hooks; and real NGRAM,
STANDALONE and EAGLE (topk 1) servers, whose greedy outputs equal a non-speculative server's.

The servers run the tiny Llama in true float32 (`--dtype float32`: SGLang's `auto` serves a
float32 checkpoint in float16). Verify and decode then compute each logit alike up to float32
rounding (logprobs differ by a few 1e-6), so greedy tokens are equal for every prompt tried and
`LOGPROB_TOL` is 1e-4: a wrong mask, position or KV slot moves logprobs by far more. In float16
or bfloat16 the same servers differ at near-ties, as SGLang's prefill and decode do.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import wait_idle_and_healthy
from helpers import concurrently, generate

from llm42.compat import ngram_build, spec_draft_backends
from llm42.compat.sgl_kernel import speculative as ops

ROOT = Path(__file__).resolve().parents[1]
LOGPROB_TOL = 1e-4
MAX_NEW_TOKENS = 24
PROMPTS = [
    "one two three one two three one two three one two",  # repetitive: NGRAM drafts match
    "The quick brown fox jumps over the lazy dog because",
    "def fibonacci(n):",
    "Once upon a time there was a small village where",
    "The capital of France is",
    "List three reasons why the sky is blue:",
]


# -- the plain-torch ops, by hand ---------------------------------------------------------------
def _chain_links(n: int):
    """A chain root -> 1 -> ... -> n-1 as SGLang's retrieve tensors (one request)."""
    next_token = [[*range(1, n), -1]]
    return torch.tensor([list(range(n))]), torch.tensor(next_token), torch.full((1, n), -1)


def _fork_links():
    """root -> {1, 2}, 2 -> 3: node 1 is the root's first child, node 2 its next sibling."""
    return (
        torch.tensor([[0, 1, 2, 3]]),
        torch.tensor([[1, -1, 3, -1]]),
        torch.tensor([[-1, 2, -1, -1]]),
    )


CHAIN_DRAFTS = [10, 11, 12, 13]  # node 0 is the root (the last verified token)
FORK_DRAFTS = [20, 21, 22, 23]


@pytest.mark.parametrize(
    "links, drafts, target, accepted, num_correct, predicted",
    [
        # the target agrees after the root and node 1, not after node 2 (its 99 is the bonus)
        (_chain_links(4), CHAIN_DRAFTS, [11, 12, 99, 7], [0, 1, 2, -1], 2, {0: 11, 1: 12, 2: 99}),
        # the first draft already wrong: only the root; the target's token is the bonus
        (_chain_links(4), CHAIN_DRAFTS, [50, 12, 13, 7], [0, -1, -1, -1], 0, {0: 50}),
        # every draft right: the bonus comes after the last node
        (
            _chain_links(4),
            CHAIN_DRAFTS,
            [11, 12, 13, 14],
            [0, 1, 2, 3],
            3,
            {0: 11, 1: 12, 2: 13, 3: 14},
        ),
        # node 1 (21) wrong, its sibling node 2 (22) right, then node 3 (23) right
        (_fork_links(), FORK_DRAFTS, [22, 5, 23, 8], [0, 2, 3, -1], 2, {0: 22, 2: 23, 3: 8}),
    ],
    ids=["chain-mismatch-at-3", "chain-first-wrong", "chain-all-right", "fork-sibling"],
)
def test_verify_tree_greedy_accepts_the_longest_matching_path(
    links, drafts, target, accepted, num_correct, predicted
):
    retrive_index, next_token, next_sibling = links
    predicts = torch.zeros(4, dtype=torch.int32)
    accept_index = torch.full((1, 4), -1, dtype=torch.int32)
    accept_num = torch.zeros(1, dtype=torch.int32)
    ops.verify_tree_greedy_cpu(
        predicts,
        accept_index,
        accept_num,
        torch.tensor([drafts]),
        retrive_index,
        next_token,
        next_sibling,
        torch.tensor([target]),
    )
    assert accept_index.tolist() == [accepted]
    assert accept_num.tolist() == [num_correct]
    assert predicts.tolist() == [predicted.get(i, 0) for i in range(4)]


def test_reconstruct_indices_from_tree_mask_by_hand():
    # Two requests: the fork root -> {1, 2}, 2 -> 3, and a chain of four.
    fork = [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]]
    chain = torch.ones(4, 4).tril().int().tolist()
    mask = torch.tensor([fork, chain], dtype=torch.bool).flatten()
    seq_lens = torch.tensor([10, 3])
    positions = torch.empty(8, dtype=torch.int64)
    outs = [torch.empty((2, 4), dtype=torch.int64) for _ in range(3)]
    ops.reconstruct_indices_from_tree_mask(mask, seq_lens, positions, *outs, 2, 4)
    assert positions.tolist() == [10, 11, 11, 12, 3, 4, 5, 6]
    assert outs[0].tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]  # flat node index
    assert outs[1].tolist() == [[1, -1, 3, -1], [1, 2, 3, -1]]  # first child
    assert outs[2].tolist() == [[-1, 2, -1, -1], [-1, -1, -1, -1]]  # next sibling


@pytest.mark.parametrize("mode", [0, 1], ids=["full-mask", "qlen-only"])
def test_build_tree_of_a_topk1_chain_by_hand(mode):
    # SGLang's topk-1 bookkeeping (base_spec_worker's preallocated chain): parents [-1, 0, 1],
    # selected [0, 1, 2] for 3 steps, i.e. the chain root -> 1 -> 2 -> 3.
    bs, n, seq_lens = 2, 4, [5, 2]
    parents = torch.arange(-1, 2).repeat(bs, 1)
    selected = torch.arange(3).repeat(bs, 1)
    size = bs * n * n + (sum(seq_lens) * n if mode == 0 else 0)
    mask = torch.ones(size, dtype=torch.bool)
    positions = torch.empty(bs * n, dtype=torch.int64)
    retrive = torch.full((3, bs, n), -1, dtype=torch.int64)
    ops.build_tree_kernel_efficient_cpu(
        parents, selected, torch.tensor(seq_lens), mask, positions, *retrive, 1, 3, n, mode
    )
    assert positions.tolist() == [5, 6, 7, 8, 2, 3, 4, 5]
    assert retrive[0].tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert retrive[1].tolist() == [[1, 2, 3, -1]] * 2
    assert retrive[2].tolist() == [[-1] * 4] * 2
    from llm42.compat.spec_attention import tree_masks

    for got in tree_masks(mask, seq_lens, n):
        assert torch.equal(got, torch.ones(n, n, dtype=torch.bool).tril())
    if mode == 0:  # rows of seq_len + n columns: the prefix columns stay as the caller filled them
        first = mask[: n * (seq_lens[0] + n)].view(n, seq_lens[0] + n)
        assert first[:, : seq_lens[0]].all()


def test_cache_location_ops_by_hand():
    req_to_token = torch.arange(3 * 16, dtype=torch.int32).view(3, 16) + 100  # slot = 100 + 16r + c
    rows, starts = torch.tensor([2, 0]), torch.tensor([3, 5])
    out = torch.empty(5, dtype=torch.int64)
    ops.assign_extend_cache_locs_cpu(
        rows, req_to_token, starts, starts + torch.tensor([2, 3]), out, 16
    )
    assert out.tolist() == [135, 136, 105, 106, 107]
    draft = torch.empty(8, dtype=torch.int64)  # topk 2 x 2 steps per request
    ops.assign_draft_cache_locs_contiguous_cpu(rows, req_to_token, starts, draft, 16, 2, 2)
    assert draft.tolist() == [135, 136, 137, 138, 105, 106, 107, 108]
    table = ops.build_draft_decode_metadata_cpu(req_to_token, rows, starts, 2, 2, 16)
    assert table[0, :5].tolist() == [132, 133, 134, 135, 136]  # prefix, branch 0's drafts
    assert table[1, :5].tolist() == [132, 133, 134, 137, 138]  # prefix, branch 1's drafts
    assert table[3, :7].tolist() == [100, 101, 102, 103, 104, 107, 108]
    accepted = torch.empty(3, dtype=torch.int64)
    ops.fill_accept_out_cache_loc_cpu(
        torch.tensor([[0, 2, -1], [3, -1, -1]], dtype=torch.int32),
        torch.tensor([40, 41, 42, 43, 44, 45]),
        accepted,
    )
    assert accepted.tolist() == [40, 42, 43]
    bonus = torch.empty(2, dtype=torch.int32)
    ops.fill_bonus_tokens_cpu(
        torch.tensor([7, 8, 9, 1, 2, 3], dtype=torch.int32),
        torch.tensor([2, 3], dtype=torch.int32),
        bonus,
        3,
    )
    assert bonus.tolist() == [8, 3]


def test_the_stand_in_exports_what_sglang_imports():
    import llm42.compat.sgl_kernel as stand_in

    for name in (
        "assign_extend_cache_locs_cpu",
        "assign_draft_cache_locs_contiguous_cpu",
        "build_tree_kernel_efficient_cpu",
        "verify_tree_greedy_cpu",
        "fill_accept_out_cache_loc_cpu",
        "fill_bonus_tokens_cpu",
    ):
        assert getattr(stand_in, name) is getattr(ops, name), name
    with pytest.raises(ValueError, match="BITPACKING"):
        ops.build_tree_kernel_efficient_cpu(*[torch.zeros(1)] * 8, 1, 2, 2, 2)


# -- the ops against SGLang's references ---------------------------------------------------------
_REFERENCE_SCRIPT = r"""
import numpy as np, torch
import sgl_kernel
from sgl_kernel import speculative as ops  # SGLang's import path, resolved to llm42's stand-in
from sglang.kernels.ops.speculative.cache_locs import (
    assign_draft_cache_locs_contiguous, assign_extend_cache_locs)
from sglang.kernels.ops.speculative.eagle import fill_accept_out_cache_loc, fill_bonus_tokens
from sglang.kernels.ops.speculative.spec_tree import (
    sgl_build_tree_kernel_efficient_triton, verify_tree_greedy_kernel_triton)
from sglang.srt.speculative.eagle_utils import organize_draft_results
from sglang.srt.speculative.ngram_worker import _derive_tree_links
from sglang.srt.speculative.spec_utils import select_top_k_tokens

assert sgl_kernel.IS_LLM42_STAND_IN and ops.__name__ == "sgl_kernel.speculative"
g = torch.Generator().manual_seed(0)
checked = []

def same(name, want, got):
    assert torch.equal(want, got), f"{name}:\nSGLang {want.tolist()}\nllm42  {got.tolist()}"
    checked.append(name)

# cache locations
bs, pool_len = 4, 64
req_to_token = torch.randint(0, 10_000, (6, pool_len), generator=g, dtype=torch.int32)
rows, start = torch.tensor([3, 0, 5, 1]), torch.tensor([5, 0, 17, 40])
end = start + torch.tensor([4, 7, 0, 3])
want, got = (torch.full((14,), -1, dtype=torch.int64) for _ in range(2))
assign_extend_cache_locs[(bs,)](rows, req_to_token, start, end, want, pool_len, 4)
ops.assign_extend_cache_locs_cpu(rows, req_to_token, start, end, got, pool_len)
same("assign_extend_cache_locs", want, got)
for topk, steps in ((1, 3), (2, 3), (4, 2)):
    want, got = (torch.empty(bs * topk * steps, dtype=torch.int64) for _ in range(2))
    assign_draft_cache_locs_contiguous[(bs,)](rows, req_to_token, start, want, pool_len, topk, steps)
    ops.assign_draft_cache_locs_contiguous_cpu(rows, req_to_token, start, got, pool_len, topk, steps)
    same(f"assign_draft_cache_locs_contiguous topk={topk}", want, got)

# accepted tokens: bonus and compacted KV slots
stride = 5
accept_lens = torch.randint(1, stride + 1, (bs,), generator=g, dtype=torch.int32)
accept_tokens = torch.randint(0, 1000, (bs * stride,), generator=g, dtype=torch.int32)
want, got = (torch.empty(bs, dtype=torch.int32) for _ in range(2))
fill_bonus_tokens[(bs,)](accept_tokens, accept_lens, want, stride)
ops.fill_bonus_tokens_cpu(accept_tokens, accept_lens, got, stride)
same("fill_bonus_tokens", want, got)
accept_index = torch.full((bs, stride), -1, dtype=torch.int32)
for b, n_acc in enumerate(accept_lens.tolist()):
    accept_index[b, :n_acc] = b * 8 + torch.randperm(8, generator=g)[:n_acc].sort().values
out_cache_loc = torch.randint(0, 10_000, (bs * 8,), generator=g)
want, got = (torch.full((int(accept_lens.sum()),), -1, dtype=torch.int64) for _ in range(2))
fill_accept_out_cache_loc[(bs * stride,)](accept_index, out_cache_loc, want, 32)
ops.fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, got)
same("fill_accept_out_cache_loc", want, got)

# EAGLE trees from SGLang's own draft bookkeeping over random draft distributions
def draft_tree(bs, topk, steps, n, vocab=40):
    probs = torch.softmax(torch.randn(bs, vocab, generator=g), -1)
    topk_p, topk_index = probs.topk(topk, dim=-1)
    hidden, scores, lists = torch.zeros(bs, 1), None, ([], [], [])
    for i in range(steps):
        _, hidden, scores, info = select_top_k_tokens(i, topk_p, topk_index, hidden, scores, topk)
        for lst, item in zip(lists, info[:3]):
            lst.append(item)
        probs = torch.softmax(torch.randn(bs * topk, vocab, generator=g), -1)
        topk_p, topk_index = probs.topk(topk, dim=-1)
    return organize_draft_results(*lists, n)

for topk, steps, n in ((1, 3, 4), (2, 3, 6), (4, 4, 8), (3, 2, 4)):
    bs = 3
    parent_list, selected, draft_tokens = draft_tree(bs, topk, steps, n)
    seq_lens = torch.randint(1, 9, (bs,), generator=g)
    for mode in (0, 1):
        size = bs * n * n + (int(seq_lens.sum()) * n if mode == 0 else 0)
        outs = []
        for impl in ("triton", "llm42"):
            mask = torch.ones(size, dtype=torch.bool)
            positions = torch.full((bs * n,), -7, dtype=torch.int64)
            retrive = torch.full((3, bs, n), -1, dtype=torch.int64)
            if impl == "triton":
                sgl_build_tree_kernel_efficient_triton[(bs,)](
                    parent_list, selected, seq_lens, torch.cumsum(seq_lens, 0) - seq_lens, mask,
                    positions, *retrive, topk=topk, depth=steps, draft_token_num=n,
                    tree_mask_mode=mode, batch_size=bs,
                    parent_list_stride=parent_list.stride(0),
                    selected_index_stride=selected.stride(0))
            else:
                ops.build_tree_kernel_efficient_cpu(parent_list, selected, seq_lens, mask,
                                                    positions, *retrive, topk, steps, n, mode)
            outs.append((mask, positions, retrive))
        for name, want, got in zip(("mask", "positions", "retrieve"), *outs):
            same(f"build_tree topk={topk} steps={steps} mode={mode} {name}", want, got)
    # greedy verify on that tree: the target agrees with a random child (or nobody) per node
    mask, positions, (retrive_index, next_token, next_sibling) = outs[1]
    candidates = torch.cat([torch.randint(0, 40, (bs, 1), generator=g), draft_tokens], 1)
    target = torch.randint(40, 80, (bs, n), generator=g)
    for b in range(bs):
        for node in range(n):
            children, child = [], int(next_token[b, node])
            while child != -1:
                children.append(child)
                child = int(next_sibling[b, child])
            if children and torch.rand(1, generator=g).item() < 0.8:
                pick = children[int(torch.randint(len(children), (1,), generator=g))]
                target[b, node] = candidates[b, pick]
    outs = []
    for impl in ("triton", "llm42"):
        predicts = torch.zeros(bs * n, dtype=torch.int32)
        accept_index = torch.full((bs, steps + 1), -1, dtype=torch.int32)
        accept_num = torch.zeros(bs, dtype=torch.int32)
        args = (predicts, accept_index, accept_num, candidates, retrive_index, next_token,
                next_sibling, target)
        if impl == "triton":
            verify_tree_greedy_kernel_triton[(bs,)](*args, batch_size=bs,
                                                    num_speculative_tokens=steps + 1,
                                                    num_draft_tokens=n)
        else:
            ops.verify_tree_greedy_cpu(*args)
        outs.append((predicts, accept_index, accept_num))
    for name, want, got in zip(("predicts", "accept_index", "accept_num"), *outs):
        same(f"verify_tree_greedy topk={topk} {name}", want, got)
    assert outs[1][2].sum() > 0, "no draft accepted: the verify check is vacuous"

# NGRAM: links from random ancestor masks against SGLang's host derivation
bs, n = 4, 8
parents = [[-1] + [int(torch.randint(i, (1,), generator=g)) for i in range(1, n)]
           for _ in range(bs)]
mask = torch.zeros(bs, n, n, dtype=torch.bool)
depth = torch.zeros(bs, n, dtype=torch.int64)
for b in range(bs):
    for i in range(n):
        j = i
        while j != -1:
            mask[b, i, j] = True
            j = parents[b][j]
        depth[b, i] = int(mask[b, i].sum()) - 1
seq_lens = torch.randint(1, 50, (bs,), generator=g)
positions = torch.empty(bs * n, dtype=torch.int64)
retrive = torch.empty((3, bs, n), dtype=torch.int64)
ops.reconstruct_indices_from_tree_mask(mask.flatten(), seq_lens, positions, *retrive, bs, n)
want_next, want_sibling = _derive_tree_links(mask.flatten().numpy(), bs, n)
same("reconstruct next_token", want_next, retrive[1])
same("reconstruct next_sibling", want_sibling, retrive[2])
same("reconstruct positions", (seq_lens[:, None] + depth).flatten(), positions)
same("reconstruct retrive_index", torch.arange(bs * n).view(bs, n), retrive[0])
print("checked", len(checked))
"""


def test_ops_equal_sglangs_triton_kernels_and_ngram_host_reference():
    """SGLang's Triton kernels of the same names, in Triton's interpreter on CPU tensors, on trees
    that SGLang's own draft bookkeeping builds; NGRAM links against `ngram_worker`'s host
    derivation (documented there as matching the device kernel)."""
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "SGLANG_USE_CPU_ENGINE": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(
        [sys.executable, "-c", _REFERENCE_SCRIPT],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "checked 46" in done.stdout, done.stdout


# -- attention: verify and multi-step draft decode on torch_native -----------------------------
HEADS, KV_HEADS, HEAD_DIM, SLOTS = 4, 2, 8, 96


def _layer():
    from sglang.srt.layers.radix_attention import AttentionType

    return SimpleNamespace(
        layer_id=0,
        tp_q_head_num=HEADS,
        tp_k_head_num=KV_HEADS,
        tp_v_head_num=KV_HEADS,
        qk_head_dim=HEAD_DIM,
        head_dim=HEAD_DIM,
        v_head_dim=HEAD_DIM,
        scaling=HEAD_DIM**-0.5,
        logit_cap=0.0,
        is_cross_attention=False,
        sliding_window_size=-1,
        attn_type=AttentionType.DECODER,
        k_scale=None,
        v_scale=None,
    )


def _runner(seed: int):
    """SGLang's real pools on CPU: random KV in every slot, an empty request-to-token table."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool

    gen = torch.Generator().manual_seed(seed)
    kv = MHATokenToKVPool(SLOTS, 1, torch.float32, KV_HEADS, HEAD_DIM, 1, "cpu", False)
    kv.get_key_buffer(0).copy_(torch.randn(kv.get_key_buffer(0).shape, generator=gen))
    kv.get_value_buffer(0).copy_(torch.randn(kv.get_value_buffer(0).shape, generator=gen))
    return SimpleNamespace(
        device="cpu", token_to_kv_pool=kv, req_to_token_pool=ReqToTokenPool(4, 64, "cpu", False)
    ), gen


def _reference(q, keys, values):
    """float64 attention of q (HEADS, D) over keys / values (L, KV_HEADS, D), GQA by groups."""
    group = HEADS // KV_HEADS
    k = keys.double().repeat_interleave(group, 1)  # (L, HEADS, D)
    v = values.double().repeat_interleave(group, 1)
    weights = torch.softmax(torch.einsum("hd,lhd->hl", q.double(), k) * HEAD_DIM**-0.5, -1)
    return torch.einsum("hl,lhd->hd", weights, v)


def _verify_setup(masks: list[torch.Tensor], seq_lens: list[int]):
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    runner, gen = _runner(0)
    n = masks[0].shape[0]
    rows = [3, 1]
    slots = torch.randperm(SLOTS, generator=gen)
    table = runner.req_to_token_pool.req_to_token
    used = 0
    for row, seq_len in zip(rows, seq_lens):
        table[row, : seq_len + n] = slots[used : used + seq_len + n].to(torch.int32)
        used += seq_len + n
    out_cache_loc = torch.cat([table[r, s : s + n] for r, s in zip(rows, seq_lens)]).long()
    batch = SimpleNamespace(
        forward_mode=ForwardMode.TARGET_VERIFY,
        seq_lens=torch.tensor(seq_lens),
        req_pool_indices=torch.tensor(rows),
        out_cache_loc=out_cache_loc,
        spec_info=SimpleNamespace(draft_token_num=n, custom_mask=torch.stack(masks).flatten()),
    )
    num_q = len(rows) * n
    q = torch.randn(num_q, HEADS * HEAD_DIM, generator=gen)
    k = torch.randn(num_q, KV_HEADS, HEAD_DIM, generator=gen)
    v = torch.randn(num_q, KV_HEADS, HEAD_DIM, generator=gen)
    return TorchNativeAttnBackend(runner), batch, q, k, v


def test_verify_attention_on_a_tree_sees_exactly_each_nodes_ancestors():
    from llm42.compat.spec_attention import verify_forward_extend

    fork = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    chain = torch.ones(4, 4, dtype=torch.bool).tril()
    seq_lens = [5, 3]
    backend, batch, q, k, v = _verify_setup([fork, chain], seq_lens)
    out = verify_forward_extend(None, backend, q, k, v, _layer(), batch)
    keys = backend.token_to_kv_pool.get_key_buffer(0)
    values = backend.token_to_kv_pool.get_value_buffer(0)
    assert torch.equal(keys[batch.out_cache_loc], k), "draft K not written at out_cache_loc"
    table = backend.req_to_token_pool.req_to_token
    for b, (row, seq_len, mask) in enumerate(zip([3, 1], seq_lens, [fork, chain])):
        for node in range(4):
            visible = list(range(seq_len)) + [seq_len + j for j in range(4) if mask[node, j]]
            slots = table[row, visible].long()
            i = b * 4 + node
            want = _reference(q[i].view(HEADS, HEAD_DIM), keys[slots], values[slots])
            got = out[i].view(HEADS, HEAD_DIM).double()
            assert torch.allclose(got, want, atol=1e-5), f"request {b} node {node}"


def test_verify_attention_on_a_chain_equals_torch_natives_causal_extend():
    """A topk-1 chain is a causal extend of n tokens after the prefix: SGLang's own
    `_run_sdpa_forward_extend` is the reference. Other modes reach SGLang's code unchanged."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from llm42.compat.spec_attention import verify_forward_extend

    chain = torch.ones(4, 4, dtype=torch.bool).tril()
    backend, batch, q, k, v = _verify_setup([chain, chain], [6, 2])
    out = verify_forward_extend(None, backend, q, k, v, _layer(), batch)
    want = torch.empty_like(out).view(-1, HEADS, HEAD_DIM)
    backend._run_sdpa_forward_extend(
        q.view(-1, HEADS, HEAD_DIM),
        want,
        backend.token_to_kv_pool.get_key_buffer(0),
        backend.token_to_kv_pool.get_value_buffer(0),
        backend.req_to_token_pool.req_to_token,
        batch.req_pool_indices,
        batch.seq_lens + 4,
        batch.seq_lens,
        torch.tensor([4, 4]),
        scaling=HEAD_DIM**-0.5,
        enable_gqa=True,
        causal=True,
    )
    assert torch.allclose(out, want.view_as(out), atol=1e-6)
    batch.forward_mode = ForwardMode.EXTEND
    calls = []
    verify_forward_extend(lambda *a: calls.append(a) or "sglang", backend, q, k, v, _layer(), batch)
    assert len(calls) == 1 and calls[0][0] is backend


@pytest.mark.parametrize("topk", [1, 2])
def test_draft_decode_steps_attend_to_the_prefix_and_their_branch(topk):
    """Step i of branch t (written at seq_len + t * steps + i) sees the prefix, its branch's
    drafts 0..i, nothing of other branches; topk 1 also equals torch_native's own decode."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from llm42.compat.spec_attention import TorchNativeMultiStepDraftBackend

    runner, gen = _runner(1)
    steps, rows, seq_lens = 3, [2, 0], [4, 7]
    table = runner.req_to_token_pool.req_to_token
    slots = torch.randperm(SLOTS, generator=gen)
    used = 0
    for row, seq_len in zip(rows, seq_lens):
        width = seq_len + topk * steps
        table[row, :width] = slots[used : used + width].to(torch.int32)
        used += width
    multi = TorchNativeMultiStepDraftBackend(runner, topk, steps)
    assert len(multi.attn_backends) == steps - 1
    batch = SimpleNamespace(
        forward_mode=ForwardMode.DECODE,
        req_pool_indices=torch.tensor(rows),
        seq_lens=torch.tensor(seq_lens),
    )
    multi.init_forward_metadata(batch)
    keys = runner.token_to_kv_pool.get_key_buffer(0)
    values = runner.token_to_kv_pool.get_value_buffer(0)
    for step, backend in enumerate(multi.attn_backends):
        batch.out_cache_loc = torch.tensor(
            [
                int(table[r, s + t * steps + step])
                for r, s in zip(rows, seq_lens)
                for t in range(topk)
            ]
        )
        q = torch.randn(len(rows) * topk, HEADS * HEAD_DIM, generator=gen)
        k = torch.randn(len(rows) * topk, KV_HEADS, HEAD_DIM, generator=gen)
        v = torch.randn(len(rows) * topk, KV_HEADS, HEAD_DIM, generator=gen)
        out = backend.forward(q, k, v, _layer(), batch)
        for b, (row, seq_len) in enumerate(zip(rows, seq_lens)):
            for t in range(topk):
                cols = list(range(seq_len)) + [seq_len + t * steps + i for i in range(step + 1)]
                visible = table[row, cols].long()
                i = b * topk + t
                want = _reference(q[i].view(HEADS, HEAD_DIM), keys[visible], values[visible])
                assert torch.allclose(out[i].view(HEADS, HEAD_DIM).double(), want, atol=1e-5), (
                    f"step {step} request {b} branch {t}"
                )
        if topk == 1:
            want = torch.empty(len(rows), HEADS, HEAD_DIM)
            backend._run_sdpa_forward_decode(
                q.view(-1, HEADS, HEAD_DIM),
                want,
                keys,
                values,
                table,
                batch.req_pool_indices,
                batch.seq_lens + step + 1,
                scaling=HEAD_DIM**-0.5,
                enable_gqa=True,
            )
            assert torch.allclose(out, want.view_as(out), atol=1e-6)


def test_tree_masks_reads_both_layouts_and_rejects_others():
    from llm42.compat.spec_attention import tree_masks

    fork = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    qlen = torch.stack([fork, fork.T]).flatten()
    assert [m.tolist() for m in tree_masks(qlen, [2, 5], 3)] == [fork.tolist(), fork.T.tolist()]
    full = torch.cat(
        [
            torch.cat([torch.ones(3, s, dtype=torch.bool), m], 1).flatten()
            for s, m in ((2, fork), (5, fork.T))
        ]
    )
    assert [m.tolist() for m in tree_masks(full, [2, 5], 3)] == [fork.tolist(), fork.T.tolist()]
    assert tree_masks(None, [2], 3)[0].tolist() == torch.ones(3, 3).tril().bool().tolist()
    with pytest.raises(ValueError, match="QLEN layout"):
        tree_masks(torch.ones(7, dtype=torch.bool), [2, 5], 3)


# -- hooks ---------------------------------------------------------------------------------------
def _factory(backend: str, draft_backend: str | None = None, steps: int = 3):
    args = SimpleNamespace(
        attention_backend=backend, decode_attention_backend=None, prefill_attention_backend=None
    )
    return SimpleNamespace(
        server_args=args,
        draft_attn_backend=draft_backend,
        topk=1,
        speculative_num_steps=steps,
        draft_model_runner=object(),
    )


def test_draft_backend_hooks_answer_torch_native_and_leave_the_rest_to_sglang(monkeypatch):
    from llm42.compat import spec_attention

    made = []
    monkeypatch.setattr(
        spec_attention, "TorchNativeMultiStepDraftBackend", lambda *a: made.append(a) or "ours"
    )
    assert spec_draft_backends.create_decode_backend(None, _factory("torch_native")) == "ours"
    assert made[0][1:] == (1, 3)
    for factory in (
        _factory("triton"),
        _factory("torch_native", steps=1),
        _factory("torch_native", draft_backend="intel_amx"),
    ):
        assert spec_draft_backends.create_decode_backend(lambda f: "sglang", factory) == "sglang"
    monkeypatch.setattr(
        "sglang.srt.runtime_context.get_spec",
        lambda: SimpleNamespace(speculative_attention_mode="prefill"),
    )
    original = spec_draft_backends.create_draft_extend_backend(
        lambda f: "sglang", _factory("intel_amx")
    )
    assert original == "sglang"
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    factory = _factory("torch_native")
    factory.draft_model_runner, _ = _runner(2)
    factory.draft_model_runner.model_config = SimpleNamespace(hf_config=object())
    extend = spec_draft_backends.create_draft_extend_backend(None, factory)
    assert type(extend) is TorchNativeAttnBackend
    assert extend.token_to_kv_pool is factory.draft_model_runner.token_to_kv_pool


def test_ngram_build_force_includes_cstddef_for_the_ngram_table_only():
    seen = []

    def load_jit(*args, **kwargs):
        seen.append((args, kwargs))

    ngram_build.load_jit(load_jit, "ngram_corpus", cpp_files=["a.cpp"], extra_cflags=["-O1"])
    ngram_build.load_jit(load_jit, "other", cpp_files=["b.cpp"])
    assert seen[0] == (
        ("ngram_corpus",),
        {"cpp_files": ["a.cpp"], "extra_cflags": ["-O1", "-include", "cstddef"]},
    )
    assert seen[1] == (("other",), {"cpp_files": ["b.cpp"]})


# -- real servers --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def spec_servers(tmp_path_factory):
    """A non-speculative server and NGRAM, STANDALONE (the target as its own draft, no radix
    cache) and EAGLE (random one-layer draft, SGLang's normal event loop) servers of one float32 tiny Llama,
    started at once. The NGRAM server builds its C++ table in an empty tvm-ffi cache: the build
    fix is exercised on every run."""
    from llm42.models import write_random_eagle_draft, write_random_llama
    from llm42.server_process import SGLangServer

    root = tmp_path_factory.mktemp("spec")
    model = write_random_llama(
        root / "tiny",
        preset="tiny",
        seed=0,
        std=0.05,
        dtype="float32",
        overrides={"hidden_size": 256, "intermediate_size": 512},
    )
    eagle = write_random_eagle_draft(root / "eagle", base_dir=model, seed=1)
    common = [
        "--dtype",
        "float32",
        "--max-total-tokens",
        "4096",
        "--context-length",
        "512",
        "--random-seed",
        "7",
    ]
    chain = [
        "--speculative-num-steps",
        "3",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "4",
    ]
    configs = {
        "plain": ([], {}),
        "ngram": (
            ["--speculative-algorithm", "NGRAM"],
            {"TVM_FFI_CACHE_DIR": str(root / "tvm-ffi")},
        ),
        "standalone": (
            [
                "--speculative-algorithm",
                "STANDALONE",
                "--speculative-draft-model-path",
                model,
                *chain,
                "--disable-radix-cache",
            ],
            {},
        ),
        "eagle": (
            [
                "--speculative-algorithm",
                "EAGLE",
                "--speculative-draft-model-path",
                eagle,
                *chain,
                "--disable-overlap-schedule",
            ],
            {},
        ),
    }
    servers = {
        name: SGLangServer(
            model, common + args, env=env, startup_timeout=300, log_path=root / f"{name}.log"
        )
        for name, (args, env) in configs.items()
    }
    with ThreadPoolExecutor(len(servers)) as pool:
        started = [pool.submit(s.start) for s in servers.values()]
    try:
        for future in started:
            future.result()
        yield servers
    finally:
        with ThreadPoolExecutor(len(servers)) as pool:
            list(pool.map(lambda server: server.stop(), servers.values()))


@pytest.fixture(scope="module")
def reference(spec_servers):
    """The non-speculative server's greedy outputs (ids, logprobs, meta) per prompt."""
    return [
        generate(spec_servers["plain"].url, p, det=None, max_new_tokens=MAX_NEW_TOKENS)
        for p in PROMPTS
    ]


@pytest.fixture(autouse=True)
def _spec_servers_stay_clean(request):
    """SGLang's strict idle check: a KV slot leaked by speculation kills the scheduler."""
    yield
    if "spec_servers" in request.fixturenames:
        for server in request.getfixturevalue("spec_servers").values():
            wait_idle_and_healthy(server)


@pytest.mark.server
@pytest.mark.parametrize("algorithm", ["ngram", "standalone", "eagle"])
def test_speculative_greedy_outputs_equal_the_target_models(spec_servers, reference, algorithm):
    """Concurrent greedy requests (batched verify, draft and draft-extend passes) return text,
    report SGLang's acceptance fields, and give the non-speculative server's tokens, logprobs
    within LOGPROB_TOL (module docstring)."""
    url = spec_servers[algorithm].url
    results = concurrently(
        [lambda p=p: generate(url, p, det=None, max_new_tokens=MAX_NEW_TOKENS) for p in PROMPTS]
    )
    for prompt, (ref_ids, ref_lps, _), (ids, lps, meta) in zip(PROMPTS, reference, results):
        assert meta["text"] and meta["completion_tokens"] == MAX_NEW_TOKENS, meta
        assert meta["spec_verify_ct"] >= 1 and meta["spec_accept_length"] >= 1.0, meta
        assert "spec_accept_histogram" in meta, meta
        assert ids == ref_ids, f"{algorithm} {prompt!r}: greedy tokens differ\n{ref_ids}\n{ids}"
        worst = max(abs(a - b) for a, b in zip(lps, ref_lps))
        assert worst <= LOGPROB_TOL, f"{algorithm} {prompt!r}: logprobs differ by {worst:.2e}"


@pytest.mark.server
def test_ngram_accepts_drafts_on_a_repeating_prompt(spec_servers):
    """NGRAM's lookup table proposes the continuation of a repeating prompt, and the target
    accepts it: several tokens per verify pass, so accepted drafts' KV slots, positions and bonus
    tokens are what the token-equality test checked."""
    meta = generate(spec_servers["ngram"].url, PROMPTS[0], det=None, max_new_tokens=MAX_NEW_TOKENS)[
        2
    ]
    assert meta["spec_accepted_drafts"] > 0 and meta["spec_accept_length"] > 1.5, meta


@pytest.mark.server
def test_standalone_drafts_are_the_target_models_own_continuations(spec_servers):
    """With the target as its draft, SGLang's EAGLE-style draft sees the sequence without its
    first token (its input is shifted by one; radix cache off on this server, else a cache hit
    keeps draft KV computed with another request's next token). So each round's drafts are the
    target's greedy continuation of ``sequence[1:]``, and the round accepts the longest prefix
    of them that the target's own greedy output continues with. Replaying that on the
    non-speculative server predicts SGLang's per-request histogram of accepted drafts exactly:
    the draft-decode and draft-extend attention compute what a plain forward computes."""
    plain, num_drafts = spec_servers["plain"].url, 3

    def greedy(ids: list[int], num_tokens: int) -> list[int]:
        extra = {"input_ids": ids, "logprob_start_len": 0}
        return generate(
            plain, None, det=None, max_new_tokens=num_tokens, ignore_eos=True, extra=extra
        )

    accepted = 0
    for prompt in PROMPTS[:3]:
        ref, _, ref_meta = generate(
            plain,
            prompt,
            det=None,
            ignore_eos=True,
            max_new_tokens=MAX_NEW_TOKENS + num_drafts,
            extra={"logprob_start_len": 0},
        )
        prompt_ids = [t[1] for t in ref_meta["input_token_logprobs"]]
        expected = [0] * (num_drafts + 1)
        num_out = 1  # the prefill's token
        while num_out < MAX_NEW_TOKENS:
            drafts = greedy(prompt_ids[1:] + ref[:num_out], num_drafts)[0]
            k = 0
            while k < num_drafts and drafts[k] == ref[num_out + k]:
                k += 1
            expected[k] += 1
            num_out += k + 1
        meta = generate(
            spec_servers["standalone"].url, prompt, det=None, max_new_tokens=MAX_NEW_TOKENS
        )[2]
        got = meta["spec_correct_drafts_histogram"]
        got = got + [0] * (len(expected) - len(got))
        assert got == expected, f"{prompt!r}: accepted drafts per verify {got}, replay {expected}"
        accepted += meta["spec_accepted_drafts"]
    assert accepted > 0, "no draft accepted: the replay check is vacuous"
