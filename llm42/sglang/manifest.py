"""The patch manifest: which upstream SGLang functions llm42 hooks, per SGLang version.

`patches/sglang-<version>.json` (shipped as the package `llm42.patches`) lists every target with its
hook type, the llm42 function that implements it, why it is needed, and a fingerprint of the
upstream source. An SGLang upgrade that changes a hooked function changes its fingerprint, and
llm42 refuses to enable itself instead of silently running against code it was not written for.

    python -m llm42.sglang.manifest check      # compare with the installed SGLang
    python -m llm42.sglang.manifest update     # rewrite fingerprints (after reviewing the diff!)
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.resources
import inspect
import json
import pkgutil
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class HookSpec:
    target: str  # dotted path of the upstream function, method or property
    # before | after | around | around_det_req | property | replace_on_cpu | around_on_cpu
    type: str
    hook: str  # "module:function" implementing it in llm42
    reason: str
    fingerprint: str


def installed_sglang_version() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def _patches_dir() -> Path:
    """The manifests beside the imported `llm42` when it is a source checkout (a checkout on
    PYTHONPATH, e.g. a git worktree, must not read the installed checkout's manifests), else the
    installed package data."""
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file() and (checkout / "patches").is_dir():
        return checkout / "patches"
    return Path(str(importlib.resources.files("llm42.patches")))


def manifest_path(version: str) -> Path:
    return _patches_dir() / f"sglang-{version}.json"


def supported_versions() -> list[str]:
    root = _patches_dir()
    return sorted(p.stem.removeprefix("sglang-") for p in root.glob("sglang-*.json"))


def load_manifest(version: str) -> list[HookSpec]:
    path = manifest_path(version)
    if not path.exists():
        raise RuntimeError(
            f"llm42 has no patch manifest for sglang {version}; supported: "
            f"{', '.join(supported_versions())}. Install a supported sglang "
            f"(pip install 'sglang==0.5.17') or port patches/ to this version."
        )
    data = json.loads(path.read_text())
    return [HookSpec(**h) for h in data["hooks"]]


def resolve_upstream(target: str):
    """The original upstream object behind `target` (unwrapped if llm42 already hooked it)."""
    owner_path, attr = target.rsplit(".", 1)
    owner = pkgutil.resolve_name(owner_path)
    raw = owner.__dict__.get(attr) if isinstance(owner, type) else getattr(owner, attr)
    if raw is None:
        raw = getattr(owner, attr)
    if isinstance(raw, (classmethod, staticmethod)):
        raw = raw.__func__
    if isinstance(raw, property):
        raw = getattr(raw.fget, "__llm42_original__", raw.fget)
    return inspect.unwrap(raw)


def fingerprint_of(target: str) -> str:
    source = textwrap.dedent(inspect.getsource(resolve_upstream(target)))
    return "sha256:" + hashlib.sha256(source.encode()).hexdigest()[:16]


def resolve_hook(spec: HookSpec):
    module, name = spec.hook.split(":")
    return getattr(importlib.import_module(module), name)


def check(specs: list[HookSpec]) -> list[str]:
    """Human-readable mismatches between the manifest and the installed SGLang (empty = ok)."""
    problems = []
    for spec in specs:
        try:
            found = fingerprint_of(spec.target)
        except Exception as exc:  # missing attribute, moved module, ...
            problems.append(f"{spec.target}: cannot resolve ({exc.__class__.__name__}: {exc})")
            continue
        if found != spec.fingerprint:
            problems.append(f"{spec.target}: fingerprint {found}, manifest expects {spec.fingerprint}")
    return problems


def _update(version: str) -> None:
    path = manifest_path(version)
    data = json.loads(path.read_text())
    for h in data["hooks"]:
        h["fingerprint"] = fingerprint_of(h["target"])
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(f"updated {len(data['hooks'])} fingerprints in {path}")


def main(argv: list[str]) -> int:
    version = installed_sglang_version()
    if version is None:
        print("sglang is not installed", file=sys.stderr)
        return 2
    if argv[:1] == ["update"]:
        _update(version)
        return 0
    problems = check(load_manifest(version))
    for p in problems:
        print(p)
    print("ok" if not problems else f"{len(problems)} mismatch(es) for sglang {version}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
