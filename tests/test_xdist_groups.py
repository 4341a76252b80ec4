"""`make test`'s worker groups (`xdist_groups.py`): a module that shares a session server with
others must land in their group, or a second worker starts that server again (memory)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from conftest import SESSION_SERVERS
from xdist_groups import GROUPS_ENV, INJECT_ONLY, SESSION, ServerGroupScheduling, module_groups, \
    write_groups


def _item(nodeid, *fixtures):
    return SimpleNamespace(nodeid=nodeid, fixturenames=["request", "tmp_path", *fixtures])


ITEMS = [
    _item("tests/test_a.py::test_1", "llm42_server"),
    _item("tests/test_a.py::test_2"),  # a module's tests stay together
    _item("tests/test_b.py::test_1", "inject_server"),
    _item("tests/test_c.py::test_1[x]", "inject_server", "spec_servers"),
    _item("tests/test_d.py::test_1", "inject_server"),
    _item("tests/test_d.py::test_2", "plain_server"),
    _item("tests/test_e.py::test_1", "tiny_model"),
]


def test_modules_are_grouped_by_the_session_servers_they_use():
    assert module_groups(ITEMS, SESSION_SERVERS) == {
        "tests/test_a.py": SESSION, "tests/test_b.py": INJECT_ONLY,
        "tests/test_c.py": INJECT_ONLY, "tests/test_d.py": SESSION,
        "tests/test_e.py": "tests/test_e.py"}


def test_the_scheduler_scopes_tests_by_the_groups_the_workers_wrote(tmp_path, monkeypatch):
    monkeypatch.setenv(GROUPS_ENV, str(tmp_path / "groups.json"))
    write_groups(ITEMS, SESSION_SERVERS)
    sched = ServerGroupScheduling.__new__(ServerGroupScheduling)  # scoping needs no workers
    assert [sched._split_scope(i.nodeid) for i in ITEMS] == [
        SESSION, SESSION, INJECT_ONLY, INJECT_ONLY, SESSION, SESSION, "tests/test_e.py"]
    with pytest.raises(RuntimeError, match="test_f.py: no test group"):
        sched._split_scope("tests/test_f.py::test_1")
