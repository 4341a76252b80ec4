"""Start and stop a real ``sglang.launch_server`` in its own process group (tests, demo, bench).

    with SGLangServer(model_path, ["--enable-llm42"]) as server:
        requests.post(f"{server.url}/generate", json={"text": "Hi", "sampling_params": {}})

The server runs ``python -m sglang.launch_server`` with this interpreter, in a new session (so its
scheduler and detokenizer subprocesses share one process group), with output in a log file.
Readiness is ``GET /health`` answering 200, which SGLang returns only after its warmup request.
Without CUDA it runs SGLang's CPU engine with the flags and environment that work on CPU (see
``cpu_server_env`` and ``CPU_DEFAULT_ARGS``); with ``--tp-size`` N > 1 it also gives each TP rank
its own cores (``cpu_threads_bind``), without which SGLang's CPU engine refuses TP > 1 on a host
with fewer NUMA nodes than ranks. ``--dp-size`` needs nothing more:

    SGLangServer(model_path, ["--enable-llm42", "--tp-size", "2"])  # CPU: binds "0|1" on 2 cores

``stop()`` interrupts the launcher, which takes its process tree down, then signals the group,
SIGKILLs whatever is left and checks that every process it saw is gone.

``prestart()`` launches a server gated (``llm42.sglang.start_gate``): it imports SGLang and its
scheduler waits before any GPU work; ``start()`` then opens the gate and waits for ``/health``. A
benchmark driver overlaps the next server's imports with the current one's run that way.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import requests

# Appended in CPU mode unless the caller passes the same flag: the only attention backend SGLang
# runs on CPU without sgl-kernel, a bounded KV cache (the CPU default sizes it from RAM), and an
# idle scheduler that waits on its sockets: without --sleep-on-idle it busy-polls a whole core
# while it has nothing to do, which starves every other server and client on a small CPU host.
# A value of None is a switch without a value.
CPU_DEFAULT_ARGS: tuple[tuple[str, str | None], ...] = (
    ("--device", "cpu"),
    ("--attention-backend", "torch_native"),
    ("--max-total-tokens", "16384"),
    ("--sleep-on-idle", None),
)
_POLL_INTERVAL_S = 0.5
_PORT_RETRIES = 2  # new ports tried when the chosen one was taken before SGLang bound it
_STOP_GRACE_S = 20.0
_LOG_TAIL_CHARS = 4000
_BIND_ENV = "SGLANG_CPU_OMP_THREADS_BIND"


def cpu_server_env() -> dict[str, str]:
    """Environment for SGLang's CPU engine: ``is_cpu()`` true, one OpenMP thread per process."""
    return {"SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": "1"}


def cpu_threads_bind(tp_size: int, cpu_ids: Sequence[int] | None = None) -> str:
    """SGLang's ``SGLANG_CPU_OMP_THREADS_BIND`` for `tp_size` ranks: the usable cores split into
    `tp_size` contiguous groups, "0|1" for 2 ranks on 2 cores ("0-3|4-7" on 8). With fewer cores
    than ranks, ranks share cores round-robin (slow, but SGLang starts)."""
    cpus = sorted(cpu_ids if cpu_ids is not None else os.sched_getaffinity(0))
    if tp_size <= len(cpus):
        share = len(cpus) // tp_size
        groups = [cpus[r * share:(r + 1) * share] for r in range(tp_size)]
    else:
        groups = [[cpus[r % len(cpus)]] for r in range(tp_size)]
    return "|".join(_cpu_list(g) for g in groups)


def _cpu_list(cpus: list[int]) -> str:
    """Cores as libnuma's cpu string: runs as ranges, "0-3,6" for [0, 1, 2, 3, 6]."""
    runs: list[list[int]] = []
    for cpu in cpus:
        if runs and cpu == runs[-1][-1] + 1:
            runs[-1].append(cpu)
        else:
            runs.append([cpu])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def tp_size_of(args: Sequence[str]) -> int:
    """The TP size `args` give SGLang (``--tp-size``, ``--tensor-parallel-size`` or ``--tp``)."""
    names = ("--tp-size", "--tensor-parallel-size", "--tp")
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in names:
            return int(value if eq else args[i + 1])
    return 1


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def detect_device() -> str:
    """``"cuda"`` when torch sees a GPU, else ``"cpu"``."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class SGLangServerError(RuntimeError):
    """The server did not come up (the message ends with the tail of its log)."""


class SGLangServerTimeout(SGLangServerError):
    """Still starting when `startup_timeout` ran out (so its log holds no reason)."""


class _PortTaken(SGLangServerError):
    """The HTTP port was bound by another process between ``free_port()`` and SGLang's own bind
    (at the end of its startup, tens of seconds later); uvicorn then hangs in its shutdown."""


class SGLangServer:
    """A ``sglang.launch_server`` subprocess; a context manager that starts and stops it."""

    stop_grace_s: float = _STOP_GRACE_S  # seconds of SIGTERM before SIGKILL (tests shorten it)

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        extra_args: Sequence[str] = (),
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        env: Mapping[str, str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        startup_timeout: float = 300.0,
        device: str | None = None,
    ) -> None:
        self.model_path = str(model_path)
        self.host = host
        self._port = port if port is not None else free_port(host)
        self._port_chosen = port is None  # ours to change when another process takes it
        self.device = device or detect_device()
        self.startup_timeout = startup_timeout
        if log_path is None:
            fd, log_name = tempfile.mkstemp(prefix="sglang-server-", suffix=".log")
            os.close(fd)
            log_path = log_name
        self._log_path = Path(log_path)
        self.args = self._build_args(list(extra_args))
        self.env = dict(os.environ)
        if self.device == "cpu":
            self.env.update(cpu_server_env())
            tp_size = tp_size_of(extra_args)
            if tp_size > 1 and not os.environ.get(_BIND_ENV):
                self.env[_BIND_ENV] = cpu_threads_bind(tp_size)
        self.env.update(env or {})
        self._process: subprocess.Popen[bytes] | None = None
        self._seen_pids: set[int] = set()
        self._gate: Path | None = None  # set by prestart() until start() opens it

    # -- properties ----------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self._port}"

    @property
    def log_path(self) -> Path:
        return self._log_path

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def log_text(self) -> str:
        try:
            return self._log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    # -- lifecycle -----------------------------------------------------------------------------
    def __enter__(self) -> SGLangServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def prestart(self) -> None:
        """Launch the server gated: it imports SGLang, then its scheduler waits before any GPU
        work until ``start()`` opens the gate (``llm42.sglang.start_gate``)."""
        if self._process is not None:
            raise RuntimeError(f"server already started (pid {self._process.pid})")
        self._gate = self._log_path.with_name(self._log_path.name + ".gate")
        self._gate.unlink(missing_ok=True)
        self._launch()

    def start(self) -> None:
        """Launch the server (or open a prestarted one's gate) and block until ``/health`` is
        200 (or raise SGLangServerError); the startup timeout counts from here.

        A port this object chose itself and another process bound in the meantime (servers
        started side by side pick their internal ports while ours waits) is replaced by a new
        free one, up to ``_PORT_RETRIES`` times."""
        if self._gate is not None and self._process is not None:
            gate, self._gate = self._gate, None
            gate.touch()
            try:
                self._wait_until_healthy()
                return
            except _PortTaken:
                self.stop()  # launched again below, ungated
            except BaseException:
                self.stop()
                raise
            finally:
                gate.unlink(missing_ok=True)  # every process has passed it (or is gone)
        if self._process is not None:
            raise RuntimeError(f"server already started (pid {self._process.pid})")
        retries = _PORT_RETRIES if self._port_chosen else 0
        for attempt in range(retries + 1):
            self._launch()
            try:
                self._wait_until_healthy()
                return
            except _PortTaken:
                self.stop()
                if attempt == retries:
                    raise
                self._set_port(free_port(self.host))
            except BaseException:
                self.stop()
                raise

    def _launch(self) -> None:
        from llm42.sglang import start_gate

        env = dict(self.env)
        if self._gate is not None:
            env[start_gate.ENV] = str(self._gate)
        with open(self._log_path, "wb") as log:
            self._process = subprocess.Popen(
                self.args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # own process group: stop() reaches every child
            )

    def _set_port(self, port: int) -> None:
        self._port = port
        i = self.args.index("--port")
        self.args[i + 1] = str(port)

    def stop(self, grace_s: float | None = None) -> None:
        """Stop the server and every process of its group; raise if any survives SIGKILL.

        1. SIGINT to the launcher alone: uvicorn stops at once and the launcher kills its
           scheduler/detokenizer tree, in about 2 s. (SGLang's SIGTERM drains requests first,
           but its watchdog looks for the signal every 5 s: about 6 s a stop, over the tens of
           servers a test run starts. A signal to the whole group first would make the launcher
           see a "crashed" scheduler and sleep 5 s for crash diagnostics.)
        2. SIGTERM to the group for whatever is still alive, then SIGKILL after ``grace_s``.
        """
        if self._gate is not None:  # prestarted, never opened: a later start() is ungated
            self._gate.unlink(missing_ok=True)
            self._gate = None
        process = self._process
        if process is None:
            return
        grace_s = self.stop_grace_s if grace_s is None else grace_s
        self._remember_children()
        pgid = process.pid  # start_new_session: the launcher's pid is the group id
        _signal(process.pid, signal.SIGINT)
        self._wait_all_gone(grace_s / 2)
        if self._alive_pids():
            _signal_group(pgid, signal.SIGTERM)
            self._wait_all_gone(grace_s / 2)
        if self._alive_pids():
            _signal_group(pgid, signal.SIGKILL)
            for pid in self._alive_pids():  # a descendant that left the group
                _signal(pid, signal.SIGKILL)
            self._wait_all_gone(10.0)
        if process.poll() is None:
            process.kill()
        process.wait()
        leftovers = self._alive_pids()
        self._process = None
        if leftovers:
            raise SGLangServerError(f"SGLang processes still alive after SIGKILL: {leftovers}")

    def _wait_all_gone(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process is not None:
                self._process.poll()  # reap the launcher so it stops counting as alive
            if not self._alive_pids():
                return
            time.sleep(0.1)

    def process_ids(self) -> set[int]:
        """Every pid seen for this server so far (the launcher and its descendants)."""
        self._remember_children()
        return set(self._seen_pids)

    # -- helpers -------------------------------------------------------------------------------
    def _build_args(self, extra: list[str]) -> list[str]:
        args = [sys.executable, "-m", "sglang.launch_server", "--model-path", self.model_path,
                "--host", self.host, "--port", str(self._port)]
        if self.device == "cpu":
            for flag, value in CPU_DEFAULT_ARGS:
                if not _has_flag(extra, flag):
                    args += [flag] if value is None else [flag, value]
        return args + extra

    def _wait_until_healthy(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self.startup_timeout
        while True:
            code = self._process.poll()
            if code is not None:
                raise SGLangServerError(
                    f"sglang.launch_server exited with code {code} before becoming healthy; "
                    f"log {self._log_path}:\n{self._log_tail()}"
                )
            try:
                if requests.get(f"{self.url}/health", timeout=5).status_code == 200:
                    self._remember_children()
                    return
            except requests.RequestException:
                if f"{self._port}): address already in use" in self._log_tail():
                    raise _PortTaken(f"port {self._port} taken; log {self._log_path}") from None
            if time.monotonic() > deadline:
                raise SGLangServerTimeout(
                    f"sglang.launch_server not healthy after {self.startup_timeout:.0f} s "
                    f"({self.url}/health); log {self._log_path}:\n{self._log_tail()}"
                )
            time.sleep(_POLL_INTERVAL_S)

    def _log_tail(self) -> str:
        return self.log_text()[-_LOG_TAIL_CHARS:]

    def _remember_children(self) -> None:
        if self._process is None:
            return
        self._seen_pids.add(self._process.pid)
        self._seen_pids.update(_descendants(self._process.pid))
        self._seen_pids.update(_group_members(self._process.pid))

    def _alive_pids(self) -> list[int]:
        return sorted(pid for pid in self._seen_pids | _group_members(self.pid or -1)
                      if _is_alive(pid))


def _has_flag(args: Sequence[str], flag: str) -> bool:
    return any(arg == flag or arg.startswith(flag + "=") for arg in args)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _descendants(pid: int) -> set[int]:
    try:
        import psutil

        return {child.pid for child in psutil.Process(pid).children(recursive=True)}
    except Exception:  # psutil missing, or the process already gone
        return set()


def _group_members(pgid: int) -> set[int]:
    """Pids whose process group is ``pgid`` (reads /proc; empty where there is none)."""
    members = set()
    proc = Path("/proc")
    if pgid <= 0 or not proc.is_dir():
        return members
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()  # after "(comm)": state ppid pgrp ...
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            members.add(int(entry.name))
    return members


def _is_alive(pid: int) -> bool:
    """True for a live, non-zombie process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"
