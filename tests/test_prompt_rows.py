"""`LLM42_PROMPT_ROWS=extend` without a server: prompt entries become extend sequences packed R
tokens a forward and run before the decode rows, the forward's batch has the sequences' prefixes
and a dummy padding sequence, Triton takes its unified kernel only inside such a forward, and a
decode step never carries prompt rows. The served bits: test_row_invariant.py under the
variable (docs/testing.md)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from llm42.core.planner import VerifyPass, VerifyRow
from llm42.sglang import pass_attention, prompt_rows, row_pass, runtime, verifier

PROMPT_LEN = 6


def _req(pool_idx: int, prompt_len: int = PROMPT_LEN):
    return SimpleNamespace(req_pool_idx=pool_idx, origin_input_ids=list(range(prompt_len)))


def test_the_mode_is_read_from_the_environment_and_applies_where_extend_rows_keep_their_bits(
        monkeypatch):
    monkeypatch.delenv(prompt_rows.ENV, raising=False)
    assert prompt_rows.requested() == "decode"
    assert not prompt_rows.extend_applies("triton")
    monkeypatch.setenv(prompt_rows.ENV, "extend")
    assert prompt_rows.extend_applies("triton") and prompt_rows.extend_applies("torch_native")
    assert not prompt_rows.extend_applies("flashinfer"), "its extend kernels keep no row's bits"
    monkeypatch.setenv(prompt_rows.ENV, "prefill")
    with pytest.raises(ValueError, match="LLM42_PROMPT_ROWS must be 'decode' or 'extend'"):
        prompt_rows.requested()


def test_a_position_is_a_prompt_row_by_its_request_alone():
    a, b = _req(1), _req(2, prompt_len=3)
    entries = [(a, 4, 10), (a, 5, 11), (a, 6, 12), (b, 2, 20), (b, 3, 21)]
    assert prompt_rows.prompt_entries(entries) == [0, 1, 3]


def test_segments_cut_where_the_request_changes_or_a_position_skips():
    a, b = _req(1), _req(2)
    entries = [(a, 0, 5), (a, 1, 6), (b, 0, 7), (b, 2, 8), (a, 2, 9)]
    got = [(s.req is a, s.start, s.tokens, s.first) for s in prompt_rows.segments(entries)]
    assert got == [(True, 0, (5, 6), 0), (False, 0, (7,), 2), (False, 2, (8,), 3),
                   (True, 2, (9,), 4)]


def test_an_extend_forward_has_the_sequences_prefixes_and_pads_on_the_padding_slot(monkeypatch):
    """Entries of two requests, the second continuing at position 3 (a chunk split across
    forwards): each a sequence over its prefix, then a dummy sequence on row 0, slot 0, so the
    forward has R tokens; the attention hook's flag is on during the forward only."""
    a, b = _req(1), _req(2)
    req_to_token = torch.arange(3 * 16).reshape(3, 16) + 100
    scheduler = SimpleNamespace(req_to_token_pool=SimpleNamespace(req_to_token=req_to_token))
    seen = {}

    def forward_pass(sched, batch):
        seen.update(batch=batch, active=prompt_rows.ACTIVE)
        logits = torch.arange(batch.extend_num_tokens, dtype=torch.float32)[:, None].repeat(1, 4)
        return SimpleNamespace(logits_output=SimpleNamespace(next_token_logits=logits))

    monkeypatch.setattr(verifier, "forward_pass", forward_pass)
    template = SimpleNamespace(reqs=[], device="cpu")
    entries = [(a, 0, 50), (a, 1, 51), (b, 3, 60), (b, 4, 61), (b, 5, 62)]
    logits = prompt_rows.forward(scheduler, template, entries, 8, "cpu")
    batch = seen["batch"]
    assert seen["active"] and not prompt_rows.ACTIVE
    assert batch.forward_mode.is_extend()
    assert batch.reqs[:2] == [a, b] and len(batch.reqs) == 3  # the dummy last
    assert batch.prefix_lens == [0, 3, 0] and batch.extend_lens == [2, 3, 3]
    assert batch.seq_lens.tolist() == [2, 6, 3] and batch.extend_num_tokens == 8
    assert batch.req_pool_indices.tolist() == [1, 2, 0]
    assert batch.input_ids.tolist() == [50, 51, 60, 61, 62, 0, 0, 0]
    assert batch.out_cache_loc.tolist() == [116, 117, 135, 136, 137, 0, 0, 0]
    assert logits.shape == (8, 4)

    def failing(sched, batch):
        raise RuntimeError("forward failed")
    monkeypatch.setattr(verifier, "forward_pass", failing)
    with pytest.raises(RuntimeError):
        prompt_rows.forward(scheduler, template, entries, 8, "cpu")
    assert not prompt_rows.ACTIVE, "a failed forward leaves the flag off"


def test_prompt_entries_run_first_as_extend_forwards_and_logits_come_back_in_asked_order(
        monkeypatch):
    """A pass of a window (request a, past its prompt) then a prompt (request b) then o_0's row
    (b at its prompt's length): b's prompt entries run as extend forwards of R = 4 tokens
    before any decode row, and the logits asked for, duplicates included, come back in the
    order asked, each its own entry's."""
    a, b = _req(1, prompt_len=2), _req(2)
    entries = [(a, 2, 7), (a, 3, 8)] + [(b, p, 30 + p) for p in range(PROMPT_LEN)] + [(b, 6, 99)]
    calls = []

    def encoded(chunk, rows):
        out = torch.full((rows, 3), -1.0)
        for i, (req, pos, tok) in enumerate(chunk):
            out[i] = req.req_pool_idx * 1000 + pos * 10 + tok % 10
        return out

    def extend(scheduler, batch, chunk, rows, device):
        calls.append(("extend", [pos for _, pos, _ in chunk]))
        return encoded(chunk, rows)

    def decode(scheduler, batch, chunk, rows, device):
        calls.append(("decode", [(r.req_pool_idx, pos) for r, pos, _ in chunk]))
        return encoded(chunk, rows), True

    monkeypatch.setattr(prompt_rows, "forward", extend)
    monkeypatch.setattr(row_pass, "_forward", decode)
    wanted = [8, 0, 7, 1, 7]
    logits, graphed = row_pass.entry_logits(None, None, entries, wanted, 4, "cpu", True)
    assert calls == [("extend", [0, 1, 2, 3]), ("extend", [4, 5]),
                     ("decode", [(1, 2), (1, 3), (2, 6)])]
    assert graphed
    expected = [entries[i][0].req_pool_idx * 1000 + entries[i][1] * 10 + entries[i][2] % 10
                for i in wanted]
    assert logits[:, 0].tolist() == expected
    # without the mode every entry is a decode row, in entry order
    calls.clear()
    logits, _ = row_pass.entry_logits(None, None, entries, wanted, 4, "cpu", False)
    assert [kind for kind, _ in calls] == ["decode"] * 3 and logits[:, 0].tolist() == expected


@pytest.mark.parametrize("active", [True, False])
def test_triton_takes_its_unified_kernel_inside_a_prompt_forward_only(monkeypatch, active):
    monkeypatch.setattr(prompt_rows, "ACTIVE", active)
    backend = SimpleNamespace(enable_deterministic=False)
    seen = []
    pass_attention.triton_extend_hook(lambda b, *a: seen.append(b.enable_deterministic),
                                      backend, "q")
    assert seen == [active] and backend.enable_deterministic is False
    # and such a forward never replays a prefill graph (its kernel may not be the captured one)
    monkeypatch.setattr(runtime, "IN_VERIFY_PASS", True)
    monkeypatch.setattr(pass_attention, "_EAGER_PASSES", False)
    assert pass_attention.can_run_graph_hook(lambda r, fb: True, None, None) is (not active)


def test_a_round_with_prompt_rows_does_not_ride_in_a_decode_step(monkeypatch):
    """A decode step computes decode rows; a folded round's prompt entries would get the
    decode kernel's bits, so under the mode such a round runs as a pass."""
    from llm42.sglang import fold_pass

    rows = [VerifyRow(rid="r", input_ids=(5, 6), positions=(0, 1), prefix_len=0, num_real=2,
                      sample_from=1)]
    plan = SimpleNamespace(vpass=VerifyPass(rows=tuple(rows), batch_size=1, window_size=2),
                           row_owners=lambda reqs: reqs)
    monkeypatch.setattr(fold_pass, "active", lambda rt: True)
    monkeypatch.setattr(fold_pass, "range_is_fixed", lambda state: True)
    monkeypatch.setattr(fold_pass, "det_state", lambda r: None)
    monkeypatch.setattr(fold_pass, "job_rows", lambda *a: None)
    monkeypatch.setattr(fold_pass, "round_plans", lambda jobs, cfg: [plan])
    req = SimpleNamespace(origin_input_ids=[5, 6, 7], output_ids=[])
    for extend, offered in ((False, True), (True, False)):
        rt = SimpleNamespace(fold_missed=False, config=None, row_pass_rows=16, riders=None,
                             prompt_rows_extend=extend)
        assert fold_pass.offer(rt, SimpleNamespace(reqs=[]), [req], False) is offered


def test_cpu_prompt_rows_keep_their_bits_wherever_their_chunk_starts(monkeypatch):
    """torch_native inside a prompt forward (CPU): a prompt's rows computed as one chunk from
    position 0, or as a chunk starting at position 3 over the KV before it, and beside another
    sequence, are bitwise the same rows."""
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    torch.manual_seed(0)
    heads, kv_heads, dim, n = 4, 2, 8, 9
    k_cache, v_cache = torch.randn(64, kv_heads, dim), torch.randn(64, kv_heads, dim)
    req_to_token = torch.stack([torch.arange(40, 60), torch.arange(10, 30)])
    query = torch.randn(n + 4, heads, dim)
    sglang_calls = []

    def sglang(backend, *args, **kwargs):  # SGLang's: one SDPA over a padded sequence
        sglang_calls.append(args[0].shape[0])
        return TorchNativeAttnBackend._run_sdpa_forward_extend(backend, *args, **kwargs)

    def run(q, pools, prefixes, lens):
        out = torch.zeros(q.shape[0], heads, dim)
        seq = torch.tensor([p + e for p, e in zip(prefixes, lens)])
        return pass_attention.torch_native_extend_rows_hook(
            sglang, None, q, out, k_cache, v_cache, req_to_token, torch.tensor(pools), seq,
            torch.tensor(prefixes), torch.tensor(lens), None, scaling=0.3, enable_gqa=True,
            causal=True)

    monkeypatch.setattr(prompt_rows, "ACTIVE", True)
    whole = run(query[:n], [1], [0], [n])
    tail = run(query[3:n], [1], [3], [n - 3])
    assert torch.equal(whole[3:], tail)
    mates = run(torch.cat([query[n:], query[3:n]]), [0, 1], [2, 3], [4, n - 3])
    assert torch.equal(mates[4:], tail)
    assert sglang_calls == [], "inside a prompt forward every row is computed on its own"
    # each row is what attention over its own prefix gives
    keys, values = k_cache[req_to_token[1, :n]], v_cache[req_to_token[1, :n]]
    row = 5
    keys, values = (x[:row + 1].repeat_interleave(heads // kv_heads, dim=1)
                    for x in (keys, values))
    scores = torch.einsum("hd,lhd->hl", query[row], keys) * 0.3
    ref = torch.einsum("hl,lhd->hd", scores.softmax(-1), values)
    torch.testing.assert_close(whole[row], ref)
    monkeypatch.setattr(prompt_rows, "ACTIVE", False)
    run(query[:n], [1], [0], [n])
    assert sglang_calls == [n], "elsewhere SGLang's attention"
