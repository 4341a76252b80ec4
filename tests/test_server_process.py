"""llm42.server_process: argument defaults, fail-fast start, group cleanup, a real server."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import requests

from llm42.models import default_model_path, write_random_llama
from llm42.server_process import SGLangServer, SGLangServerError, cpu_server_env


def is_gone(pid: int) -> bool:
    """Dead or a zombie (an orphaned child waits for init to reap it; it runs nothing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X")


def fake_server(tmp_path: Path, script: str, **kwargs) -> SGLangServer:
    """An SGLangServer whose command is a small Python script instead of sglang.launch_server."""
    server = SGLangServer(tmp_path / "no-model", device="cpu", log_path=tmp_path / "fake.log",
                          **kwargs)
    server.args = [sys.executable, "-c", script]
    return server


# -- arguments and environment ------------------------------------------------------------------
def test_cpu_mode_adds_defaults_unless_given(tmp_path):
    server = SGLangServer(tmp_path, ["--max-total-tokens=4096", "--enable-llm42"], device="cpu",
                          port=31234, env={"OMP_NUM_THREADS": "2"})
    args = server.args
    assert args[:3] == [sys.executable, "-m", "sglang.launch_server"]
    assert args[args.index("--device") + 1] == "cpu"
    assert args[args.index("--attention-backend") + 1] == "torch_native"
    assert "--max-total-tokens" not in args, "the caller's --max-total-tokens=4096 must win"
    assert args[-2:] == ["--max-total-tokens=4096", "--enable-llm42"]
    assert server.env["SGLANG_USE_CPU_ENGINE"] == "1"
    assert server.env["OMP_NUM_THREADS"] == "2", "an explicit env entry overrides the CPU default"
    assert server.url == "http://127.0.0.1:31234" and server.port == 31234


def test_cuda_mode_adds_nothing(tmp_path):
    server = SGLangServer(tmp_path, ["--tp", "1"], device="cuda")
    assert "--device" not in server.args and server.args[-2:] == ["--tp", "1"]
    assert server.env.get("SGLANG_USE_CPU_ENGINE") == os.environ.get("SGLANG_USE_CPU_ENGINE")
    assert cpu_server_env() == {"SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": "1"}


def test_exit_before_healthy_fails_fast_with_log_tail(tmp_path):
    server = fake_server(tmp_path, "print('model file not found: boom'); raise SystemExit(3)",
                         startup_timeout=120)
    started = time.monotonic()
    with pytest.raises(SGLangServerError, match=r"(?s)exited with code 3.*boom"):
        server.start()
    assert time.monotonic() - started < 30, "must not wait for startup_timeout"


def test_startup_timeout_stops_the_process_group(tmp_path):
    # The launcher starts a child that ignores SIGTERM, then never becomes healthy.
    script = (
        "import signal, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', "
        "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])\n"
        "print('child', child.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    server = fake_server(tmp_path, script, startup_timeout=3)
    server.stop_grace_s = 2.0
    with pytest.raises(SGLangServerError, match="not healthy after 3 s"):
        server.start()
    child_pid = int(server.log_text().split()[1])
    assert is_gone(child_pid), "a SIGTERM-ignoring child must be SIGKILLed by stop()"
    assert not server.is_running()


# -- a real SGLang server -----------------------------------------------------------------------
@pytest.mark.server
def test_real_server_generates_and_leaves_no_process(tmp_path):
    model = write_random_llama(tmp_path / "tiny", tokenizer_dir=default_model_path())
    with SGLangServer(model, log_path=tmp_path / "server.log", startup_timeout=600) as server:
        response = requests.post(
            f"{server.url}/generate",
            json={"text": "Hello world", "sampling_params": {"max_new_tokens": 8,
                                                             "temperature": 0.0}},
            timeout=120,
        )
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["meta_info"]["completion_tokens"] == 8, body
        assert len(body["output_ids"]) == 8, body
        pids = server.process_ids()
        # launcher (HTTP + tokenizer), scheduler, detokenizer
        assert len(pids) >= 3, f"expected the launcher and its children, saw {pids}"
    alive = [pid for pid in pids if not is_gone(pid)]
    assert alive == [], f"processes left after stop(): {alive}\n{server.log_text()[-2000:]}"
    assert "Uvicorn running" in server.log_text() or "fired up" in server.log_text()
