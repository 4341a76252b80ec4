"""patches/: every hooked SGLang function is declared with a fingerprint of its source, so that an
SGLang upgrade that changes one stops `--enable-llm42` with the list instead of running llm42 on
code it was not written for."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from llm42.sglang import manifest, plugin


def _specs():
    return manifest.load_manifest(manifest.installed_sglang_version())


def test_manifest_matches_the_pinned_sglang():
    specs = _specs()
    assert manifest.installed_sglang_version() == "0.5.17"
    assert manifest.check(specs) == []
    targets = [s.target for s in specs]
    assert len(targets) == len(set(targets)), "one entry per upstream target"
    for spec in specs:
        assert spec.type in ("before", "after", "around", "property", plugin.DET_REQUEST_TYPE,
                             *plugin.CPU_ONLY_TYPES), spec
        assert callable(manifest.resolve_hook(spec)), spec.hook
        assert spec.reason and spec.fingerprint.startswith("sha256:"), spec


def test_a_changed_or_missing_upstream_function_is_reported_by_name():
    spec = _specs()[0]
    changed = dataclasses.replace(spec, fingerprint="sha256:0000000000000000")
    gone = dataclasses.replace(spec, target="sglang.srt.server_args.ServerArgs.no_such_method")
    problems = manifest.check([spec, changed, gone])
    assert len(problems) == 2
    assert problems[0].startswith(spec.target) and "manifest expects sha256:0000" in problems[0]
    assert problems[1].startswith(gone.target) and "cannot resolve" in problems[1]


def test_unknown_sglang_version_names_the_supported_ones():
    with pytest.raises(RuntimeError, match="0.5.17"):
        manifest.load_manifest("0.0.1")


def test_mismatch_registers_only_the_cli_hooks_and_enable_llm42_stops(monkeypatch, capsys):
    """The plugin still adds the flags (so the launcher can say what is wrong), hooks nothing
    else, and --enable-llm42 exits naming each mismatching target."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    from llm42.sglang import server_args

    registered = []
    monkeypatch.setattr(HookRegistry, "register",
                        classmethod(lambda cls, target, hook, kind: registered.append(target)))
    monkeypatch.setattr(manifest, "check", lambda specs: ["sglang.x.f: fingerprint sha256:1"])
    monkeypatch.setattr(plugin, "REGISTRATION_PROBLEMS", [])
    plugin.register()
    assert set(registered) == plugin._CLI_TARGETS
    assert plugin.REGISTRATION_PROBLEMS == ["sglang.x.f: fingerprint sha256:1"]

    args = argparse.Namespace(enable_llm42=True)
    with pytest.raises(SystemExit):
        server_args.from_cli_args_hook(lambda cls, a: pytest.fail("launched"), object, args)
    err = capsys.readouterr().err
    assert "does not match llm42's patches/ manifest" in err and "sglang.x.f" in err


def test_matching_manifest_registers_every_hook(monkeypatch):
    from sglang.srt.plugins.hook_registry import HookRegistry

    registered = []
    monkeypatch.setattr(HookRegistry, "register",
                        classmethod(lambda cls, target, hook, kind: registered.append(target)))
    monkeypatch.setattr(plugin, "REGISTRATION_PROBLEMS", [])
    monkeypatch.setattr(plugin, "_patch_property", lambda target, hook: registered.append(target))
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    monkeypatch.setattr(plugin, "DET_REQUEST_HOOKS", [])
    plugin.register()
    assert plugin.REGISTRATION_PROBLEMS == []
    per_request = [s for s in _specs() if s.type == plugin.DET_REQUEST_TYPE]
    assert [name for name, _ in plugin.DET_REQUEST_HOOKS] == [
        s.target.rsplit(".", 1)[1] for s in per_request] == ["update_finish_state"]
    assert sorted(registered) == sorted(s.target for s in _specs() if s not in per_request)
