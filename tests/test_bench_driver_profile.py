"""`benchmarks.driver --profile-steps`: against a tiny HTTP server standing in for SGLang's
/get_load and /start_profile (which writes a trace the way SGLang's profiler does), the trigger
asks for one profile once the load is steady, and the run's trace is summarized beside it.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from test_step_profile import _synthetic_trace

from benchmarks import driver, profile_trigger

# (running + waiting, waiting) per /get_load call; the last one repeats
LOADS = [[(250, 100)], [(250, 100)], [(150, 0), (60, 0)]]


@pytest.fixture
def fake_sglang():
    """A server answering GET /get_load with LOADS in turn and recording the bodies POSTed to
    /start_profile; each one writes a trace into its output_dir, as SGLang does after its
    num_steps."""
    posts, calls = [], []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, body: bytes, status=200):
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path != "/get_load":
                return self._send(b"", 404)
            load = LOADS[min(len(calls), len(LOADS) - 1)]
            calls.append(load)
            self._send(json.dumps([{"dp_rank": i, "num_reqs": n, "num_waiting_reqs": w}
                                   for i, (n, w) in enumerate(load)]).encode())

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            posts.append((self.path, body))
            if self.path == "/start_profile":
                out = Path(body["output_dir"]) / f"{body['profile_prefix']}-1.5-TP-0.trace.json.gz"
                out.write_bytes(gzip.compress(json.dumps(_synthetic_trace()).encode()))
            self._send(b"Start profiling.\n")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", posts, calls
    server.shutdown()
    server.server_close()


def test_profile_options_parse():
    args = driver.build_parser().parse_args(["--out-dir", "x", "--profile-steps", "5"])
    assert (args.profile_steps, args.profile_running, args.profile_settle_s) == (5, 200, 3.0)
    assert driver.build_parser().parse_args(["--out-dir", "x"]).profile_steps == 0


def test_trigger_starts_one_profile_once_the_load_is_steady(fake_sglang, tmp_path):
    url, posts, calls = fake_sglang
    trigger = profile_trigger.ProfileTrigger(url, tmp_path, "llm42-w64_r1", 5, 200, 0.05, poll_s=0.02)
    trigger.start()
    deadline = time.monotonic() + 3
    while not posts and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)  # the load stays steady: still one profile
    trigger.stop()
    [(path, body)] = posts
    assert path == "/start_profile" and len(calls) == 3  # 150 running with 100 waiting: not yet
    assert body == {"output_dir": str(tmp_path), "num_steps": 5, "activities": ["CPU", "GPU"],
                    "with_stack": True, "record_shapes": False, "profile_prefix": "llm42-w64_r1"}
    assert trigger.posted and trigger.load_seen == (210, 0) and not trigger.is_alive()


def test_bench_run_takes_and_summarizes_a_profile(fake_sglang, tmp_path, monkeypatch, capsys):
    url, posts, _ = fake_sglang
    monkeypatch.setattr(profile_trigger, "PROFILE_POLL_S", 0.02)
    monkeypatch.setattr(profile_trigger, "PROFILE_STABLE_S", 0.1)
    args = driver.build_parser().parse_args([
        "--model-path", "m", "--out-dir", str(tmp_path / "out"), "--profile-steps", "5",
        "--profile-settle-s", "0"])
    run = subprocess.run

    def client(argv, **kwargs):  # the benchmark client: runs until the profile was asked for
        if "benchmarks.bench_serving" not in argv:
            return run(argv, **kwargs)
        deadline = time.monotonic() + 3
        while not posts and time.monotonic() < deadline:
            time.sleep(0.02)
        with open(argv[argv.index("--output-file") + 1], "a", encoding="utf-8") as f:
            f.write('{"row": 1}\n')
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(driver.subprocess, "run", client)
    d = driver.Driver(args)
    d.bench(driver.ServerConfig("llm42-w64", "llm42", [], [1.0]), url,
            ["--dataset-name", "random", "--random-input-len", "128", "--random-output-len",
             "512", "--num-prompts", "256"], 1.0)
    folder = tmp_path / "out" / "profile_llm42-w64_r1_random-128-512-n256"
    [(_, body)] = posts
    assert body["output_dir"] == str(folder.resolve()) and body["num_steps"] == 5
    assert "| cudaStreamSynchronize | 1 | 0.120 |" in (folder / "profile.md").read_text()
    assert json.loads((folder / "profile.json").read_text())["steps"] == 2
    assert f"[driver] profile {folder.resolve()}: 2 steps" in capsys.readouterr().out


def test_no_profile_when_the_load_never_settles(fake_sglang, tmp_path, capsys):
    url, posts, _ = fake_sglang
    folder = tmp_path / "profile_x"
    folder.mkdir()
    trigger = profile_trigger.ProfileTrigger(url, folder, "x", 5, 1000, 0.0, poll_s=0.02)
    trigger.start()
    time.sleep(0.15)
    assert profile_trigger.finish_profile(trigger) is None
    assert posts == [] and not folder.exists()  # the empty folder is not left behind
    assert "not taken" in capsys.readouterr().out
