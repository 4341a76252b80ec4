"""SGLang plugin entry point (`sglang.srt.plugins` group): registers llm42's hooks in every process.

SGLang calls `register()` in the launcher, the tokenizer manager's process and each scheduler
subprocess, then applies the hooks. The hook list is data (`patches/`); this module only turns it
into `HookRegistry` registrations. If the installed SGLang does not match the manifest, only the
CLI hooks are registered, so `--enable-llm42` stops the launch with the list of mismatches
instead of running on unknown code. Nor are more registered in the schedulers of a server that
needs none of llm42's runtime hooks (`HOOKS_ENV`).
"""

from __future__ import annotations

import logging
import os

from llm42.sglang import hook_times, manifest, start_gate

logger = logging.getLogger(__name__)

# Problems found at registration; reported by the CLI hook when --enable-llm42 is given.
REGISTRATION_PROBLEMS: list[str] = []
# Hook types registered only on SGLang's CPU engine (CPU compat shims, `llm42/compat/`).
CPU_ONLY_TYPES = ("replace_on_cpu", "around_on_cpu")
# AROUND a method of SGLang's Req, bound on each deterministic request when it is created
# (`hooks_lifecycle.req_init_hook`), so every other request keeps SGLang's own method: a class-wide
# wrapper would cost every request a Python call layer per decode step (~0.2 us each, 57 us of a
# 256-row step here), on a host-bound step, for a hook that only deterministic requests need.
DET_REQUEST_TYPE = "around_det_req"
# (method name, hook) pairs of DET_REQUEST_TYPE, filled by `register` in every SGLang process.
DET_REQUEST_HOOKS: list[tuple[str, object]] = []
_CLI_TARGETS = {
    "sglang.srt.server_args.ServerArgs.add_cli_args",
    "sglang.srt.server_args.ServerArgs.from_cli_args",
}
# Whether the schedulers of this server register llm42's runtime hooks: the launcher decides from
# its flags (`server_args.from_cli_args_hook`, `record_hooks_decision`) and writes it into its
# environment, which the scheduler processes it spawns afterwards inherit. HOOKS_CLI: the server
# runs plain SGLang (no flag of `server_args.RUNTIME_HOOK_FLAGS`), so its schedulers register the
# CLI hooks only and pay no hook on any step; unset or HOOKS_ALL: every hook of patches/.
HOOKS_ENV = "LLM42_HOOKS"
HOOKS_ALL = "all"
HOOKS_CLI = "cli"


def register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if _cpu_engine():
        # SGLang's seeded sampler is torch.compile'd; on CPU-only hosts inductor picks up the
        # GPU-less triton that xgrammar pulls in and fails. Eager mode computes the same values.
        # Set before the scheduler subprocess is spawned, which imports torch afresh.
        os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")
        from llm42.compat import unpinned_memory

        unpinned_memory.install()  # SGLang's LoRA asks for pinned buffers

    version = manifest.installed_sglang_version()
    try:
        specs = manifest.load_manifest(version)
        problems = manifest.check(specs)
    except Exception as exc:
        specs = [
            manifest.HookSpec(t, "around", _cli_hook_name(t), "CLI", "") for t in _CLI_TARGETS
        ]
        problems = [str(exc)]
    REGISTRATION_PROBLEMS[:] = problems
    if problems:
        logger.error("llm42 disabled: sglang %s does not match patches/: %s", version, problems)
        specs = [s for s in specs if s.target in _CLI_TARGETS]
    elif _cli_hooks_only():
        # the CPU engine's shims stay: a plain server on a CPU-only host needs them too
        specs = [s for s in specs if s.target in _CLI_TARGETS or s.type in CPU_ONLY_TYPES]

    types = {
        "before": HookType.BEFORE,
        "after": HookType.AFTER,
        "around": HookType.AROUND,
        "replace_on_cpu": HookType.REPLACE,
        "around_on_cpu": HookType.AROUND,
    }
    DET_REQUEST_HOOKS.clear()
    for spec in specs:
        if spec.type in CPU_ONLY_TYPES and not _cpu_engine():
            continue
        hook = manifest.resolve_hook(spec)
        if spec.type == DET_REQUEST_TYPE:
            DET_REQUEST_HOOKS.append((spec.target.rsplit(".", 1)[1], hook))
        elif spec.type == "property":
            _patch_property(spec.target, hook)
        else:
            if hook_times.enabled():  # LLM42_HOOK_TIMES=1: a diagnostic, see hook_times
                hook = hook_times.timed(".".join(spec.target.rsplit(".", 2)[-2:]), hook,
                                        around=types[spec.type] == HookType.AROUND)
            HookRegistry.register(spec.target, hook, types[spec.type])
    # a server prestarted by the benchmark driver: its scheduler waits here, imports done and
    # before any CUDA call, until the server running now has stopped
    start_gate.wait(is_main_process=not _spawned_by_launcher())


def _cli_hooks_only() -> bool:
    """Whether the launcher that started this process decided its server needs no runtime hook.

    Only a multiprocessing child (a scheduler) obeys HOOKS_ENV. A launcher, started otherwise,
    registers every hook before it parses its flags whatever it inherited, so a value left in
    the environment of what started it (a shell, a test process, an earlier launch) can never
    strip an llm42 launch of its tokenizer manager's hooks; it writes its own decision before it
    spawns a scheduler."""
    return os.environ.get(HOOKS_ENV) == HOOKS_CLI and _spawned_by_launcher()


def _spawned_by_launcher() -> bool:
    """A multiprocessing child (a scheduler), not the launcher a shell or a driver started."""
    import multiprocessing

    return multiprocessing.parent_process() is not None


def record_hooks_decision(needed: bool) -> None:
    """The launcher's decision (`from_cli_args_hook`, flags parsed) for the schedulers it spawns.

    Written only where SGLang's `ServerArgs.from_cli_args` is hooked, i.e. in a process that
    loaded the plugins to launch a server: a test that calls the hook directly leaves os.environ
    alone, so no later server or engine of the test process inherits another test's flags."""
    from sglang.srt.server_args import ServerArgs

    if getattr(ServerArgs.from_cli_args, "__wrapped__", None) is not None:
        os.environ[HOOKS_ENV] = HOOKS_ALL if needed else HOOKS_CLI


def _cpu_engine() -> bool:
    return os.environ.get("SGLANG_USE_CPU_ENGINE") == "1"


def _cli_hook_name(target: str) -> str:
    return f"llm42.sglang.server_args:{target.rsplit('.', 1)[1]}_hook"


def _patch_property(target: str, getter) -> None:
    """HookRegistry cannot wrap properties; replace the getter, keeping the original reachable."""
    import pkgutil

    owner_path, attr = target.rsplit(".", 1)
    owner = pkgutil.resolve_name(owner_path)
    original = owner.__dict__[attr]
    if getattr(original.fget, "__llm42_original__", None) is not None:
        return  # already patched in this process

    def fget(self, _orig=original.fget):
        return getter(_orig, self)

    fget.__llm42_original__ = original.fget
    fget.__wrapped__ = original.fget
    setattr(owner, attr, property(fget, original.fset, original.fdel, original.__doc__))


def assert_hooks_applied() -> None:
    """HookRegistry only logs a target it failed to patch; refuse to run half-hooked."""
    import pkgutil

    missing = []
    for spec in manifest.load_manifest(manifest.installed_sglang_version()):
        if spec.type in CPU_ONLY_TYPES and not _cpu_engine():
            continue
        if spec.type == DET_REQUEST_TYPE:  # bound per request, not on the class
            if spec.target.rsplit(".", 1)[1] not in dict(DET_REQUEST_HOOKS):
                missing.append(spec.target)
            continue
        owner_path, attr = spec.target.rsplit(".", 1)
        owner = pkgutil.resolve_name(owner_path)
        raw = owner.__dict__.get(attr) if isinstance(owner, type) else getattr(owner, attr)
        if isinstance(raw, (classmethod, staticmethod)):
            raw = raw.__func__
        if isinstance(raw, property):
            raw = raw.fget
        if not hasattr(raw, "__wrapped__"):
            missing.append(spec.target)
    if missing:
        raise RuntimeError(
            "llm42: these SGLang targets were not hooked (see earlier 'Failed to apply hooks' "
            f"log lines): {missing}. Expected sglang {manifest.installed_sglang_version()} "
            "to match patches/."
        )
