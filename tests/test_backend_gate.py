"""The attention-backend gate: proven backends start, unproven ones stop with a message naming
the backend, the proven list and the override, and the override's backend reaches the stats.
Without --attention-backend, an llm42 server on a GPU serves on a proven backend by itself.

The launch itself (SGLang's parser and auto-selection, `llm42: error:` on stderr) is tested in
tests/test_server_surface.py; a CPU server cannot run an unproven backend (they need GPU kernels),
so the scheduler side is driven here with a fake scheduler holding the resolved backends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from llm42.sglang import runtime
from llm42.sglang.backend_gate import (
    GPU_AUTO_BACKENDS,
    OVERRIDE_FLAG,
    PROVEN_BACKENDS,
    PROVEN_LORA_BACKENDS,
    auto_select,
    check,
    check_server_args,
)

CASES = [
    # (prefill, decode, allow_unproven) -> (allowed, unproven_backend)
    ("triton", "triton", False, True, None),  # the GPU proofs' backend
    ("torch_native", "torch_native", False, True, None),  # the CPU proofs' backend
    ("flashinfer", "flashinfer", False, True, None),  # fixed split in passes, H200 proof
    ("fa3", "fa3", False, False, "fa3"),  # Hopper's default; num_splits from the batch
    ("flex_attention", "triton", False, False, "flex_attention"),  # a split: the unproven half
    ("triton", "fa3", False, False, "fa3"),  # ... on either side
    ("fa3", "flex_attention", False, False, "fa3, flex_attention"),  # both named
    ("fa3", "fa3", True, True, "fa3"),  # override: starts, reported
    ("triton", "triton", True, True, None),  # override on a proven backend: nothing to report
]


@pytest.mark.parametrize("prefill, decode, allow, allowed, unproven", CASES,
                         ids=[f"{c[0]}/{c[1]}{' allow' if c[2] else ''}" for c in CASES])
def test_verdict(prefill, decode, allow, allowed, unproven):
    verdict = check(prefill, decode, allow_unproven=allow)
    assert (verdict.allowed, verdict.unproven_backend) == (allowed, unproven)
    if unproven is None:
        assert verdict.message is None
        return
    for name in unproven.split(", "):
        assert name in verdict.message, verdict.message
    for name in PROVEN_BACKENDS:
        assert name in verdict.message, f"the proven list is missing: {verdict.message}"
    assert OVERRIDE_FLAG in verdict.message


def test_the_refusal_says_how_to_fix_it_and_when_sglang_chose_the_backend():
    refused = check("fa3", "fa3", allow_unproven=False, auto_selected=True)
    assert "--attention-backend triton" in refused.message
    assert "no --attention-backend was given" in refused.message
    assert "no --attention-backend" not in check("fa3", "fa3", allow_unproven=False).message


@pytest.mark.parametrize("lora, allow, allowed, unproven", [
    ("torch_native", False, True, None),  # the CPU LoRA proofs' backend
    ("csgmv", False, True, None),  # SGLang's GPU default: the H200 proof
    ("triton", False, False, "lora:triton"),  # segments planned from the batch, no proof
    ("triton", True, True, "lora:triton"),  # override: starts, reported
])
def test_lora_backends_are_gated_too(lora, allow, allowed, unproven):
    verdict = check("triton", "triton", allow_unproven=allow, lora_backend=lora)
    assert (verdict.allowed, verdict.unproven_backend) == (allowed, unproven)
    if unproven:
        assert f"LoRA backend {lora}" in verdict.message and OVERRIDE_FLAG in verdict.message
        assert all(name in verdict.message for name in PROVEN_LORA_BACKENDS)
    if not allowed:
        assert "--lora-backend csgmv" in verdict.message
        assert "--attention-backend" not in verdict.message  # triton is proven
    both = check("fa3", "fa3", allow_unproven=False, lora_backend="triton")
    assert both.unproven_backend == "fa3, lora:triton"


def test_lora_backend_counts_only_with_lora_on():
    def args(enable_lora):
        return SimpleNamespace(get_attention_backends=lambda: ("triton", "triton"),
                               enable_lora=enable_lora, lora_backend="triton")

    assert check_server_args(args(False), allow_unproven=False).allowed
    assert not check_server_args(args(True), allow_unproven=False).allowed


def _scheduler(prefill: str, decode: str, allow: bool) -> SimpleNamespace:
    """What scheduler_init_hook reads: resolved server args and the loaded model (the
    fixed-shape verifier: the row-invariant one's own gate is tests/test_row_pass.py's)."""
    server_args = SimpleNamespace(
        enable_llm42=True, llm42_allow_unproven_backend=allow, random_seed=0,
        llm42_verifier="fixed-shape",
        get_attention_backends=lambda: (prefill, decode))
    return SimpleNamespace(
        server_args=server_args, model_config=SimpleNamespace(context_len=1024, vocab_size=32),
        page_size=1, spec_algorithm=SimpleNamespace(is_none=lambda: True),
        enable_overlap=False, enable_metrics=False)


@pytest.fixture
def scheduler_init(monkeypatch):
    from llm42.sglang import hooks_lifecycle, plugin

    # The fake scheduler runs in this process, where SGLang's targets are not hooked.
    monkeypatch.setattr(plugin, "assert_hooks_applied", lambda: None)
    monkeypatch.setattr(runtime, "RUNTIME", None)
    return lambda scheduler: hooks_lifecycle.scheduler_init_hook(None, scheduler)


def test_the_scheduler_refuses_an_unproven_backend(scheduler_init):
    with pytest.raises(ValueError, match=f"fa3.*{OVERRIDE_FLAG}"):
        scheduler_init(_scheduler("fa3", "fa3", allow=False))
    assert runtime.RUNTIME is None


@pytest.mark.parametrize("backend, allow, reported", [
    ("fa3", True, "fa3"),  # the override: started, and the stats say on what
    ("triton", False, None),  # a proven backend: null
])
def test_the_stats_report_the_unproven_backend(scheduler_init, backend, allow, reported):
    scheduler_init(_scheduler(backend, backend, allow))
    snap = runtime.RUNTIME.snapshot()
    assert (snap["unproven_backend"], snap["allow_unproven_backend"]) == (reported, allow)



def test_a_fallback_from_auto_revalidates_the_flags(scheduler_init):
    """The launcher validated the flags against the row-invariant verifier; a scheduler that
    falls back to fixed-shape checks them again: prefix sharing without batched prefill is
    valid under row-invariant only, so the fallback stops the start, naming the flag."""
    scheduler = _scheduler("flashinfer", "flashinfer", allow=False)
    scheduler.server_args.__dict__.update(llm42_verifier="auto", llm42_prefix_cache=True,
                                          llm42_batched_prefill=False)
    scheduler.__dict__.update(device="cuda", req_to_token_pool=SimpleNamespace(size=256),
                              tp_worker=SimpleNamespace(model_runner=SimpleNamespace(model=None)))
    with pytest.raises(ValueError, match="--llm42-prefix-cache shares prompt KV written by "
                                         "prompt passes"):
        scheduler_init(scheduler)
    assert runtime.RUNTIME is None
    scheduler.server_args.llm42_batched_prefill = True  # valid for both: started, fixed-shape
    scheduler_init(scheduler)
    assert runtime.RUNTIME.snapshot()["verifier"] == "fixed-shape"


AUTO_CASES = [
    # (SGLang's default, usable here) -> llm42's backend
    ("fa3", ("flashinfer", "triton"), "flashinfer"),  # Hopper: FA3 has no proof
    ("trtllm_mha", ("flashinfer", "triton"), "flashinfer"),  # Blackwell's default, no proof
    ("fa3", ("triton",), "triton"),  # no FlashInfer installed, or attention sinks
    ("flashinfer", ("flashinfer", "triton"), "flashinfer"),  # SGLang's own pick, proven: kept
    ("triton", ("triton",), "triton"),  # ... likewise
    ("aiter", (), "aiter"),  # not an NVIDIA GPU: nothing proven, SGLang's stays for the gate
]


@pytest.mark.parametrize("default, usable, chosen", AUTO_CASES,
                         ids=[f"{c[0]}-{'+'.join(c[1]) or 'none'}" for c in AUTO_CASES])
def test_auto_select_serves_a_proven_backend_and_says_why(default, usable, chosen):
    backend, line = auto_select(default, usable)
    assert backend == chosen
    assert line.startswith(f"attention backend {chosen}"), line
    if chosen != default:
        assert f"instead of SGLang's default {default}" in line and "proof" in line, line
        assert "--attention-backend" in line, "the line says how to choose another"
    assert check(backend, backend, allow_unproven=False).allowed == (chosen != "aiter")


PREFER = ("triton", "the row-invariant verifier decodes on triton")


@pytest.mark.parametrize("default, usable, chosen", [
    ("fa3", ("flashinfer", "triton"), "triton"),  # Hopper: the verifier's backend, not FA3's
    ("flashinfer", ("flashinfer", "triton"), "triton"),  # over SGLang's proven default too
    ("triton", ("triton",), "triton"),
    ("fa3", ("flashinfer",), "flashinfer"),  # triton cannot serve it here: the usual choice
    ("aiter", (), "aiter"),  # not an NVIDIA GPU
])
def test_auto_select_serves_the_verifiers_backend_where_usable(default, usable, chosen):
    """With the row-invariant verifier possible (`--llm42-verifier auto`), a launch without a
    backend decodes on triton wherever triton can serve the model, and the line says why."""
    backend, line = auto_select(default, usable, prefer=PREFER)
    assert backend == chosen, line
    if chosen == "triton":
        assert PREFER[1] in line, line
        assert (f"instead of SGLang's default {default}" in line) == (default != "triton"), line


def test_the_gpu_preference_lists_only_proven_backends():
    assert set(GPU_AUTO_BACKENDS) <= set(PROVEN_BACKENDS)


# SGLang's own resolution (`prepare_server_args`, plugins loaded as the launcher does) on this
# CPU host with a Hopper GPU simulated: `--device cuda`, SGLang's FA3 probe forced true, and
# its FlashInfer probe set per case. One interpreter for every argv (importing sglang is slow).
_HOPPER_SCRIPT = r"""
import contextlib, io, json, sys
import sglang.srt.server_args as sglang_server_args
from sglang.srt.plugins import load_plugins
import sglang.launch_server as launcher

load_plugins()
sglang_server_args.is_hopper_with_cuda_12_3 = lambda: True
results = []
for flashinfer, argv in json.loads(sys.argv[1]):
    sglang_server_args.is_flashinfer_available = lambda: flashinfer
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            args = launcher.prepare_server_args(argv)
            res = {"code": "accepted", "backends": list(args.get_attention_backends())}
        except SystemExit as exc:
            res = {"code": exc.code}
    results.append({**res, "stderr": err.getvalue()})
print("\nRESULTS " + json.dumps(results))
"""


@pytest.fixture(scope="module")
def hopper_launches(tiny_model) -> list[dict]:
    base = ["--model-path", tiny_model, "--device", "cuda", "--max-total-tokens", "4096"]
    llm42 = base + ["--enable-llm42"]
    fixed = llm42 + ["--llm42-verifier", "fixed-shape"]
    runs = [
        (True, llm42),  # the defaults: auto, row-invariant wherever it can run
        (True, fixed),  # no backend given, FlashInfer installed
        (False, fixed),  # no backend given, no FlashInfer
        (True, base),  # plain SGLang: its own default, untouched
        (True, llm42 + ["--attention-backend", "fa3"]),  # explicitly unproven
        (True, llm42 + ["--llm42-verifier", "row-invariant"]),
    ]
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_USE_CPU_ENGINE"}
    res = subprocess.run([sys.executable, "-c", _HOPPER_SCRIPT, json.dumps(runs)],
                         capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0 and "\nRESULTS " in res.stdout, res.stderr[-3000:]
    return json.loads(res.stdout.rsplit("\nRESULTS ", 1)[1])


def test_hopper_launch_of_the_fixed_shape_verifier_serves_flashinfer_and_logs_why(
        hopper_launches):
    """fixed-shape without a backend: FlashInfer where installed (proven for its passes), else
    triton; plain SGLang keeps its own default."""
    fixed, no_flashinfer, plain = hopper_launches[1:4]
    assert plain["backends"] == ["fa3", "fa3"], "the simulation must give SGLang's Hopper default"
    assert fixed["code"] == "accepted", fixed["stderr"][-2000:]
    assert fixed["backends"] == ["flashinfer", "flashinfer"]
    [line] = [ln for ln in fixed["stderr"].splitlines() if ln.startswith("llm42: attention")]
    assert "flashinfer instead of SGLang's default fa3" in line and "not measured yet" in line
    assert "llm42:" not in plain["stderr"], "a server without --enable-llm42 is left alone"
    assert no_flashinfer["backends"] == ["triton", "triton"], no_flashinfer["stderr"][-2000:]


@pytest.mark.parametrize("index, verifier", [(0, "auto"), (5, "row-invariant")])
def test_hopper_launch_of_the_row_invariant_verifier_serves_triton(hopper_launches, index,
                                                                   verifier):
    """The row-invariant verifier decodes only on triton: a launch that may run it and names no
    backend (the default launch among them) serves triton, and the line says why."""
    launch = hopper_launches[index]
    assert launch["code"] == "accepted", launch["stderr"][-2000:]
    assert launch["backends"] == ["triton", "triton"]
    [line] = [ln for ln in launch["stderr"].splitlines() if ln.startswith("llm42: attention")]
    assert "triton instead of SGLang's default fa3" in line, line
    assert f"row-invariant verifier (--llm42-verifier {verifier})" in line, line


def test_hopper_launch_with_an_explicit_unproven_backend_is_still_refused(hopper_launches):
    refused = hopper_launches[4]
    assert refused["code"] == 2, refused
    error = refused["stderr"][refused["stderr"].index("llm42: error:"):]
    assert "attention backend fa3 has no determinism proof" in error, error
    assert "llm42: attention backend" not in refused["stderr"], "nothing auto-selected"
