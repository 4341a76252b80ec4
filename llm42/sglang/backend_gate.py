"""The backend gate of `--enable-llm42`: serve only on attention (and LoRA) backends whose
determinism has been proven, since that is where a silent break of the guarantee would come from.

A verification pass is reproducible only if each row's attention is computed independently of
the pass's other rows. Backends that pick their KV-split strategy from the whole batch's shape
(FlashInfer, FA3: SGLang's deterministic mode pins their splits) may give a row different bits
next to different rows unless the pass pins them too (`pass_attention`). Which backends keep rows
independent is a measured fact, not a property llm42 can check at startup, hence a list of the proven ones (`PROVEN_BACKENDS`). LoRA kernels
add to each row an adapter product computed in segments of rows that share an adapter, so they
are gated the same way (`PROVEN_LORA_BACKENDS`) on a server with `--enable-lora`:

    verdict = check("fa3", "fa3", allow_unproven=False)
    verdict.allowed, verdict.message  # False, "attention backend fa3 has no ..."

Launched without `--attention-backend`, an llm42 server on an NVIDIA GPU serves on a proven
backend instead of an unproven default of SGLang's (`auto_select`: FA3 on Hopper), and on triton
where its verifier may be the row-invariant one, which decodes only there (`verifier_choice`).
"""

from __future__ import annotations

from dataclasses import dataclass

# Backend -> where its determinism was proven. Add a backend only with its proof committed.
PROVEN_BACKENDS: dict[str, str] = {
    "triton": "GPU: the H200 determinism proofs in benchmarks/results/",
    "flashinfer": "GPU: the H200 determinism proof in "
                  "benchmarks/results/h200-2026-12-05-sampling-api-flashinfer-ceiling/",
    "torch_native": "CPU: the test suite",
}
# LoRA backend -> where its determinism was proven.
PROVEN_LORA_BACKENDS: dict[str, str] = {
    "csgmv": "GPU: the H200 determinism proof in "
             "benchmarks/results/h200-2026-12-05-sampling-api-flashinfer-ceiling/",
    "torch_native": "CPU: the test suite",
}
OVERRIDE_FLAG = "--llm42-allow-unproven-backend"
# What an NVIDIA GPU serves on when SGLang's default has no proof, first usable first. Which of
# the two is faster has not been measured yet (`run_gpu_suite.sh backend-compare` measures it):
# until then FlashInfer, SGLang's own default on the GPUs where it does not pick FA3 or TRT-LLM.
GPU_AUTO_BACKENDS = ("flashinfer", "triton")
GPU_AUTO_WHY = ("proven, and SGLang's own default on many GPUs; flashinfer against triton not "
                "measured yet")


@dataclass(frozen=True)
class BackendVerdict:
    """`unproven_backend`: the unproven backend(s) in use, as `/llm42_stats` reports them (None:
    every backend in use is proven); `message`: the refusal when not `allowed`, else the warning
    of an override (None when nothing is unproven)."""

    allowed: bool
    unproven_backend: str | None
    message: str | None


def check(prefill: str, decode: str, *, allow_unproven: bool, auto_selected: bool = False,
          lora_backend: str | None = None) -> BackendVerdict:
    """The verdict on SGLang's resolved (prefill, decode) attention backends, and its LoRA
    backend when LoRA is on. Both attention backends count: the passes run as prefills, and a
    server that splits the two runs a combination of its own. `auto_selected`: no backend was
    given, SGLang chose it (worth saying: the user never did)."""
    unproven = [name for name in dict.fromkeys((prefill, decode)) if name not in PROVEN_BACKENDS]
    lora_unproven = lora_backend is not None and lora_backend not in PROVEN_LORA_BACKENDS
    if not unproven and not lora_unproven:
        return BackendVerdict(allowed=True, unproven_backend=None, message=None)
    problems, fixes = [], []
    if unproven:
        found = prefill if prefill == decode else f"{prefill} (prefill) / {decode} (decode)"
        chosen = " (SGLang's default here: no --attention-backend was given)" if auto_selected \
            else ""
        problems.append(f"attention backend {found}{chosen} has no determinism proof for "
                        f"llm42's verification pass (proven: {_listed(PROVEN_BACKENDS)})")
        fixes.append("--attention-backend triton")
    if lora_unproven:
        problems.append(f"LoRA backend {lora_backend} has no determinism proof for llm42's "
                        f"verification pass (proven: {_listed(PROVEN_LORA_BACKENDS)})")
        fixes.append("--lora-backend csgmv (torch_native on CPU)")
        unproven.append(f"lora:{lora_backend}")
    problem = "; ".join(problems)
    if allow_unproven:
        return BackendVerdict(
            allowed=True, unproven_backend=", ".join(unproven),
            message=f"{problem}; started anyway because of {OVERRIDE_FLAG}: deterministic "
                    "requests may depend on their batch mates")
    return BackendVerdict(
        allowed=False, unproven_backend=", ".join(unproven),
        message=f"{problem}. Serve with {' and '.join(fixes)}, or pass {OVERRIDE_FLAG} "
                "to start anyway for experiments (deterministic requests may then depend on "
                "their batch mates)")


def auto_select(sglang_default: str, usable: tuple[str, ...],
                prefer: tuple[str, str] | None = None) -> tuple[str, str]:
    """The attention backend of an llm42 server launched without one, and the log line saying
    which and why. `usable`: those of GPU_AUTO_BACKENDS that can run this model here (empty off
    NVIDIA GPUs: SGLang's default then stays, and the gate judges it). `prefer`: (backend, why)
    the server's verifier runs on, chosen over SGLang's default, proven or not, where usable."""
    if prefer is not None and prefer[0] in usable and prefer[0] in PROVEN_BACKENDS:
        chosen, why = prefer
        if chosen == sglang_default:
            return chosen, f"attention backend {chosen}: SGLang's default here, and {why}"
        return chosen, (f"attention backend {chosen} instead of SGLang's default "
                        f"{sglang_default}: {why}. --attention-backend chooses another")
    if sglang_default in PROVEN_BACKENDS:
        return sglang_default, (f"attention backend {sglang_default}: SGLang's default here, "
                                "proven deterministic for llm42")
    chosen = next((name for name in GPU_AUTO_BACKENDS if name in usable), None)
    if chosen is None:
        return sglang_default, f"attention backend {sglang_default}: SGLang's default here"
    why = GPU_AUTO_WHY if chosen == GPU_AUTO_BACKENDS[0] else \
        f"proven ({GPU_AUTO_BACKENDS[0]} is not installed here or cannot serve this model)"
    return chosen, (f"attention backend {chosen} instead of SGLang's default {sglang_default} "
                    f"(no determinism proof for llm42's passes): {chosen} is {why}. "
                    "--attention-backend chooses another")


def _listed(proven: dict[str, str]) -> str:
    return ", ".join(f"{name} ({where.split(':')[0]})" for name, where in proven.items())


def check_server_args(server_args, *, allow_unproven: bool,
                      auto_selected: bool = False) -> BackendVerdict:
    """`check` on a resolved `ServerArgs`: the backends the model runner will build."""
    prefill, decode = server_args.get_attention_backends()
    lora = server_args.lora_backend if getattr(server_args, "enable_lora", False) else None
    return check(prefill, decode, allow_unproven=allow_unproven, auto_selected=auto_selected,
                 lora_backend=lora)
