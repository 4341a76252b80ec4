"""patches/: every hooked SGLang function is declared with a fingerprint of its source, so that an
SGLang upgrade that changes one stops `--enable-llm42` with the list instead of running llm42 on
code it was not written for."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from llm42.server_process import cpu_server_env
from llm42.sglang import manifest, plugin, server_args


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


# What `python -m sglang.launch_server` does before and after parsing its flags: load the plugins
# (every hook registered), prepare_server_args(argv), then start a scheduler process, whose
# run_scheduler_process loads the plugins: `plugin.register()` into an empty registry. Each argv
# gets a scheduler of its own, started right after its parse (it inherits the environment of that
# moment). Forked, not spawned as SGLang does: a spawned child imports SGLang again (10 s each).
_LAUNCHER = r'''
import json, multiprocessing, sys

import sglang.launch_server as launcher
from sglang.srt.plugins import load_plugins
from sglang.srt.plugins.hook_registry import HookRegistry

from llm42.sglang import plugin


def scheduler(queue):
    HookRegistry.reset()
    plugin.register()
    queue.put(sorted(HookRegistry._hooks))


load_plugins()
results = {"launcher": sorted(HookRegistry._hooks)}
fork = multiprocessing.get_context("fork")
for name, argv in json.loads(sys.argv[1]).items():
    launcher.prepare_server_args(argv)
    queue = fork.Queue()
    proc = fork.Process(target=scheduler, args=(queue,))
    proc.start()
    results[name] = queue.get(timeout=120)
    proc.join()
print("\nRESULTS " + json.dumps(results))
'''


def test_schedulers_of_a_server_without_llm42_register_only_the_cli_hooks(tiny_model, tmp_path):
    """A plain server (llm42 installed, no flag that needs it) pays no hook on any step: its
    schedulers register the CLI hooks only (and the CPU engine's shims, which SGLang itself needs
    here). --enable-llm42 and --llm42-timeline-dir (a baseline's step timeline) get every hook,
    and so does the launcher, even when it inherits the plain decision of an earlier launch."""
    base = ["--model-path", tiny_model, "--device", "cpu", "--attention-backend",
            "torch_native", "--max-total-tokens", "4096"]
    argvs = {"plain": base, "llm42": base + ["--enable-llm42"],
             "timeline": base + ["--llm42-timeline-dir", str(tmp_path / "timeline")]}
    env = {**os.environ, **cpu_server_env(), plugin.HOOKS_ENV: plugin.HOOKS_CLI}
    res = subprocess.run([sys.executable, "-c", _LAUNCHER, json.dumps(argvs)], capture_output=True,
                         text=True, timeout=300, env=env)
    assert res.returncode == 0 and "\nRESULTS " in res.stdout, res.stderr[-3000:]
    registered = {k: set(v) for k, v in json.loads(res.stdout.rsplit("\nRESULTS ", 1)[1]).items()}

    specs = _specs()  # SGLANG_USE_CPU_ENGINE=1 there: the CPU-only hooks are registered too
    every = {s.target for s in specs if s.type not in (plugin.DET_REQUEST_TYPE, "property")}
    cli = {s.target for s in specs
           if s.target in plugin._CLI_TARGETS or s.type in plugin.CPU_ONLY_TYPES}
    assert plugin._CLI_TARGETS < cli < every
    assert "sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run" not in cli
    assert registered == {"launcher": every, "plain": cli, "llm42": every, "timeline": every}


def test_a_direct_call_of_the_cli_hook_leaves_the_environment_alone(monkeypatch):
    """Only a process whose ServerArgs.from_cli_args is hooked (a launcher) records the
    decision; a test calling the hook must not hand it to a later test's server or engine."""
    # set first, so that monkeypatch removes it again after the test whatever the hook wrote
    monkeypatch.setenv(plugin.HOOKS_ENV, plugin.HOOKS_ALL)
    monkeypatch.delenv(plugin.HOOKS_ENV)
    parsed = SimpleNamespace(override=lambda *args, **kwargs: None)
    assert server_args.from_cli_args_hook(lambda cls, a: parsed, object,
                                          argparse.Namespace()) is parsed
    assert plugin.HOOKS_ENV not in os.environ
