"""Facts recorded with every result: accelerator and CPU names, git commit, JSONL appends.

    rec.update(gpu=gpu_name(), git_commit=git_commit())
    append_jsonl("results.jsonl", rec)
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def gpu_name() -> str:
    """The first CUDA device's name ("NVIDIA H200"), or "cpu" without one.

    nvidia-smi first: it answers without creating a CUDA context in the client process.
    """
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=False)
        names = [n.strip() for n in out.stdout.splitlines() if n.strip()]
        if out.returncode == 0 and names:
            return names[0]
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001, S110 - any torch/CUDA failure means no usable GPU here
        pass
    return "cpu"


def cpu_model() -> str:
    """"AMD EPYC (2 CPUs)": CPU runs are slow and their speed depends on the host."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=20, check=False)
        for line in out.stdout.splitlines():
            if line.startswith("Model name:"):
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} CPUs)"
    except (OSError, subprocess.SubprocessError):
        pass
    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} CPUs)"


def host_load_avg() -> float | None:
    """The host's 1-minute load average: other processes slow a CPU run down."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def git_commit() -> str | None:
    """HEAD of this checkout (with "-dirty" for local changes); `LLM42_GIT_COMMIT` wins, for
    copies of the tree without `.git` (the GPU host)."""
    if os.environ.get("LLM42_GIT_COMMIT"):
        return os.environ["LLM42_GIT_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                              text=True, timeout=20, check=False)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=REPO_ROOT, capture_output=True, text=True, timeout=20,
                               check=False)
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def append_jsonl(path: str | os.PathLike, record: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, allow_nan=False) + "\n")
