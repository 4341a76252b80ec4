"""Which verifier a server runs. `--llm42-verifier auto`, the default, runs `row-invariant`
wherever it can (its outputs depend on the request alone, and it was the faster verifier in every
same-call measurement: docs/tuning.md), else `fixed-shape`, and logs why:

    verifier, rows, unproven, line = choose(config, scheduler)  # in the scheduler, at start

An explicit `row-invariant` that cannot run is refused with the flag to change; `auto` never
is. A flag only the row-invariant verifier has (`--llm42-inline-verify`,
`--llm42-max-pass-rows-per-step`) turns `auto` into a request for it.

Two stages, because no one place knows everything: the launcher knows the device and the
attention backends (and picks one the row-invariant verifier runs on when none is given,
`backend_preference`); only the scheduler holds the request pool and the loaded weights whose
GEMMs must be row-invariant.
"""

from __future__ import annotations

from llm42.core.config import AUTO, FIXED_SHAPE, ROW_INVARIANT, Llm42Config
from llm42.sglang import row_pass


def backend_preference(config_verifier: str, device: str | None) -> tuple[str, str] | None:
    """(the attention backend to prefer when the user gave none, why): the one the
    row-invariant verifier runs on, unless fixed-shape was asked for (None: no preference)."""
    if config_verifier == FIXED_SHAPE:
        return None
    backend = row_pass.ROW_PASS_BACKENDS.get(str(device or "").split(":")[0])
    if backend is None:
        return None
    return backend, (f"llm42's row-invariant verifier (--llm42-verifier {config_verifier}) "
                     f"decodes on {backend}, proven deterministic for llm42")


def static_obstacle(device_type: str, decode_backend: str, allow_unproven: bool) -> str | None:
    """Why the row-invariant verifier cannot run on this device and decode backend (None: it
    can, as far as the launcher can tell)."""
    want = row_pass.ROW_PASS_BACKENDS.get(device_type)
    if row_pass.rows_per_forward(device_type) is None or want is None:
        return f"no row-invariant forward on {device_type}"
    if decode_backend != want:
        return (f"it needs decode attention {want} on {device_type} (got {decode_backend}); "
                f"--attention-backend {want} gives it")
    if row_pass.PROVEN_ROW_BACKENDS.get(device_type) != decode_backend and not allow_unproven:
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


def choose(config: Llm42Config, scheduler) -> tuple[str, int | None, str | None, str]:
    """(verifier, rows of its forwards or None, what is unproven about it or None, the log
    line). Raises ValueError where `row-invariant` was asked for and cannot run."""
    import torch

    wanted = config.requested_verifier
    if wanted == FIXED_SHAPE:
        return FIXED_SHAPE, None, None, "verifier fixed-shape (--llm42-verifier fixed-shape)"
    device = torch.device(scheduler.device).type
    _, decode = scheduler.server_args.get_attention_backends()
    rows = row_pass.rows_per_forward(device)
    # auto never picks an unproven verifier; the override is for an explicit row-invariant
    obstacle = static_obstacle(device, decode, config.allow_unproven_backend
                               and wanted == config.verifier == ROW_INVARIANT)
    if obstacle is None:
        pool_rows = scheduler.req_to_token_pool.size
        if pool_rows < rows:  # the attention backend sizes its batch buffers by the pool
            obstacle = (f"it runs forwards of {rows} rows, but this server holds {pool_rows} "
                        f"requests; --max-running-requests {rows} or more gives it")
    if obstacle is None:
        problems = row_pass.check_linears(scheduler.tp_worker.model_runner.model, rows)
        if problems:
            obstacle = ("this device's GEMMs are not row-invariant at the pass shape: "
                        + "; ".join(problems))
    if obstacle is None:
        unproven = (f"row-invariant:{decode}"
                    if row_pass.PROVEN_ROW_BACKENDS.get(device) != decode else None)
        how = "--llm42-verifier row-invariant" if config.verifier == ROW_INVARIANT else \
            "auto: it can run here" if wanted == config.verifier else \
            "auto, and a flag of the row-invariant verifier was given"
        return ROW_INVARIANT, rows, unproven, f"verifier row-invariant ({how})"
    if wanted == ROW_INVARIANT:
        fix = ("" if "proof" not in obstacle else
               "pass --llm42-allow-unproven-backend to run it for a proof, or ")
        raise ValueError(f"llm42: the row-invariant verifier cannot run here: {obstacle}; "
                         f"{fix}serve with --llm42-verifier fixed-shape")
    return FIXED_SHAPE, None, None, (
        f"verifier fixed-shape (auto: the row-invariant verifier cannot run here: {obstacle}; "
        "deterministic outputs then also depend on W, B and the prefill flags)")


def proven_row_backends() -> str:
    return ", ".join(f"{device} {backend}" for device, backend
                     in row_pass.PROVEN_ROW_BACKENDS.items())
