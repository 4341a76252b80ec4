"""Attention for `row_invariance`: are a request's query rows the same bits whatever else the
batch holds and wherever its extend starts?

    rows = run(["triton-extend", "flashinfer-paged-split"], ctx, quick=False, seed=0)

A target request's 16 query rows (a window of W = 16 over a prefix) are computed alone, then
batched with other requests and with the prefix / extend split moved. Each case compares the
target's rows bitwise with its reference layout, and both with an fp32 softmax reference (a
large error there means the harness fed the kernel wrong indices, not a finding).

Kernels, per backend proven for llm42 (`backend_gate.PROVEN_BACKENDS`):

  torch_native-sdpa       SGLang's TorchNativeAttnBackend extend (per request SDPA; CPU's)
  triton-extend           SGLang's 2-stage Triton extend kernel (prefix tiles from 0, extend
                          tiles from the extend's start): what llm42's passes run on triton
  triton-extend-unified   SGLang's deterministic-mode 1-stage kernel (prefix and extend walked
                          in one loop of tiles from position 0)
  flashinfer-paged-split  FlashInfer's paged prefill planned as llm42's passes are
                          (`pass_attention`: paged kernel, fixed 4,096-token KV split)
  flashinfer-paged-nosplit  the same with the KV split disabled

Layouts are lists of (request, prefix P, extend E): the request's query rows [P, P + E) over its
KV [0, P + E). A case with several layouts runs them one after the other (windows of 8).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

KERNELS = ("torch_native-sdpa", "triton-extend", "triton-extend-unified",
           "flashinfer-paged-split", "flashinfer-paged-nosplit")
WINDOW = 16
SPLIT_TILE = 4096  # llm42's FlashInfer pass split (pass_attention.PASS_SPLIT_TILE_SIZE)
WORKSPACE_BYTES = 256 * 2**20
JIT_SECONDS = 150.0  # FlashInfer compiles its prefill module on first use (nvcc): start it only
# with this much of --budget-s left (the H200's first FlashInfer server took 112 s of JIT)


@dataclass(frozen=True)
class Seq:
    """One request's tokens: q [L, Hq, D], k and v [L, Hkv, D], the same in every layout."""

    name: str
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor


def make_seq(name: str, length: int, heads: tuple[int, int, int], device, seed: int) -> Seq:
    hq, hkv, d = heads
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*size):
        return torch.randn(*size, generator=gen, device=device).to(torch.bfloat16)
    return Seq(name, randn(length, hq, d), randn(length, hkv, d), randn(length, hkv, d))


def cases(p: int, long: int) -> list[dict]:
    """Each case: the target's rows in `ref` and in `var` (lists of passes, each a list of
    (request name, P, E)). `p` is a window's prefix (1000: not a multiple of any tile), `long`
    the FlashInfer split tile; --quick shrinks both."""
    win = [("T", p, WINDOW)]
    aligned = 64 * -(-p // 64)
    far = long + p // 2  # past one split tile
    return [
        {"case": "batched-windows", "ref": [win],
         "var": [[("A", 3 * p // 10, 16), ("B", 2 * p, 16), ("T", p, 16), ("C", p // 13, 16),
                  ("D", 3 * p // 2, 16)]],
         "what": "among other windows of 16 (a pass of today's shape), at index 2"},
        {"case": "batched-prompts", "ref": [win],
         "var": [[("A", 0, p // 2), ("T", p, 16), ("B", 37, p // 5), ("C", 0, 1)]],
         "what": f"among prompt rows of other lengths (1-{p // 2} query rows)"},
        {"case": "batched-long-mate", "ref": [win],
         "var": [[("T", p, 16), ("L", 2 * long + 4 * p // 5, 16)]],
         "what": "next to a request longer than two split tiles"},
        {"case": "split-unaligned", "ref": [win], "var": [[("T", p - 32, 48)]],
         "what": "the last 16 rows of a 48-row extend over prefix P - 32"},
        {"case": "split-aligned-64", "ref": [[("T", aligned, 16)]],
         "var": [[("T", aligned - 64, 80)]],
         "what": f"prefix {aligned} vs {aligned - 64} (multiples of 64, Triton's Hopper KV tile)"},
        {"case": "windows-of-8", "ref": [win], "var": [[("T", p, 8)], [("T", p + 8, 8)]],
         "what": "two windows of 8 (W = 8 instead of 16)"},
        {"case": "whole-prompt", "ref": [win], "var": [[("T", 0, p + 16)]],
         "what": "the last 16 rows of one extend of the whole sequence (a solo prefill)"},
        {"case": "long-split", "ref": [[("T", far, 16)]], "var": [[("T", far - 32, 48)]],
         "what": "as split-unaligned, past one split tile"},
    ]


def seq_lengths(case_list: list[dict]) -> dict[str, int]:
    """Each request's length: the furthest any case reads it."""
    out: dict[str, int] = {}
    for c in case_list:
        for layout in (*c["ref"], *c["var"]):
            for n, p, e in layout:
                if p < 0 or e < 1:
                    raise ValueError(f"case {c['case']}: {n} has prefix {p}, extend {e}")
                out[n] = max(out.get(n, 0), p + e)
    return out


@dataclass
class Packed:
    """A batch as SGLang's backends see it (slot 0 is padding, as SGLang reserves it)."""

    q: torch.Tensor  # [T, Hq, D] the extend rows
    k: torch.Tensor  # [T, Hkv, D]
    v: torch.Tensor
    k_buffer: torch.Tensor  # [S, Hkv, D] every request's KV [0, P + E), extend rows included
    v_buffer: torch.Tensor
    qo_indptr: torch.Tensor  # [bs + 1] int32
    prefix_indptr: torch.Tensor  # [bs + 1] int32, over prefix_indices
    prefix_indices: torch.Tensor  # int64 slots of [0, P)
    full_indptr: torch.Tensor  # [bs + 1] int32, over full_indices
    full_indices: torch.Tensor  # int64 slots of [0, P + E)
    prefix_lens: torch.Tensor  # [bs] int32
    extend_lens: torch.Tensor  # [bs] int32
    req_to_token: torch.Tensor  # [bs, max P + E] int64 (torch_native)
    max_extend: int


def pack(layout: list[tuple[Seq, int, int]], device) -> Packed:
    qs, ks, vs, kb, vb, pre, full = [], [], [], [], [], [], []
    slot = 1
    for seq, p, e in layout:
        qs.append(seq.q[p:p + e])
        ks.append(seq.k[p:p + e])
        vs.append(seq.v[p:p + e])
        kb.append(seq.k[:p + e])
        vb.append(seq.v[:p + e])
        slots = torch.arange(slot, slot + p + e, device=device)
        pre.append(slots[:p])
        full.append(slots)
        slot += p + e
    hkv, d = layout[0][0].k.shape[1:]
    pad = torch.zeros(1, hkv, d, dtype=torch.bfloat16, device=device)
    prefix = torch.tensor([p for _, p, _ in layout], dtype=torch.int32, device=device)
    extend = torch.tensor([e for _, _, e in layout], dtype=torch.int32, device=device)

    def indptr(lens):
        return torch.cat([lens.new_zeros(1), lens.cumsum(0).to(torch.int32)])
    width = max(len(r) for r in full)
    req_to_token = torch.stack([torch.nn.functional.pad(r, (0, width - len(r))) for r in full])
    return Packed(torch.cat(qs), torch.cat(ks), torch.cat(vs), torch.cat([pad, *kb]),
                  torch.cat([pad, *vb]), indptr(extend), indptr(prefix), torch.cat(pre),
                  indptr(prefix + extend), torch.cat(full), prefix, extend, req_to_token,
                  int(extend.max()))


def torch_native(b: Packed, scale: float) -> torch.Tensor:
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    backend = object.__new__(TorchNativeAttnBackend)  # the method reads no backend state
    out = torch.empty_like(b.q)
    bs = len(b.prefix_lens)
    return backend._run_sdpa_forward_extend(
        b.q, out, b.k_buffer, b.v_buffer, b.req_to_token,
        torch.arange(bs, device=b.q.device), b.prefix_lens + b.extend_lens, b.prefix_lens,
        b.extend_lens, scaling=scale, enable_gqa=True, causal=True)


def triton_extend(b: Packed, scale: float) -> torch.Tensor:
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

    out = torch.empty_like(b.q)
    extend_attention_fwd(b.q, b.k, b.v, out, b.k_buffer, b.v_buffer, b.qo_indptr,
                         b.prefix_indptr, b.prefix_indices, None, True, None, b.max_extend,
                         1.0, 1.0, sm_scale=scale)
    return out


def triton_extend_unified(b: Packed, scale: float) -> torch.Tensor:
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd_unified

    out = torch.empty_like(b.q)
    extend_attention_fwd_unified(b.q, out, b.k_buffer, b.v_buffer, 1.0, 1.0, b.qo_indptr,
                                 b.full_indptr, b.full_indices, b.prefix_lens, b.max_extend,
                                 sm_scale=scale, is_causal=True)
    return out


def flashinfer_paged(split: bool):
    """SGLang's FlashInfer prefill call (flashinfer_backend: paged wrapper, fa2, page size 1,
    planned without `causal`, run with causal=True), with llm42's pass split or none."""
    state = {}

    def run(b: Packed, scale: float) -> torch.Tensor:
        import flashinfer

        if "wrapper" not in state:
            ws = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=b.q.device)
            state["wrapper"] = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD",
                                                                              backend="fa2")
        wrapper = state["wrapper"]
        hq, d = b.q.shape[1:]
        extra = {"fixed_split_size": SPLIT_TILE} if split else {"disable_split_kv": True}
        wrapper.begin_forward(b.qo_indptr, b.full_indptr, b.full_indices.to(torch.int32),
                              torch.ones(len(b.prefix_lens), dtype=torch.int32,
                                         device=b.q.device),
                              hq, b.k_buffer.shape[1], d, 1, q_data_type=torch.bfloat16,
                              kv_data_type=torch.bfloat16, custom_mask=None, non_blocking=True,
                              **extra)
        return wrapper.forward(b.q, (b.k_buffer, b.v_buffer), causal=True, sm_scale=scale,
                               logits_soft_cap=0.0)
    return run


def kernel_fn(name: str, device: torch.device):
    """The kernel as (Packed, scale) -> out [T, Hq, D], or why it cannot run here."""
    if name == "torch_native-sdpa":
        return torch_native
    if name not in KERNELS:
        return f"unknown attention kernel (one of {', '.join(KERNELS)})"
    if device.type != "cuda":
        return f"{name.split('-')[0]} attention: needs CUDA"
    return {"triton-extend": triton_extend, "triton-extend-unified": triton_extend_unified,
            "flashinfer-paged-split": flashinfer_paged(split=True),
            "flashinfer-paged-nosplit": flashinfer_paged(split=False)}[name]


def fp32_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, first: int,
                   scale: float) -> torch.Tensor:
    """q [R, Hq, D] at positions [first, first + R) over k, v [first + R, Hkv, D], causal, in
    fp32: softmax(q k^T * scale) v."""
    groups = q.shape[1] // k.shape[1]
    k, v = (t.float().repeat_interleave(groups, dim=1) for t in (k, v))
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    pos = torch.arange(first, first + q.shape[0], device=q.device)[:, None]
    scores = scores.masked_fill(torch.arange(k.shape[0], device=q.device)[None, :] > pos,
                                float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def fp32_reference(seq: Seq, first: int, rows: int, scale: float) -> torch.Tensor:
    """The request's rows [first, first + rows) in fp32."""
    end = first + rows
    return fp32_attention(seq.q[first:end], seq.k[:end], seq.v[:end], first, scale)


def target_rows(fn, passes, seqs: dict, scale: float, device) -> torch.Tensor:
    """The target T's query rows, in position order, from running each pass of the layout."""
    got = []
    for layout in passes:
        out = fn(pack([(seqs[n], p, e) for n, p, e in layout], device), scale)
        start = 0
        for n, _, e in layout:
            if n == "T":
                got.append(out[start:start + e])
            start += e
    return torch.cat(got)


def target_end(passes) -> int:
    """Where the target's last query row ends (exclusive)."""
    return max(p + e for layout in passes for n, p, e in layout if n == "T")


def check_cases(fn, case_list: list[dict], seqs: dict, scale: float, device) -> list[dict]:
    """One row per case: the target's last 16 rows of `var` against those of `ref`; a case
    whose kernel call raises is a skipped row saying why."""
    out = []
    for c in case_list:
        end = target_end(c["ref"])
        if target_end(c["var"]) != end:
            raise AssertionError(f"case {c['case']}: the target's rows end elsewhere in var")
        try:
            ref = target_rows(fn, c["ref"], seqs, scale, device)[-WINDOW:]
            var = target_rows(fn, c["var"], seqs, scale, device)[-WINDOW:]
        except Exception as e:  # noqa: BLE001 - a failing case is skipped, the others run
            out.append(case_row(c, f"failed: {type(e).__name__}: {e}"[:300]))
            continue
        want = fp32_reference(seqs["T"], end - WINDOW, WINDOW, scale)
        same = torch.equal(ref, var)
        out.append({**case_row(c), "bitwise": same,
                    "max_abs_diff": 0.0 if same else float((ref.float() - var.float()).abs().max()),
                    "max_abs_err_vs_fp32": max(float((x.float() - want).abs().max())
                                               for x in (ref, var))})
    return out


def run(kernels: list[str], ctx: dict, *, quick: bool, seed: int) -> list[dict]:
    """Rows for every (kernel, case); kernels that cannot run here are skipped with the reason,
    and so are those left when the deadline passed."""
    device, shape = ctx["device"], ctx["shape"]
    heads = (shape["heads"], shape["kv_heads"], shape["head_dim"])
    scale = shape["head_dim"] ** -0.5
    long = 128 if quick else SPLIT_TILE
    case_list = cases(100 if quick else 1000, long)
    seqs = {n: make_seq(n, length, heads, device, seed + i)
            for i, (n, length) in enumerate(sorted(seq_lengths(case_list).items()))}
    deadline = ctx["timing"].get("deadline")
    rows = []
    for name in kernels:
        fn = kernel_fn(name, device)
        left = deadline - time.monotonic() if deadline else None
        need = JIT_SECONDS if name.startswith("flashinfer") else 0.0
        if isinstance(fn, str) or (left is not None and left < need):
            reason = fn if isinstance(fn, str) else (
                f"out of time (--budget-s): {left:.0f} s left, {need:.0f} s needed")
            got = [case_row(c, reason) for c in case_list]
        else:
            t0 = time.monotonic()
            got = check_cases(fn, case_list, seqs, scale, device)
            seconds = round(time.monotonic() - t0, 1)
            for row in got:
                row["kernel_seconds"] = seconds  # compiles included (FlashInfer JIT)
        rows += [{"backend": name.split("-")[0], "kernel": name, "window": WINDOW,
                  "split_tile": long, **row} for row in got]
    return rows


def case_row(c: dict, skip_reason: str | None = None) -> dict:
    return {"case": c["case"], "what": c["what"], "ref_layout": str(c["ref"]),
            "var_layout": str(c["var"]), "bitwise": None, "max_abs_diff": None,
            "max_abs_err_vs_fp32": None, "skipped": skip_reason is not None,
            "skip_reason": skip_reason}
