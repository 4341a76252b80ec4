"""Shared fixtures: a tiny random Llama and real SGLang CPU servers (started once per session)."""

from __future__ import annotations

import os
import time

import pytest

from benchmarks.server_state import is_idle, server_load

WINDOW = 8
VERIFY_BATCH = 4
CONTEXT = 1024
CHUNK = 32  # --chunked-prefill-size of batched_server
SOLO_MIN = 300  # --llm42-solo-prefill-min-tokens of batched_server
SESSION_SERVERS = ("llm42_server", "inject_server", "batched_server", "plain_server")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    from llm42.models import write_random_llama

    # bf16 and a wider hidden size than the preset: decode and extend numerics then differ now
    # and then on CPU, so rollbacks also happen without injection.
    return write_random_llama(
        str(tmp_path_factory.mktemp("tiny-llama")), preset="tiny", seed=0, std=0.05,
        dtype="bfloat16", overrides={"hidden_size": 256, "intermediate_size": 512},
    )


def _llm42_args(rate: float = 0.0, window: int = WINDOW) -> list[str]:
    """The fixed-shape verifier's servers: their tests count its passes, pad rows and
    rollbacks (tests/test_row_invariant.py serves the row-invariant one, the default where it
    can run; tests/test_server_surface.py launches the defaults)."""
    return [
        "--enable-llm42", "--llm42-verifier", "fixed-shape",
        "--llm42-window-size", str(window),
        "--llm42-verify-batch-size", str(VERIFY_BATCH),
        "--llm42-inject-mismatch-rate", str(rate),
        "--random-seed", "7",
        "--context-length", str(CONTEXT),
        "--no-llm42-batched-prefill",  # solo prefills; batched_server covers the default
        "--enable-custom-logit-processor",
    ]


def _start(model: str, args: list[str], name: str, tmp_path_factory, env=None):
    from llm42.server_process import SGLangServer

    log = tmp_path_factory.mktemp(name) / "server.log"
    server = SGLangServer(model, args, log_path=str(log), startup_timeout=300, env=env)
    server.start()
    return server


@pytest.fixture(scope="session")
def llm42_server(tiny_model, tmp_path_factory):
    timeline = tmp_path_factory.mktemp("llm42-timeline")
    # At most one verification pass per scheduler step: outputs must equal inject_server's
    # (no cap), which several tests compare. Benchmark modes can be switched (a test that does
    # switches them back).
    args = _llm42_args() + ["--llm42-timeline-dir", str(timeline),
                            "--llm42-max-passes-per-step", "1", "--llm42-benchmark-modes"]
    server = _start(tiny_model, args, "llm42", tmp_path_factory)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def inject_server(tiny_model, tmp_path_factory):
    """Same model and flags as llm42_server, but half of all windows get a forced mismatch, and
    SGLang's normal event loop instead of the overlap loop (llm42_server): tests comparing the
    two also show that both loops give the same deterministic outputs."""
    args = _llm42_args(rate=0.5) + ["--disable-overlap-schedule"]
    server = _start(tiny_model, args, "inject", tmp_path_factory)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def batched_server(tiny_model, lora_adapters, tmp_path_factory):
    """Deterministic prefills join normal prefill batches; their prompts are verified after
    (`--llm42-batched-prefill`). Every such fast-path prefill is perturbed (random KV noise and
    o_0, `llm42.sglang.prefill_faults`), and a fifth of all windows get a forced mismatch.
    Prompts longer than CHUNK tokens prefill in chunks (alone or batched); deterministic
    requests share verified prompt rows through the radix cache (`--llm42-prefix-cache`);
    prompts of SOLO_MIN tokens or more prefill alone (`--llm42-solo-prefill-min-tokens`); passes
    are held back in steps that prefill (`--llm42-defer-verify-on-prefill`), and queued before the
    result in flight is processed (`--llm42-overlap-verify`). It serves two LoRA adapters with
    SGLang's torch-native LoRA backend (`lora_adapters`; requests without one use the base
    model)."""
    timeline = tmp_path_factory.mktemp("batched-timeline")
    args = _llm42_args(rate=0.2) + ["--llm42-timeline-dir", str(timeline),
                                    "--llm42-batched-prefill", "--llm42-prefix-cache",
                                    "--chunked-prefill-size", str(CHUNK),
                                    "--llm42-solo-prefill-min-tokens", str(SOLO_MIN),
                                    "--llm42-defer-verify-on-prefill", "--llm42-overlap-verify",
                                    "--enable-lora", "--lora-backend", "torch_native",
                                    "--max-loras-per-batch", "3", "--max-lora-rank", "8",
                                    "--lora-paths",
                                    *(f"{n}={p}" for n, p in lora_adapters.items())]
    server = _start(tiny_model, args, "batched", tmp_path_factory,
                    env={"LLM42_TEST_PERTURB_PREFILL": "1"})
    yield server
    server.stop()


@pytest.fixture(scope="session")
def plain_server(tiny_model, tmp_path_factory):
    """SGLang without --enable-llm42 (the plugin is loaded), recording a baseline step timeline.
    SGLang's own bf16 LM head: llm42's fp32 logits are for deterministic rows and passes only,
    so normal requests compare bitwise across the two."""
    timeline = tmp_path_factory.mktemp("plain-timeline")
    server = _start(tiny_model, ["--random-seed", "7", "--context-length", str(CONTEXT),
                                 "--llm42-timeline-dir", str(timeline)],
                    "plain", tmp_path_factory)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def lora_adapters(tiny_model, tmp_path_factory) -> dict[str, str]:
    """Two random adapters of different ranks and targets (both change the tiny model's output)."""
    from llm42.models import write_random_lora

    root = tmp_path_factory.mktemp("lora")
    return {"a": write_random_lora(root / "a", base_dir=tiny_model, seed=1, rank=8,
                                   dtype="bfloat16"),
            "b": write_random_lora(root / "b", base_dir=tiny_model, seed=2, rank=4,
                                   dtype="bfloat16", targets=("q_proj", "v_proj", "down_proj"))}


def wait_idle_and_healthy(server, timeout: float = 120.0) -> None:
    """SGLang's strict idle leak check kills the scheduler on a leaked KV slot or request row;
    so a server that is idle and still running has leaked nothing. (The scheduler runs
    the check each time it goes idle, before it sleeps: CPU servers run with --sleep-on-idle.)
    Fails when the server is not idle within `timeout` s: the leak check never ran."""
    deadline = time.monotonic() + timeout
    while not is_idle(load := server_load(server.url)):  # None: no answer, ask again
        assert server.is_running(), f"SGLang server process died (see {server.log_path})"
        if time.monotonic() > deadline:
            pytest.fail(f"server {server.url} not idle {timeout:.0f} s after the test, so its "
                        f"idle leak check never ran (last load: {load}; log: "
                        f"{server.log_path})")
        time.sleep(0.2)
    # The scheduler publishes its idle load (the snapshot /v1/loads reads) only after the leak
    # check of that idle iteration passed; a leak raises before it, and SGLang then takes the
    # whole server down. (SGLang's /health would add a full second per server and test: it
    # polls once a second.)
    time.sleep(0.1)
    assert is_idle(server_load(server.url)), f"server unhealthy after test: {server.log_path}"
    assert server.is_running(), f"SGLang server process died (see {server.log_path})"


@pytest.fixture(autouse=True)
def _servers_stay_clean(request):
    yield
    for name in SESSION_SERVERS:
        if name in request.fixturenames:
            wait_idle_and_healthy(request.getfixturevalue(name))


def pytest_configure(config):
    if config.pluginmanager.hasplugin("xdist"):  # `make test`: two workers (xdist_groups.py)
        from xdist_groups import ServerGroups

        config.pluginmanager.register(ServerGroups(), "llm42-server-groups")


def pytest_collection_modifyitems(config, items):
    if hasattr(config, "workerinput"):
        from xdist_groups import write_groups

        write_groups(items, SESSION_SERVERS)


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
