"""What a row pass's Triton KV splits cost a decode step (issue 34), without a server.

An inline decode step or a row pass gives every row the backend's maximum number of KV splits
(`row_pass.static_kv_splits_hook`), so that a row's attention bits depend on its own length only.
Plain SGLang picks fewer splits for a large batch. This times SGLang's own Triton decode
attention kernel on one layer of the 8B shape (32 query heads, 8 KV heads, head dim 128, bf16
KV) for a batch of ShareGPT-like KV lengths under each split policy:

    sglang   SGLang's choice from the whole batch (what plain decode runs)
    max      the maximum for every row (row passes and inline steps today)
    tileT    ceil(length / T) splits, at most the maximum (`LLM42_ROW_PASS_KV_TILE=T`)

and reports each policy's time per layer and per 32-layer step, against SGLang's.

    python -m benchmarks.kv_split_cost --out-dir out/kv-split-cost   # GPU only
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from benchmarks import env_info, report

HEADS, KV_HEADS, HEAD_DIM, LAYERS = 32, 8, 128, 32  # Llama-3.1-8B


def kv_lengths(batch: int, mean: int, seed: int = 0) -> torch.Tensor:
    """KV lengths of a decode batch: prompt plus output so far, geometric around `mean`
    (ShareGPT first turns: about 230 prompt and 265 output tokens)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.empty(batch).exponential_(1.0 / mean, generator=g)
    return lengths.clamp(16, 8 * mean).to(torch.int32)


def tile_splits(lengths: torch.Tensor, tile: int, max_splits: int) -> torch.Tensor:
    """`row_pass.static_kv_splits_hook` under LLM42_ROW_PASS_KV_TILE: from each row's length."""
    return torch.clamp((lengths + tile - 1) // tile, 1, max_splits).to(torch.int32)


def sglang_splits(lengths: torch.Tensor, max_splits: int) -> torch.Tensor:
    """SGLang's `TritonAttnBackend.get_num_kv_splits` for a decode batch (no speculation)."""
    import triton
    from sglang.kernels.ops.attention.metadata import get_num_kv_splits_triton
    from sglang.srt.utils import get_device_core_count

    splits = torch.empty_like(lengths)
    num_seq = lengths.shape[0]
    get_num_kv_splits_triton[(1,)](
        splits, lengths, num_seq, 1, HEADS, KV_HEADS, max_splits, get_device_core_count(0),
        MAX_NUM_SEQ=256 if num_seq < 256 else triton.next_power_of_2(num_seq))
    return splits


def time_layer(lengths: torch.Tensor, splits: torch.Tensor, max_splits: int,
               repeats: int) -> float:
    """Milliseconds of one layer's decode attention for rows of `lengths` KV tokens."""
    from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd

    device = lengths.device
    batch, total = lengths.shape[0], int(lengths.sum())
    q = torch.randn(batch, HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16)
    k = torch.randn(total, KV_HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    o = torch.empty_like(q)
    indptr = torch.zeros(batch + 1, dtype=torch.int32, device=device)
    indptr[1:] = torch.cumsum(lengths, 0)
    indices = torch.randperm(total, device=device).to(torch.int64)  # a paged pool's scatter
    logits = torch.empty(batch, HEADS, max_splits, HEAD_DIM, dtype=torch.float32, device=device)
    lse = torch.empty(batch, HEADS, max_splits, dtype=torch.float32, device=device)

    def run():
        decode_attention_fwd(q, k, v, o, indptr, indices, logits, lse, splits, max_splits,
                             HEAD_DIM ** -0.5, 1.0, 1.0)

    for _ in range(3):
        run()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        run()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out-dir", type=Path, required=True)
    p.add_argument("--batches", default="256,64")
    p.add_argument("--mean-lengths", default="500,2000")
    p.add_argument("--max-splits", type=int, default=8, help="--triton-attention-num-kv-splits")
    p.add_argument("--tiles", default="256,1024")
    p.add_argument("--repeats", type=int, default=50)
    args = p.parse_args(argv)
    from tqdm import tqdm

    args.out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    shapes = [(int(b), int(m)) for b in args.batches.split(",")
              for m in args.mean_lengths.split(",")]
    for batch, mean in tqdm(shapes, desc="shapes"):
        lengths = kv_lengths(batch, mean).cuda()
        policies = {"sglang": sglang_splits(lengths, args.max_splits),
                    "max": torch.full_like(lengths, args.max_splits)}
        for tile in args.tiles.split(","):
            policies[f"tile{tile}"] = tile_splits(lengths, int(tile), args.max_splits)
        base = None
        for name, splits in policies.items():
            ms = time_layer(lengths, splits, args.max_splits, args.repeats)
            base = ms if name == "sglang" else base
            rows.append({"batch": batch, "mean_kv": mean, "policy": name, "layer_ms": ms,
                         "step_ms": ms * LAYERS, "vs_sglang": ms / base,
                         "mean_splits": float(splits.float().mean()),
                         "gpu": torch.cuda.get_device_name(), "git_commit": env_info.git_commit()})
    write_outputs(rows, args.out_dir)


def write_outputs(rows: list[dict], out_dir: Path) -> None:
    """results.jsonl, table.md and kv_split_cost.png (each policy's step time per shape)."""
    with open(out_dir / "results.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    lines = ["| batch | mean KV | policy | mean splits | attention per step (ms, 32 layers) | "
             "vs SGLang's |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['batch']} | {r['mean_kv']} | {r['policy']} | {r['mean_splits']:.2f} | "
              f"{r['step_ms']:.2f} | {r['vs_sglang']:.2f}x |" for r in rows]
    (out_dir / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plt = report._plt()
    shapes = list(dict.fromkeys((r["batch"], r["mean_kv"]) for r in rows))
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(policies)
    for k, policy in enumerate(policies):
        ys = [next((r["vs_sglang"] for r in rows if (r["batch"], r["mean_kv"]) == shape
                    and r["policy"] == policy), 0.0) for shape in shapes]
        ax.bar([i + k * width for i in range(len(shapes))], ys, width, label=policy)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(shapes))],
                  [f"{b} rows, KV ~{m}" for b, m in shapes], fontsize=8)
    ax.set_ylabel("attention time vs SGLang's splits")
    ax.set_title("Triton decode attention, 8B shape, per KV split policy", fontsize=9)
    ax.legend(fontsize=8)
    report._save(plt, fig, out_dir / "kv_split_cost.png")


if __name__ == "__main__":
    main()
