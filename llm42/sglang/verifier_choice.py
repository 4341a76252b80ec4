"""Which verifier a server runs. `--llm42-verifier auto` runs `row-invariant` wherever it can
(its outputs depend on the request alone), else `fixed-shape`, and logs why:

    verifier, line = choose(config, "cuda", "triton", pool_rows=256, rows=256,
                            linear_problems=lambda rows: row_pass.check_linears(model, rows))

An explicit `row-invariant` that cannot run is refused with the flag to change; `auto` never
is. A flag only the row-invariant verifier has (`--llm42-inline-verify`,
`--llm42-max-pass-rows-per-step`) turns `auto` into a request for it.

Two stages, because no one place knows everything: the launcher knows the device and the
attention backends (and picks one the row-invariant verifier runs on when none is given,
`backend_preference`); only the scheduler holds the request pool and the loaded weights whose
GEMMs must be row-invariant. Torch-free, since the launcher's side imports it.
"""

from __future__ import annotations

from collections.abc import Callable

from llm42.core.config import AUTO, FIXED_SHAPE, ROW_INVARIANT, Llm42Config

# Device type -> the decode attention backend whose row passes fix each row's KV split.
ROW_PASS_BACKENDS = {"cpu": "torch_native", "cuda": "triton"}
# Device type -> the decode attention backend whose row-invariant passes have a proof: CPU's
# torch_native (tests/test_row_invariant.py), CUDA's triton with fixed KV splits inside row
# passes (`row_pass.static_kv_splits_hook`; H100: alone vs among 64 background requests, and
# W 16 B 32 vs W 64 B 4 on two server starts, benchmarks/results/h100-2026-12-06-row-invariant-
# proof). A backend listed in ROW_PASS_BACKENDS but not here needs
# --llm42-allow-unproven-backend, and auto never picks it.
PROVEN_ROW_BACKENDS = {"cpu": "torch_native", "cuda": "triton"}
FIXED_LINE = "verifier fixed-shape (--llm42-verifier fixed-shape)"


def backend_preference(config_verifier: str, device: str | None) -> tuple[str, str] | None:
    """(the attention backend to prefer when the user gave none, why): the one the
    row-invariant verifier runs on, unless fixed-shape was asked for (None: no preference)."""
    if config_verifier == FIXED_SHAPE:
        return None
    backend = ROW_PASS_BACKENDS.get(str(device or "").split(":")[0])
    if backend is None:
        return None
    return backend, (f"llm42's row-invariant verifier (--llm42-verifier {config_verifier}) "
                     f"decodes on {backend}, proven deterministic for llm42")


def static_obstacle(device_type: str, decode_backend: str, allow_unproven: bool) -> str | None:
    """Why the row-invariant verifier cannot run on this device and decode backend (None: it
    can, as far as the launcher can tell)."""
    want = ROW_PASS_BACKENDS.get(device_type)
    if want is None:
        return f"no row-invariant forward on {device_type}"
    if decode_backend != want:
        return (f"it needs decode attention {want} on {device_type} (got {decode_backend}); "
                f"--attention-backend {want} gives it")
    if PROVEN_ROW_BACKENDS.get(device_type) != decode_backend and not allow_unproven:
        return (f"it has no determinism proof on {device_type} {decode_backend} yet (proven: "
                f"{proven_row_backends()})")
    return None


def launch_verifier(config: Llm42Config, device_type: str, decode_backend: str) -> str:
    """The verifier the launcher validates the flags against; the scheduler may still fall
    back from an automatic row-invariant (`choose`)."""
    wanted = config.requested_verifier
    if wanted != AUTO:
        return wanted
    obstacle = static_obstacle(device_type, decode_backend, allow_unproven=False)
    return FIXED_SHAPE if obstacle else ROW_INVARIANT


def choose(config: Llm42Config, device_type: str, decode_backend: str, *, pool_rows: int,
           rows: int | None, linear_problems: Callable[[int], list[str]]) -> tuple[str, str]:
    """(verifier, the log line) at scheduler start. `pool_rows`: the requests the server holds;
    `rows`: a row-invariant forward's rows here (None: none); `linear_problems(rows)`: why the
    loaded model's GEMMs are not row-invariant at that count ([]: they are). Raises ValueError
    where `row-invariant` was asked for and cannot run."""
    wanted = config.requested_verifier
    if wanted == FIXED_SHAPE:
        return FIXED_SHAPE, FIXED_LINE
    # auto never picks an unproven verifier; the override is for an explicit row-invariant
    explicit = config.verifier == ROW_INVARIANT
    obstacle = static_obstacle(device_type, decode_backend,
                               config.allow_unproven_backend and explicit)
    if obstacle is None and rows is None:
        obstacle = f"no row-invariant forward on {device_type}"
    if obstacle is None and pool_rows < rows:  # the attention backend sizes its buffers by it
        obstacle = (f"it runs forwards of {rows} rows, but this server holds {pool_rows} "
                    f"requests; --max-running-requests {rows} or more gives it")
    if obstacle is None:
        problems = linear_problems(rows)
        if problems:
            obstacle = ("this device's GEMMs are not row-invariant at the pass shape: "
                        + "; ".join(problems))
    if obstacle is None:
        how = "--llm42-verifier row-invariant" if explicit else \
            "auto: it can run here" if wanted == config.verifier else \
            "auto, and a flag of the row-invariant verifier was given"
        return ROW_INVARIANT, f"verifier row-invariant ({how})"
    if wanted == ROW_INVARIANT:
        fix = ("" if "proof" not in obstacle else
               "pass --llm42-allow-unproven-backend to run it for a proof, or ")
        raise ValueError(f"llm42: the row-invariant verifier cannot run here: {obstacle}; "
                         f"{fix}serve with --llm42-verifier fixed-shape")
    return FIXED_SHAPE, (
        f"verifier fixed-shape (auto: the row-invariant verifier cannot run here: {obstacle}; "
        "deterministic outputs then also depend on W, B and the prefill flags)")


def unproven(device_type: str, decode_backend: str) -> str | None:
    """What /llm42_stats reports as unproven about a running row-invariant verifier."""
    if PROVEN_ROW_BACKENDS.get(device_type) != decode_backend:
        return f"row-invariant:{decode_backend}"
    return None


def proven_row_backends() -> str:
    return ", ".join(f"{device} {backend}" for device, backend in PROVEN_ROW_BACKENDS.items())
