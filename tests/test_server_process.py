"""llm42.server_process: argument defaults, fail-fast start, group cleanup.

The real-server lifecycle (a launched server serves, then `stop()` leaves none of its processes
alive) is checked on the one server tests/test_restart.py starts and stops anyway, rather than
on a server of its own here: a CPU server start costs about as much as all of this file.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from helpers import is_gone
from llm42.server_process import (
    SGLangServer,
    SGLangServerError,
    SGLangServerTimeout,
    cpu_server_env,
    cpu_threads_bind,
    tp_size_of,
)


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
    assert args[args.index("--sleep-on-idle") + 1].startswith("--"), "a switch, no value"
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


@pytest.mark.parametrize("tp_size, cpus, expected", [
    (2, [0, 1], "0|1"),  # this CI host: a core per rank
    (2, range(8), "0-3|4-7"),
    (2, [0, 2, 3, 5], "0,2|3,5"),  # a cpuset with holes: libnuma lists, not a false range
    (3, [0, 1], "0|1|0"),  # more ranks than cores: shared round-robin
])
def test_cpu_threads_bind_gives_each_tp_rank_its_cores(tp_size, cpus, expected):
    assert cpu_threads_bind(tp_size, cpus) == expected


def test_cpu_tp_server_binds_threads_unless_told(tmp_path, monkeypatch):
    """SGLang's CPU engine asserts on TP > 1 without SGLANG_CPU_OMP_THREADS_BIND (one NUMA node)."""
    monkeypatch.delenv("SGLANG_CPU_OMP_THREADS_BIND", raising=False)
    assert [tp_size_of(a) for a in (["--tp-size", "2"], ["--tp=4"], ["--tensor-parallel-size",
                                    "3"], ["--dp-size", "2"])] == [2, 4, 3, 1]
    tp2 = SGLangServer(tmp_path, ["--tp-size", "2"], device="cpu")
    assert tp2.env["SGLANG_CPU_OMP_THREADS_BIND"].count("|") == 1
    dp2 = SGLangServer(tmp_path, ["--dp-size", "2"], device="cpu")
    assert "SGLANG_CPU_OMP_THREADS_BIND" not in dp2.env
    told = SGLangServer(tmp_path, ["--tp-size", "2"], device="cpu",
                        env={"SGLANG_CPU_OMP_THREADS_BIND": "0|0"})
    assert told.env["SGLANG_CPU_OMP_THREADS_BIND"] == "0|0"
    gpu = SGLangServer(tmp_path, ["--tp-size", "2"], device="cuda")
    assert "SGLANG_CPU_OMP_THREADS_BIND" not in gpu.env


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
    with pytest.raises(SGLangServerTimeout, match="not healthy after 3 s"):
        server.start()
    child_pid = int(server.log_text().split()[1])
    assert is_gone(child_pid), "a SIGTERM-ignoring child must be SIGKILLed by stop()"
    assert not server.is_running()


def test_a_port_taken_before_sglang_binds_it_is_replaced(tmp_path):
    """Servers started side by side: another process may bind the HTTP port this object chose
    before SGLang binds it at the end of its startup (uvicorn then hangs). The first launch
    reports the bind error and hangs; the second, on a new port, serves /health."""
    script = (
        "import http.server, pathlib, sys, time\n"
        "port = int(sys.argv[sys.argv.index('--port') + 1])\n"
        f"marker = pathlib.Path({str(tmp_path / 'tried')!r})\n"
        "if not marker.exists():\n"
        "    marker.write_text(str(port))\n"
        "    print(f\"ERROR:    [Errno 98] error while attempting to bind on address \"\n"
        "          f\"('127.0.0.1', {port}): address already in use\", flush=True)\n"
        "    time.sleep(600)\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200); self.end_headers()\n"
        "http.server.HTTPServer(('127.0.0.1', port), H).serve_forever()\n"
    )
    server = fake_server(tmp_path, script, startup_timeout=60)
    server.args += ["--port", str(server.port)]
    first = server.port
    started = time.monotonic()
    try:
        server.start()
        assert server.port != first and int((tmp_path / "tried").read_text()) == first
        assert server.args[server.args.index("--port") + 1] == str(server.port)
        assert time.monotonic() - started < 30, "the bind error must be seen, not timed out"
    finally:
        server.stop()


GATED_SCRIPT = '''\
import http.server, json, multiprocessing, sys, time
from llm42.sglang import start_gate

def child(out):  # as SGLang's scheduler: register() waits before any GPU work
    json.dump({"waited": start_gate.wait(is_main_process=False), "at": time.time()},
              open(out, "w"))

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()

if __name__ == "__main__":
    port, out = int(sys.argv[sys.argv.index("--port") + 1]), sys.argv[1]
    assert start_gate.wait(is_main_process=True) == 0.0  # the launcher goes on to spawn
    multiprocessing.set_start_method("spawn")
    proc = multiprocessing.Process(target=child, args=(out,))
    proc.start(); proc.join()
    http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
'''


def test_a_prestarted_server_waits_at_the_gate_until_start(tmp_path):
    """prestart(): the server's subprocess waits at the gate (llm42.sglang.start_gate) however
    long the current run takes; start() opens it and the server becomes healthy; a server
    started without prestart() is not gated."""
    script, out = tmp_path / "gated.py", tmp_path / "child.json"
    script.write_text(GATED_SCRIPT)
    repo = str(Path(__file__).resolve().parents[1])
    server = SGLangServer(tmp_path / "no-model", device="cpu", log_path=tmp_path / "gated.log",
                          startup_timeout=60, env={"PYTHONPATH": repo})
    server.args = [sys.executable, str(script), str(out), "--port", str(server.port)]
    try:
        server.prestart()
        time.sleep(3.0)
        assert server.is_running() and not out.exists(), "the child passed a closed gate"
        opened = time.time()
        server.start()
        seen = json.loads(out.read_text())
        assert seen["waited"] > 2.0 and seen["at"] >= opened, seen
        assert not any(p.name.endswith(".gate") for p in tmp_path.iterdir()), "gate left behind"
    finally:
        server.stop()
    out.unlink()
    server.start()  # plain start: no gate, so the child goes straight on
    try:
        assert json.loads(out.read_text())["waited"] == 0.0
    finally:
        server.stop()
