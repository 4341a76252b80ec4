"""`benchmarks.step_profile`: a real torch.profiler trace taken on CPU (python stacks, step
annotations) and a hand-built GPU trace whose busy time, idle gaps, host syncs and steps are
known exactly.
"""

from __future__ import annotations

import gzip
import json

import pytest

from benchmarks import step_profile

torch = pytest.importorskip("torch")


def _inner_matmuls(x):
    for _ in range(2):
        x = x @ x
    return x


def _outer_step(x):
    return float(_inner_matmuls(x).sum().item() + _inner_matmuls(x * 2).sum().item())


def test_summarizes_a_real_cpu_trace_plain_and_gzipped(tmp_path):
    x = torch.randn(32, 32)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                with_stack=True) as prof:
        for i in range(3):
            with torch.profiler.record_function(f"ProfilerStep#{i}"):
                _outer_step(x)
    plain = tmp_path / "t.trace.json"
    prof.export_chrome_trace(str(plain))
    zipped = tmp_path / "t.trace.json.gz"
    zipped.write_bytes(gzip.compress(plain.read_bytes()))

    s = step_profile.summarize(zipped, match=["test_step_profile.py"])
    assert s == step_profile.summarize(plain, match=["test_step_profile.py"])
    assert s["steps"] == 3 and s["step_source"].startswith("ProfilerStep")
    assert s["gpu_busy_ms"] == 0 and s["gaps"] == [] and s["kernels"] == []
    rows = {r["name"].split(": ")[-1]: r for r in s["python"]["test_step_profile.py"]}
    # torch names them FILE(LINE): NAME, FILE relative to its sys.path entry
    assert all("test_step_profile.py(" in r["name"] for r in rows.values()), rows
    inner, outer = rows["_inner_matmuls"], rows["_outer_step"]
    assert (inner["calls"], outer["calls"]) == (6, 3)
    assert 0 < inner["total_ms"] < outer["total_ms"] <= s["window_ms"]
    assert s["wall_per_step_ms"] == pytest.approx(s["window_ms"] / 3)

    paths = step_profile.write(s, tmp_path / "out", zipped.name)
    md = paths[0].read_text()
    assert "_inner_matmuls" in md and "| function | calls |" in md
    assert json.loads(paths[1].read_text())["steps"] == 3
    assert step_profile.main([str(plain), "--out-dir", str(tmp_path / "cli"),
                              "--match", "test_step_profile"]) == 0
    assert "_outer_step" in (tmp_path / "cli" / "profile.md").read_text()


def _x(cat, name, ts, dur, tid=10, pid=1):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid}


LOOP = "sglang/srt/managers/scheduler.py(10): event_loop"
FORWARD = "sglang/srt/model_executor/model_runner.py(100): forward"
CHECK = "llm42/verify.py(5): check"


def _synthetic_trace() -> dict:
    py, rt = "python_function", "cuda_runtime"
    return {"traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "host"}},
        _x(py, LOOP, 0, 1000),
        _x(py, FORWARD, 100, 200), _x(py, FORWARD, 150, 50),  # nested: one step, not two
        _x(rt, "cudaLaunchKernel", 110, 5), _x(rt, "cudaLaunchKernel", 160, 5),
        _x(py, CHECK, 320, 160),
        _x("cpu_op", "aten::item", 330, 140),
        _x(rt, "cudaMemcpyAsync", 331, 4),
        _x(rt, "cudaStreamSynchronize", 340, 120),
        _x(py, FORWARD, 500, 200), _x(rt, "cudaLaunchKernel", 510, 5),
        _x(rt, "cudaStreamSynchronize", 800, 50),
        _x(rt, "cudaStreamWaitEvent", 860, 1),  # does not block the host
        _x(rt, "cudaMemcpy", 870, 10),
        _x(py, "threading.py(300): wait", 0, 1000, tid=11),  # another thread, idle
        _x(rt, "cudaDeviceSynchronize", 400, 10, tid=12),  # a thread without python
        # GPU: two streams overlapping, then a copy right after a kernel, then a late kernel
        _x("kernel", "k_a", 100, 100, pid=0, tid=7), _x("kernel", "k_b", 150, 110, pid=0, tid=8),
        _x("kernel", "k_a", 470, 130, pid=0, tid=7), _x("gpu_memcpy", "Memcpy DtoH", 600, 10,
                                                        pid=0, tid=7),
        _x("kernel", "k_c", 900, 50, pid=0, tid=7),
        _x("gpu_user_annotation", "ignored", 0, 1000, pid=0, tid=7),
    ]}


def test_gpu_busy_gaps_syncs_and_steps_of_a_synthetic_trace():
    s = step_profile.summarize(_synthetic_trace())
    assert s["window_ms"] == pytest.approx(1.0)
    assert s["gpu_busy_ms"] == pytest.approx(0.35)  # [100,260] + [470,610] + [900,950] us
    assert s["gpu_busy_fraction"] == pytest.approx(0.35)
    assert s["gpu_span_ms"] == pytest.approx(0.85)
    assert s["steps"] == 2 and s["step_source"] == "model_runner.py forward calls"
    assert s["wall_per_step_ms"] == pytest.approx(0.5)
    assert s["gpu_busy_per_step_ms"] == pytest.approx(0.175)
    assert s["step_period_median_ms"] == pytest.approx(0.4)
    assert s["host_thread"] == [1, 10]

    first, second = s["gaps"]
    assert (first["start_ms"], first["length_ms"]) == (pytest.approx(0.61), pytest.approx(0.29))
    assert (second["start_ms"], second["length_ms"]) == (pytest.approx(0.26),
                                                         pytest.approx(0.21))
    # [260, 470] on the launch thread: the sync 120 us, forward's tail 40, the loop's own 20,
    # aten::item's own 16 (140 less its two calls), check's own 10; the copy (4) is sixth
    host = {h["name"]: h["ms"] for h in second["host"]}
    assert host == {"cudaStreamSynchronize": pytest.approx(0.12), FORWARD: pytest.approx(0.04),
                    LOOP: pytest.approx(0.02), "aten::item": pytest.approx(0.016),
                    CHECK: pytest.approx(0.01)}
    assert [h["name"] for h in second["host"]][0] == "cudaStreamSynchronize"
    assert second["inside"] == LOOP and second["host_untraced_ms"] == pytest.approx(0)
    assert {h["name"]: h["ms"] for h in first["host"]} == {  # [610, 900]
        LOOP: pytest.approx(0.139), FORWARD: pytest.approx(0.09),
        "cudaStreamSynchronize": pytest.approx(0.05), "cudaMemcpy": pytest.approx(0.01),
        "cudaStreamWaitEvent": pytest.approx(0.001)}

    syncs = {(g["sync"], g["function"]): g for g in s["syncs"]}
    assert set(syncs) == {("cudaStreamSynchronize", CHECK), ("cudaStreamSynchronize", LOOP),
                          ("cudaMemcpy", LOOP), ("cudaDeviceSynchronize", CHECK)}
    under_check = syncs[("cudaStreamSynchronize", CHECK)]
    assert (under_check["count"], under_check["total_ms"]) == (1, pytest.approx(0.12))
    assert under_check["op"] == "aten::item" and under_check["chain"] == [CHECK, LOOP]
    assert s["syncs"][0]["function"] == CHECK  # the longest first
    assert s["syncs_total"] == {"count": 4, "total_ms": pytest.approx(0.19)}

    python = s["python"]
    assert [(r["name"], r["calls"]) for r in python["sglang/srt/model_executor"]] == [(FORWARD, 3)]
    assert python["sglang/srt/model_executor"][0]["total_ms"] == pytest.approx(0.4)
    assert python["llm42"] == [{"name": CHECK, "calls": 1, "total_ms": pytest.approx(0.16)}]
    assert [(k["name"], k["count"]) for k in s["kernels"]] == [("k_a", 2), ("k_b", 1),
                                                               ("k_c", 1)]
    assert s["kernels"][0]["total_ms"] == pytest.approx(0.23)
    md = step_profile.markdown(s)
    assert "| cudaStreamSynchronize | 1 | 0.120 | 0.060 | aten::item |" in md
    assert "1 steps" not in step_profile.one_line(s) and "2 steps" in step_profile.one_line(s)


def test_profiler_step_annotations_win_and_syncs_are_named():
    trace = _synthetic_trace()
    trace["traceEvents"] += [_x("user_annotation", f"ProfilerStep#{i}", 100 + 300 * i, 250)
                             for i in range(3)]
    s = step_profile.summarize(trace)
    assert s["steps"] == 3 and s["step_period_median_ms"] == pytest.approx(0.3)
    assert step_profile.is_sync("cudaEventSynchronize") and step_profile.is_sync("cuMemcpyDtoH_v2")
    assert not step_profile.is_sync("cudaMemcpyAsync") and not step_profile.is_sync(
        "cudaStreamWaitEvent")
