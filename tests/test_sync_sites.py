"""`LLM42_SYNC_DEBUG=1`: synchronizing CUDA calls counted by site, per timeline iteration and in
the timeline's summary. torch's sync debug mode needs CUDA, so its warnings are raised here by
hand, as torch raises them: a UserWarning attributed to the Python line that made the call."""

from __future__ import annotations

import json
import warnings

import torch

from benchmarks.timeline import main, summarize
from llm42.core.timeline import StepTimeline
from llm42.sglang import sync_sites

MESSAGE = "called a synchronizing CUDA operation"


def _fake_llm42_hook(sites):
    """A function whose code says it lives in llm42/sglang/fake_hook.py, as a hook's would."""
    src = ("import sys\n"
           "def hook(sites):\n"
           "    sites.observe('/site/llm42/sglang/fake_hook.py', 3, sys._getframe(0))\n")
    scope: dict = {}
    exec(compile(src, "/site/llm42/sglang/fake_hook.py", "exec"), scope)
    return scope["hook"](sites)


def test_sites_are_counted_by_line_with_their_llm42_frames(tmp_path):
    sites = sync_sites.SyncSites(tmp_path / "syncs-1.json")
    for _ in range(3):
        _fake_llm42_hook(sites)
    sites.observe("/usr/lib/python3/site-packages/torch/_tensor.py", 1000, None)
    sites.write()
    body = json.loads((tmp_path / "syncs-1.json").read_text())
    assert body["total"] == 4
    assert body["sites"][0] == {"site": "llm42/sglang/fake_hook.py:3", "count": 3}
    assert body["sites"][1] == {"site": "_tensor.py:1000", "count": 1}
    (tmp_path / "syncs-1.json").unlink()
    sites.write()  # nothing new since the last write: the timeline's idle flushes cost nothing
    assert not (tmp_path / "syncs-1.json").exists()


def test_install_routes_only_sync_warnings_and_feeds_the_timeline(tmp_path, monkeypatch):
    assert sync_sites.install(tmp_path) is None  # off unless asked
    monkeypatch.setenv(sync_sites.ENV, "1")
    if not torch.cuda.is_available():
        assert sync_sites.install(tmp_path) is None  # nothing to count without CUDA
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    modes = []
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    others = []
    with warnings.catch_warnings():  # install's filter and handler end with this test
        warnings.showwarning = lambda *a, **k: others.append(str(a[0]))
        timeline = StepTimeline(tmp_path / "timeline-1.jsonl")
        sites = sync_sites.install(tmp_path)
        timeline.add_counter("syncs", sites.take)
        timeline.on_flush.append(sites.write)
        assert modes == ["warn"]
        timeline.begin()
        for _ in range(2):  # the same site twice: "always", not once per location
            warnings.warn(MESSAGE, UserWarning)
        warnings.warn("something else", UserWarning)
        timeline.launched("decode", reqs=1, tokens=1, running=1, queued=0)
        timeline.begin()
        timeline.launched("prefill", reqs=1, tokens=5, running=1, queued=0)
        timeline.close()
    assert others == ["something else"]
    records = [json.loads(x) for x in (tmp_path / "timeline-1.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["syncs"]) for r in records] == [("decode", 2), ("prefill", 0)]
    assert summarize(records)["iterations"]["decode"]["syncs_mean"] == 2.0
    body = json.loads(sites.path.read_text())
    assert body["total"] == 2 and body["sites"][0]["site"].startswith("test_sync_sites.py:")
    assert main([str(tmp_path), "--out-dir", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "timeline.md").read_text()
    assert "synchronizing CUDA calls per iteration" in text
    assert f"synchronizing CUDA calls: {sites.path.stem}" in text and "| 2 | `test_sync" in text


def test_timelines_without_the_diagnostic_carry_no_sync_column(tmp_path):
    timeline = StepTimeline(tmp_path / "timeline-2.jsonl")
    timeline.begin()
    timeline.launched("decode", reqs=1, tokens=1, running=1, queued=0)
    timeline.close()
    record = json.loads((tmp_path / "timeline-2.jsonl").read_text())
    assert "syncs" not in record
    assert "syncs_mean" not in summarize([record])["iterations"]["decode"]
