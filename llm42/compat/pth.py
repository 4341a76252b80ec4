"""Write or remove ``llm42_compat.pth``, the one switch that activates llm42's CPU compat modules.

The file goes into the running interpreter's site-packages and holds two lines:

1. the absolute path of ``llm42/compat``: ``site`` appends it to ``sys.path`` after site-packages,
   so real ``sgl_kernel`` and ``torchvision`` packages always win;
2. ``import llm42_compat_probe_guard``: keeps the torchvision placeholder invisible to
   ``importlib.util.find_spec`` probes (transformers' availability check).

    python -m llm42.compat install-pth      # what `make venv` runs
    python -m llm42.compat status
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

PTH_NAME = "llm42_compat.pth"
COMPAT_DIR = Path(__file__).resolve().parent
GUARD_MODULE = "llm42_compat_probe_guard"


@dataclass(frozen=True)
class PthResult:
    """What ``install_pth`` / ``remove_pth`` did.

    ``action`` is one of written, unchanged, skipped, removed, absent.
    """

    action: str
    pth_path: Path
    message: str


def site_packages_dir() -> Path:
    """The running interpreter's pure-Python site-packages (the venv's, under a venv)."""
    return Path(sysconfig.get_paths()["purelib"])


def pth_text(compat_dir: Path = COMPAT_DIR) -> str:
    return (
        "# llm42 CPU compat (sgl_kernel stand-in, torchvision placeholder); written by\n"
        "# `python -m llm42.compat install-pth`. Delete this file to disable it.\n"
        f"{compat_dir}\n"
        f"import {GUARD_MODULE}\n"
    )


def find_real_sgl_kernel() -> str | None:
    """Location of an ``sgl_kernel`` that is not llm42's stand-in, or None.

    Searches ``sys.path`` without the compat folder, so an already-installed ``.pth`` does not make
    the stand-in look like the real package.
    """
    search_path = [p for p in sys.path if Path(p or ".").resolve() != COMPAT_DIR]
    spec = importlib.machinery.PathFinder.find_spec("sgl_kernel", search_path)
    if spec is None:
        return None
    return spec.origin or ", ".join(spec.submodule_search_locations or []) or "sgl_kernel"


def install_pth(site_dir: Path | None = None) -> PthResult:
    """Write the ``.pth`` unless a real sgl_kernel is importable (then remove a stale one)."""
    pth_path = (site_dir or site_packages_dir()) / PTH_NAME
    real = find_real_sgl_kernel()
    if real is not None:
        removed = remove_pth(site_dir)
        note = f"; removed the stale {pth_path}" if removed.action == "removed" else ""
        return PthResult(
            "skipped",
            pth_path,
            f"real sgl_kernel found at {real}: llm42's CPU compat is not needed, "
            f"nothing written{note}",
        )
    text = pth_text()
    if pth_path.exists() and pth_path.read_text() == text:
        return PthResult("unchanged", pth_path, f"{pth_path} is already up to date")
    # Write then rename, so a concurrent interpreter start never reads half a file.
    tmp_path = pth_path.with_name(f".{PTH_NAME}.{os.getpid()}.tmp")
    tmp_path.write_text(text)
    os.replace(tmp_path, pth_path)
    return PthResult(
        "written", pth_path, f"wrote {pth_path}: appends {COMPAT_DIR} after site-packages"
    )


def remove_pth(site_dir: Path | None = None) -> PthResult:
    pth_path = (site_dir or site_packages_dir()) / PTH_NAME
    if not pth_path.exists():
        return PthResult("absent", pth_path, f"{pth_path} does not exist")
    pth_path.unlink()
    return PthResult("removed", pth_path, f"removed {pth_path}")
