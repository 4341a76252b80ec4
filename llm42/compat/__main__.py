"""CLI for llm42's CPU compat switch.

    python -m llm42.compat install-pth [--site-packages DIR]
    python -m llm42.compat remove-pth  [--site-packages DIR]
    python -m llm42.compat status
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from pathlib import Path

from llm42.compat import pth


def _status() -> int:
    pth_path = pth.site_packages_dir() / pth.PTH_NAME
    print(f"{pth.PTH_NAME}: {'present' if pth_path.exists() else 'absent'} ({pth_path})")
    print(f"compat folder on sys.path: {str(pth.COMPAT_DIR) in sys.path}")
    real = pth.find_real_sgl_kernel()
    print(f"real sgl_kernel: {real or 'not found'}")
    # Before importing it: once imported, find_spec answers from sys.modules.
    print(f"find_spec('torchvision') is None: {importlib.util.find_spec('torchvision') is None}")
    for name in ("sgl_kernel", "torchvision"):
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            print(f"import {name}: fails ({exc})")
            continue
        origin = getattr(module, "__file__", None)
        is_ours = Path(origin or "").resolve().is_relative_to(pth.COMPAT_DIR)
        print(f"import {name}: {'llm42 compat' if is_ours else 'real package'} ({origin})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llm42.compat", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (
        ("install-pth", "write llm42_compat.pth (no-op when a real sgl_kernel is importable)"),
        ("remove-pth", "delete llm42_compat.pth"),
    ):
        cmd = sub.add_parser(name, help=help_text)
        cmd.add_argument("--site-packages", type=Path, default=None,
                         help="target folder (default: this interpreter's site-packages)")
    sub.add_parser("status", help="show which sgl_kernel / torchvision this interpreter imports")
    args = parser.parse_args(argv)

    if args.command == "status":
        return _status()
    if args.command == "install-pth":
        result = pth.install_pth(args.site_packages)
    else:
        result = pth.remove_pth(args.site_packages)
    print(f"llm42.compat: {result.message}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
