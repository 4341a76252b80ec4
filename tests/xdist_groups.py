"""Which of `make test`'s two pytest-xdist workers runs which module.

Most of the suite's time is SGLang CPU servers, and a 2-core, 24 GiB CI machine holds about ten
of them. Spread test by test, both workers would start every session server (`conftest.py`) and
every module-scoped one: twice the memory, and the kernel's OOM killer takes a scheduler. So a
module's tests stay on one worker, and the modules that share session servers stay together:

- `session-servers`: every module that uses a session server other than `inject_server`, about
  half of the suite's time. Each of those servers starts once.
- `inject-server-only`: the modules that need `inject_server` alone (the reference of the
  speculative and parallel-layout servers), about a quarter. The second worker starts its own
  `inject_server` (20 s) for them and takes every other module between them.

On this project's 2-core machine that ran the tests in 19 minutes instead of 29, both workers
finishing within about a minute of each other, with at most 19 GB of memory in use (15 GB for
one worker).

xdist's own `--dist loadgroup` would do this from `xdist_group` marks, but on pytest 9.2 it
silently distributes test by test (pytest-xdist issue 1386: the group rides on the node id,
which pytest no longer lets a plugin change). So the workers, which collect the tests and see
their fixtures, write each module's group to a file named by `LLM42_TEST_GROUPS` (the
controller sets it before they start), and the controller's scheduler (`ServerGroupScheduling`,
xdist's scope scheduler with this grouping) reads it once every worker has collected.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from xdist.scheduler import LoadScopeScheduling

GROUPS_ENV = "LLM42_TEST_GROUPS"
INJECT_ONLY = "inject-server-only"
SESSION = "session-servers"


def group_of(servers: set[str], module: str) -> str:
    """A module's group from the session servers its tests use."""
    if not servers:
        return module
    return INJECT_ONLY if servers == {"inject_server"} else SESSION


def _module(nodeid: str) -> str:
    """A node id's module file: the workers' keys and the controller's lookups must agree."""
    return nodeid.split("::")[0]


def module_groups(items, session_servers) -> dict[str, str]:
    """Each collected module's file (as in node ids) -> its group."""
    used: dict[str, set[str]] = {}
    for item in items:
        used.setdefault(_module(item.nodeid), set()).update(
            set(item.fixturenames) & set(session_servers))
    return {path: group_of(servers, path) for path, servers in used.items()}


class ServerGroups:
    """The plugin: registered by `conftest.py` where pytest-xdist is installed."""

    def pytest_configure(self, config):
        if (config.getvalue("dist") == "loadscope" and not hasattr(config, "workerinput")
                and GROUPS_ENV not in os.environ):
            fd, path = tempfile.mkstemp(prefix="llm42-test-groups-", suffix=".json")
            os.close(fd)
            os.environ[GROUPS_ENV] = path  # the workers inherit it
            config.add_cleanup(lambda: Path(path).unlink(missing_ok=True))

    def pytest_xdist_make_scheduler(self, config, log):
        if config.getvalue("dist") == "loadscope":
            return ServerGroupScheduling(config, log)
        return None


def write_groups(items, session_servers) -> None:
    """On a worker: publish the groups (every worker writes the same, atomically)."""
    path = os.environ.get(GROUPS_ENV)
    if path is None:
        return
    fd, tmp = tempfile.mkstemp(dir=Path(path).parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(module_groups(items, session_servers), f)
    os.replace(tmp, path)


class ServerGroupScheduling(LoadScopeScheduling):
    """`--dist loadscope` with the scope of a test being its module's group."""

    _groups: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self._groups is None:
            self._groups = json.loads(Path(os.environ[GROUPS_ENV]).read_text())
        module = _module(nodeid)
        if module not in self._groups:
            raise RuntimeError(f"{module}: no test group ({GROUPS_ENV} file of the workers)")
        return self._groups[module]
