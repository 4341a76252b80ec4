"""Install llm42 into a plain folder for PYTHONPATH, offline, without pip or setuptools.

    python3 benchmarks/gpu/install_llm42.py --target /tmp/sgl/llm42-site
    export PYTHONPATH=/tmp/sgl/llm42-site:$PYTHONPATH

SGLang finds llm42 through the `sglang.srt.plugins` entry point, which `importlib.metadata`
reads from a `*.dist-info/entry_points.txt` on `sys.path`; the repository root alone has none.
This copies the packages listed in pyproject.toml (honouring `package-dir`, so `patches/` becomes
`llm42.patches`, with its package data) and writes a minimal `llm42-<version>.dist-info`
(METADATA, entry_points.txt, top_level.txt, INSTALLER, RECORD). Python >= 3.11 (tomllib).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import tomllib

REPO_ROOT = Path(__file__).resolve().parents[2]


def package_source(name: str, package_dir: dict[str, str], root: Path) -> Path:
    if name in package_dir:
        return root / package_dir[name]
    parent, _, leaf = name.rpartition(".")
    if parent:
        return package_source(parent, package_dir, root) / leaf
    return root / package_dir.get("", ".") / name


def install(target: Path, root: Path = REPO_ROOT) -> Path:
    project = tomllib.loads((root / "pyproject.toml").read_text())
    meta, st = project["project"], project.get("tool", {}).get("setuptools", {})
    package_dir, data = st.get("package-dir", {}), st.get("package-data", {})
    name, version = meta["name"], meta["version"]
    target.mkdir(parents=True, exist_ok=True)
    for top in {p.split(".")[0] for p in st["packages"]}:
        shutil.rmtree(target / top, ignore_errors=True)
    written: list[Path] = []
    for package in st["packages"]:
        src = package_source(package, package_dir, root)
        dst = target.joinpath(*package.split("."))
        dst.mkdir(parents=True, exist_ok=True)
        globs = ["*.py"] + data.get(package, [])
        for pattern in globs:
            for f in sorted(src.glob(pattern)):
                if f.is_file():
                    shutil.copy2(f, dst / f.name)
                    written.append(dst / f.name)
        if not (dst / "__init__.py").exists():  # a data-only folder such as patches/
            (dst / "__init__.py").write_text("")
            written.append(dst / "__init__.py")
    info = target / f"{name}-{version}.dist-info"
    shutil.rmtree(info, ignore_errors=True)
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                   f"Summary: {meta.get('description', '')}\n")
    eps = meta.get("entry-points", {})
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in items.items()) + "\n"
        for group, items in eps.items()))
    (info / "top_level.txt").write_text(
        "\n".join(sorted({p.split(".")[0] for p in st["packages"]})) + "\n")
    (info / "INSTALLER").write_text("llm42-install\n")
    files = written + [info / n for n in ("METADATA", "entry_points.txt", "top_level.txt",
                                          "INSTALLER")]
    (info / "RECORD").write_text("".join(f"{f.relative_to(target)},,\n" for f in files)
                                 + f"{info.name}/RECORD,,\n")
    return info


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--root", default=str(REPO_ROOT), help="the repository (has pyproject.toml)")
    args = p.parse_args(argv)
    print(install(Path(args.target), Path(args.root)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
