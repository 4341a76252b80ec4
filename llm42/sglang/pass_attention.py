"""Attention inside a verification pass, per backend: a pass's row must get the same bits whatever
rows share the pass, or the verifier's tokens would depend on batch mates.

Triton (and the CPU's torch_native) attention computes each row from its own prefix alone.
FlashInfer does not: its prefill plan picks how to split each row's KV across thread blocks from
the whole batch's work, and it takes a ragged kernel for rows without a cached prefix. SGLang's
`--enable-deterministic-inference` pins both for every batch; llm42 pins them only inside its
passes, so normal batches keep SGLang's planning:

- the paged kernel for every row (no ragged path),
- a fixed KV split of `PASS_SPLIT_TILE_SIZE` tokens (SGLang's deterministic default, the value of
  its `SGLANG_FLASHINFER_PREFILL_SPLIT_TILE_SIZE`),
- eager passes: SGLang's prefill-graph paths plan attention without the fixed split.

FA3 picks its number of KV splits per call from the batch (`num_splits = 0`, a heuristic); SGLang's
deterministic mode sets `num_splits = 1`. llm42 sets it inside its passes, which run eagerly on FA3
because the captured prefill graphs hold the fast path's FA3 launches. FA3 is not in the offline
bundle, so this setting has never run: FA3 stays gated (`backend_gate`) until a GPU proof passes.

`backend_gate` decides whether a backend may serve at all; this module only applies what the
backend's proof ran with.
"""

from __future__ import annotations

from contextlib import contextmanager

from llm42.sglang import runtime

PASS_SPLIT_TILE_SIZE = 4096
# Prefill attention backends whose passes must not replay SGLang's prefill CUDA graphs.
EAGER_PASS_BACKENDS = frozenset({"flashinfer", "fa3"})
FA3_PASS_NUM_SPLITS = 1
_EAGER_PASSES: bool | None = None


def init_forward_metadata_hook(original, backend, forward_batch):
    """AROUND FlashInferAttnBackend.init_forward_metadata: inside a pass, plan as SGLang's
    deterministic mode does (paged kernel, fixed split); elsewhere unchanged."""
    if not runtime.IN_VERIFY_PASS:
        return original(backend, forward_batch)
    # enable_deterministic is read by the plan only: it selects the paged kernel
    with _pinned(backend, enable_deterministic=True,
                 prefill_split_tile_size=PASS_SPLIT_TILE_SIZE):
        return original(backend, forward_batch)


def fa3_forward_extend_hook(original, backend, *args, **kwargs):
    """AROUND FlashAttentionBackend.forward_extend: one KV split inside a pass (every FA3 call
    of the extend path reads `backend.num_splits`); elsewhere SGLang's heuristic."""
    if not runtime.IN_VERIFY_PASS:
        return original(backend, *args, **kwargs)
    with _pinned(backend, num_splits=FA3_PASS_NUM_SPLITS):
        return original(backend, *args, **kwargs)


@contextmanager
def _pinned(backend, **values):
    """The backend's attributes set to `values` for one call, then back to SGLang's (also when
    the call fails): the next, normal batch plans as SGLang does."""
    saved = {name: getattr(backend, name) for name in values}
    for name, value in values.items():
        setattr(backend, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(backend, name, value)


def can_run_graph_hook(original, runner, forward_batch) -> bool:
    """AROUND PrefillCudaGraphRunner.can_run_graph: no graph for a pass on a backend whose
    captured plan ignores the fixed split (every pass of such a server runs eagerly, so no
    verified token is computed both ways)."""
    if runtime.IN_VERIFY_PASS and passes_run_eager():
        return False
    return original(runner, forward_batch)


def passes_run_eager() -> bool:
    """Read from the server arguments once: the graph runner is built before llm42's runtime."""
    global _EAGER_PASSES
    if _EAGER_PASSES is None:
        from sglang.srt.runtime_context import get_server_args

        prefill, _ = get_server_args().get_attention_backends()
        _EAGER_PASSES = prefill in EAGER_PASS_BACKENDS
    return _EAGER_PASSES
