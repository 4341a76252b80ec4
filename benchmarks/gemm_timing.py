"""What the GEMM microbenchmarks share: Llama's linear shapes, SGLang's batch-invariant matmul, and
timing a callable as a CUDA graph replay.

    ms, graphed, why_not = timed(lambda: F.linear(x, w), torch.device("cuda"), warmup=3, iters=10)
    linear, kernel = batch_invariant_linear()   # (x [M, K], w [N, K]) -> [M, N], or a reason

Used by `verify_ceiling` (issue 24) and `row_invariance` (issue 34).
"""

from __future__ import annotations

import statistics
import time

import torch

PRESETS = {
    "llama-3.1-8b": {"layers": 32, "hidden": 4096, "intermediate": 14336, "heads": 32,
                     "kv_heads": 8, "head_dim": 128, "vocab": 128256},
    "tiny": {"layers": 2, "hidden": 64, "intermediate": 128, "heads": 4, "kv_heads": 2,
             "head_dim": 16, "vocab": 256},
}


def gemm_shapes(s: dict) -> dict[str, tuple[int, int]]:
    """(in, out) of each per-layer GEMM; q, k, v and gate, up fused as SGLang runs them."""
    q = s["heads"] * s["head_dim"]
    return {"qkv": (s["hidden"], q + 2 * s["kv_heads"] * s["head_dim"]), "o": (q, s["hidden"]),
            "gate_up": (s["hidden"], 2 * s["intermediate"]),
            "down": (s["intermediate"], s["hidden"])}


def batch_invariant_linear():
    """SGLang's batch-invariant matmul as x @ W^T (what its deterministic mode routes aten::mm
    to), and the kernel it picks; or why it cannot run here. Set
    SGLANG_BATCH_INVARIANT_OPS_ENABLE_MM_DEEPGEMM=0 before the import for its Triton kernel."""
    try:
        from sglang.srt.batch_invariant_ops import batch_invariant_ops as bio
    except Exception as e:  # noqa: BLE001 - any import failure means no such variant here
        return f"SGLang batch-invariant matmul unavailable: {type(e).__name__}: {e}"[:300], None
    kernel = "deepgemm" if bio._ENABLE_MM_DEEPGEMM and bio.ENABLE_JIT_DEEPGEMM else "triton"
    return (lambda x, w: bio.matmul_persistent(x, w.t())), kernel


def capture(fn):
    """fn as a CUDA graph (SGLang replays decode and passes as graphs; eager launch gaps would blur
    what the GEMMs cost), or None and why capture failed."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # compile and pick kernels outside the capture
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return graph, None
    except Exception as e:  # noqa: BLE001 - fall back to eager timing, saying why
        torch.cuda.synchronize()
        return None, f"{type(e).__name__}: {e}"[:300]


def timed(fn, device: torch.device, warmup: int, iters: int) -> tuple[float, bool, str | None]:
    """Median ms of one call, whether it replayed a graph, and why not."""
    if device.type != "cuda":
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times), False, None
    graph, error = capture(fn)
    replay = graph.replay if graph is not None else fn
    for _ in range(warmup):
        replay()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(iters)]
    for start, end in events:
        start.record()
        replay()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events), graph is not None, error
