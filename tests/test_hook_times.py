"""`LLM42_HOOK_TIMES=1`: each llm42 hook's own host time, per hook and per timeline iteration."""

from __future__ import annotations

import json

from benchmarks.timeline import main, summarize
from llm42.core.timeline import StepTimeline
from llm42.sglang import hook_times, plugin


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_an_around_hook_is_charged_its_own_time_not_sglangs(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(hook_times.time, "perf_counter", clock)
    monkeypatch.setattr(hook_times, "TIMES", {})
    hook_times.take()

    def original(x):
        clock.now += 5.0  # SGLang's work: not the hook's
        return x + 1

    def around(orig, x):
        clock.now += 2.0
        return orig(x) * 10

    def after(result, x):
        clock.now += 0.5

    timed_around = hook_times.timed("Scheduler.get_next_batch_to_run", around, around=True)
    timed_after = hook_times.timed("Req.__init__", after, around=False)
    assert timed_around(original, 1) == 20 and timed_around.__name__ == "around"
    timed_after(None, 1)
    assert hook_times.TIMES == {"Scheduler.get_next_batch_to_run": [1, 2.0],
                                "Req.__init__": [1, 0.5]}
    assert hook_times.take() == 2.5 and hook_times.take() == 0.0


def test_a_wait_reported_as_not_own_is_charged_to_no_hook(monkeypatch):
    """The timeline's wait inside process_batch_result's hook is SGLang's wait: not the hook's,
    and, reported inside SGLang's original under another hook, not taken off that one twice."""
    clock = Clock()
    monkeypatch.setattr(hook_times.time, "perf_counter", clock)
    monkeypatch.setattr(hook_times, "TIMES", {})
    hook_times.take()

    def waiting(orig):
        clock.now += 4.0  # the wait for the result's GPU work
        hook_times.not_own(4.0)
        clock.now += 0.5  # the hook's own work
        return orig()

    def process():
        clock.now += 1.0
        return "done"

    inner = hook_times.timed("Scheduler.process_batch_result", waiting, around=True)
    assert inner(process) == "done"

    def outer(orig):
        clock.now += 0.25
        return orig()

    timed_outer = hook_times.timed("Scheduler.get_next_batch_to_run", outer, around=True)
    assert timed_outer(lambda: inner(process)) == "done"
    assert hook_times.TIMES == {"Scheduler.process_batch_result": [2, 1.0],
                                "Scheduler.get_next_batch_to_run": [1, 0.25]}
    assert hook_times.take() == 1.25


def test_iterations_carry_their_hooks_time_and_the_summary_tables_it(tmp_path, monkeypatch):
    monkeypatch.setattr(hook_times, "TIMES", {"Sampler.forward": [4, 0.002]})
    pending = [0.0]

    def take():
        seconds, pending[0] = pending[0], 0.0
        return seconds

    timeline = StepTimeline(tmp_path / "timeline-3.jsonl")
    timeline.add_counter("hook_s", take)
    timeline.begin()
    pending[0] = 0.004
    timeline.launched("prefill", reqs=1, tokens=9, running=1, queued=0)
    timeline.begin()
    pending[0] = 0.003  # an idle poll's hooks: dropped with its record
    timeline.launched(None, reqs=0, tokens=0, running=1, queued=0)
    timeline.begin()
    pending[0] = 0.001
    timeline.launched("decode", reqs=1, tokens=1, running=1, queued=0)
    timeline.close()
    records = [json.loads(x) for x in (tmp_path / "timeline-3.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["hook_s"]) for r in records] == [("prefill", 0.004), ("decode", 0.001)]
    iterations = summarize(records)["iterations"]
    assert iterations["prefill"]["hook_mean_ms"] == 4.0
    hook_times.write(tmp_path / "hooks-3.json", min_interval_s=0.0)
    assert main([str(tmp_path), "--out-dir", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "timeline.md").read_text()
    assert "llm42 hooks' own host time (ms)" in text
    assert "| `Sampler.forward` | 4 | 0.002 | 500 |" in text


def test_hooks_time_is_split_by_the_class_of_iteration_it_fell_in(tmp_path, monkeypatch):
    """A plain decode step's hooks apart from a step with a pass and one verifying inline (the
    H100 totals mixed them); an idle poll's time goes to no class; the report tables the split."""
    clock = Clock()
    monkeypatch.setattr(hook_times.time, "perf_counter", clock)
    monkeypatch.setattr(hook_times, "TIMES", {})
    monkeypatch.setattr(hook_times, "BY_CLASS", {})
    hook_times.take()

    def spend(seconds):
        def around(orig):
            clock.now += seconds
            return orig()
        return around

    planner = hook_times.timed("Scheduler.get_next_batch_to_run", spend(0.0002), around=True)
    forward = hook_times.timed("ModelRunner.forward", spend(0.0015), around=True)
    timeline = StepTimeline(tmp_path / "timeline-5.jsonl", clock=clock)
    timeline.add_counter("hook_s", hook_times.take)
    timeline.on_close.append(hook_times.attribute)
    for kind, passes, inline in [("decode", 0, False), ("decode", 0, False), ("decode", 1, False),
                                 ("decode", 0, True), (None, 0, False), ("decode", 0, False)]:
        timeline.begin()
        planner(lambda: None)
        if passes:
            timeline.observe_pass(4, 0, 0.01)
        if inline:
            timeline.observe_inline()
            forward(lambda: None)
        timeline.launched(kind, reqs=4, tokens=4, running=4, queued=0)
    timeline.begin()  # closes the last record
    by_class = {cls: (n, {k: round(v, 6) for k, v in hooks.items()})
                for cls, (n, hooks) in hook_times.BY_CLASS.items()}
    assert by_class == {
        "decode": (3, {"Scheduler.get_next_batch_to_run": 0.0006}),
        "decode pass": (1, {"Scheduler.get_next_batch_to_run": 0.0002}),
        "decode inline": (1, {"Scheduler.get_next_batch_to_run": 0.0002,
                              "ModelRunner.forward": 0.0015})}
    hook_times.write(tmp_path / "hooks-5.json", min_interval_s=0.0)
    timeline.close()
    assert main([str(tmp_path), "--out-dir", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "timeline.md").read_text()
    assert "| decode | 3 | 200.0 | `Scheduler.get_next_batch_to_run` 200.0 |" in text
    assert "| decode inline | 1 | 1700.0 | `ModelRunner.forward` 1500.0," in text
    plain = summarize([json.loads(x) for x in (tmp_path / "timeline-5.jsonl").read_text()
                       .splitlines() if '"kind"' in x])["decode_by_batch"]
    assert plain["1-31"]["iterations"] == 3, "the pass and the inline step are not plain"


def test_register_wraps_every_hook_only_when_asked(monkeypatch):
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    registered = []
    monkeypatch.setattr(HookRegistry, "register",
                        lambda target, hook, kind: registered.append((target, hook, kind)))
    monkeypatch.setattr(hook_times, "TIMES", {})
    monkeypatch.delenv(hook_times.ENV, raising=False)
    plugin.register()
    plain = {target: hook for target, hook, _ in registered}
    assert plain and not hook_times.TIMES
    registered.clear()
    monkeypatch.setenv(hook_times.ENV, "1")
    plugin.register()
    timed = {target: (hook, kind) for target, hook, kind in registered}
    assert timed.keys() == plain.keys()
    target = "sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run"
    hook, kind = timed[target]
    assert kind == HookType.AROUND and hook is not plain[target]
    assert hook.__wrapped__ is plain[target]  # functools.update_wrapper
    assert "Scheduler.get_next_batch_to_run" in hook_times.TIMES  # Class.method
