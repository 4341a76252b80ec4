"""The user-facing surface on a real SGLang CPU server: flags, the request field, errors, stats."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import requests
from conftest import CONTEXT, VERIFY_BATCH, WINDOW, _llm42_args, _start
from helpers import assert_same, concurrently, generate, llm42_stats, stream_chunks

from llm42.server_process import cpu_server_env

pytestmark = pytest.mark.server


def _launch(args: list[str], timeout: int = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, **cpu_server_env()}
    return subprocess.run(
        [sys.executable, "-m", "sglang.launch_server", *args],
        capture_output=True, text=True, timeout=timeout, env=env,
    )


def _model_args(model: str) -> list[str]:
    return ["--model-path", model, "--device", "cpu", "--attention-backend", "torch_native",
            "--max-total-tokens", "4096", "--enable-llm42"]


FLAGS = ("--enable-llm42", "--llm42-window-size", "--llm42-verify-batch-size",
         "--llm42-inject-mismatch-rate", "--llm42-skip-compare", "--llm42-max-verify-wait",
         "--llm42-batched-prefill", "--no-llm42-batched-prefill",
         "--llm42-solo-prefill-min-tokens", "--llm42-timeline-dir",
         "--llm42-max-passes-per-step", "--llm42-max-pass-rows-per-step",
         "--llm42-defer-verify-on-prefill",
         "--llm42-overlap-verify", "--llm42-benchmark-modes",
         "--llm42-allow-unproven-backend")
BAD_FLAGS = [
    (["--llm42-window-size", "0"], "--llm42-window-size"),  # zero window
    (["--llm42-window-size", "-3"], "--llm42-window-size"),  # negative window
    (["--llm42-verify-batch-size", "0"], "--llm42-verify-batch-size"),  # empty pass
    (["--llm42-window-size", "512", "--context-length", "256"], "context"),  # W > context
    (["--llm42-inject-mismatch-rate", "1.5"], "--llm42-inject-mismatch-rate"),  # not a prob.
    (["--llm42-window-size", "8", "--llm42-max-verify-wait", "8"],
     "--llm42-max-verify-wait"),  # a wait of a whole window
    (["--llm42-verifier", "fixed-shape", "--no-llm42-batched-prefill", "--llm42-prefix-cache"],
     "--no-llm42-batched-prefill"),  # fixed-shape prefix sharing needs prompt passes
    (["--llm42-solo-prefill-min-tokens", "-1"], "--llm42-solo-prefill-min-tokens"),
    (["--llm42-max-passes-per-step", "-2"], "--llm42-max-passes-per-step"),
    (["--llm42-verifier", "row-invariant", "--llm42-max-pass-rows-per-step", "0"],
     "--llm42-max-pass-rows-per-step must be >= 1"),  # an empty row budget
    (["--llm42-verifier", "fixed-shape", "--llm42-max-pass-rows-per-step", "4"],  # B x W rows
     "cap its passes with --llm42-max-passes-per-step"),
    (["--no-llm42-batched-prefill", "--llm42-solo-prefill-min-tokens", "512"],
     "--no-llm42-batched-prefill"),  # a threshold between paths, with one path left
]
# A backend without a determinism proof (SGLang accepts the name on CPU: nothing runs it before
# the scheduler starts), refused, then started with the override.
UNPROVEN_BACKEND = ["--attention-backend", "fa3"]
OVERRIDE = "--llm42-allow-unproven-backend"
GOOD_FLAGS = ["--llm42-window-size", "16", "--llm42-verify-batch-size", "2",
              "--llm42-max-verify-wait", "3", "--llm42-solo-prefill-min-tokens", "300"]

# What `python -m sglang.launch_server` runs before it starts anything (sglang/launch_server.py):
# load the `sglang.srt.plugins` entry points (llm42's hooks on ServerArgs.add_cli_args and
# from_cli_args among them), then prepare_server_args(argv). One interpreter runs it for every
# argv below (each import of sglang costs as much as a whole refused launch); the script first
# checks that the launcher still does just that.
_PARSE_SCRIPT = r"""
import contextlib, inspect, io, json, sys
import sglang.launch_server as launcher
from sglang.srt.plugins import load_plugins

main = inspect.getsource(launcher).split('if __name__ == "__main__":', 1)[1]
assert main.index("load_plugins()") < main.index("prepare_server_args(sys.argv[1:])"), main
load_plugins()
from llm42.sglang.backend_gate import check_server_args
results = []
for argv in json.loads(sys.argv[1]):
    out, err, res = io.StringIO(), io.StringIO(), {}
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            args = launcher.prepare_server_args(argv)
            res = {"code": "accepted", "llm42": {k: getattr(args, k, None) for k in (
                "enable_llm42", "llm42_window_size", "llm42_verify_batch_size",
                "llm42_max_verify_wait", "llm42_solo_prefill_min_tokens",
                "disable_overlap_schedule", "sampling_backend")}}
            # What the scheduler's backend gate reports in /llm42_stats (scheduler_init_hook
            # makes this call on the same args; tests/test_backend_gate.py drives that hook).
            res["gate"] = {"attention_backend": args.attention_backend,
                           "unproven_backend": check_server_args(
                               args, allow_unproven=args.llm42_allow_unproven_backend
                           ).unproven_backend}
        except SystemExit as exc:
            res = {"code": exc.code}
    results.append({**res, "stdout": out.getvalue(), "stderr": err.getvalue()})
print("\nRESULTS " + json.dumps(results))
"""


@pytest.fixture(scope="module")
def parsed_launch_args(tiny_model) -> list[dict]:
    """[--help, GOOD_FLAGS, *BAD_FLAGS, unproven backend, with the override] through the
    launcher's own parse path, in one process."""
    argvs = [["--help"], _model_args(tiny_model) + GOOD_FLAGS]
    argvs += [_model_args(tiny_model) + args for args, _ in BAD_FLAGS]
    argvs += [_model_args(tiny_model) + UNPROVEN_BACKEND,
              _model_args(tiny_model) + UNPROVEN_BACKEND + [OVERRIDE]]
    res = subprocess.run([sys.executable, "-c", _PARSE_SCRIPT, json.dumps(argvs)],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, **cpu_server_env()})
    assert res.returncode == 0 and "\nRESULTS " in res.stdout, res.stderr[-3000:]
    results = json.loads(res.stdout.rsplit("\nRESULTS ", 1)[1])
    assert len(results) == len(argvs)
    return results


def test_flags_in_launch_server_help(parsed_launch_args):
    help_run = parsed_launch_args[0]
    assert help_run["code"] == 0, help_run
    for flag in FLAGS:
        assert flag in help_run["stdout"], f"{flag} missing from launch_server --help"


def test_good_flag_values_reach_the_server_args(parsed_launch_args):
    good = parsed_launch_args[1]
    assert good["code"] == "accepted", good["stderr"][-2000:]
    assert good["llm42"] == {"enable_llm42": True, "llm42_window_size": 16,
                             "llm42_verify_batch_size": 2, "llm42_max_verify_wait": 3,
                             "llm42_solo_prefill_min_tokens": 300,
                             "disable_overlap_schedule": False, "sampling_backend": "pytorch"}


@pytest.mark.parametrize("index", range(len(BAD_FLAGS)),
                         ids=[" ".join(args) for args, _ in BAD_FLAGS])
def test_bad_flag_values_are_rejected(parsed_launch_args, index):
    _, needle = BAD_FLAGS[index]
    res = parsed_launch_args[2 + index]
    assert res["code"] not in (0, None, "accepted"), "a bad llm42 flag must stop the launch"
    assert "llm42: error" in res["stderr"] and needle in res["stderr"], res["stderr"][-2000:]


def test_unproven_attention_backend_stops_the_launch_unless_overridden(parsed_launch_args):
    """The gate sees the backend SGLang resolved; the override starts and reports it."""
    refused, overridden = parsed_launch_args[-2:]
    assert refused["code"] == 2, refused
    error = refused["stderr"][refused["stderr"].index("llm42: error:"):]
    for needle in ("attention backend fa3", "triton", "torch_native", OVERRIDE):
        assert needle in error, error
    assert overridden["code"] == "accepted", overridden["stderr"][-2000:]
    assert "llm42: warning:" in overridden["stderr"] and OVERRIDE in overridden["stderr"]
    assert overridden["gate"] == {"attention_backend": "fa3", "unproven_backend": "fa3"}
    good = parsed_launch_args[1]  # torch_native: proven, nothing to report
    assert good["gate"] == {"attention_backend": "torch_native", "unproven_backend": None}


def test_bad_flag_value_stops_the_real_launch(tiny_model):
    """End to end once: `python -m sglang.launch_server` itself exits on a bad llm42 value."""
    args, needle = BAD_FLAGS[0]
    res = _launch(_model_args(tiny_model) + args)
    assert res.returncode != 0, "launch with a bad llm42 flag must fail"
    assert "llm42: error" in res.stderr and needle in res.stderr, res.stderr[-2000:]


ENDPOINTS = ["generate", "completions", "chat"]


def _post(url: str, endpoint: str, value, **kw):
    if endpoint == "generate":
        sp = {"max_new_tokens": 4, "temperature": 0, "is_deterministic": value}
        return requests.post(url + "/generate", json={"text": "Hello", "sampling_params": sp}, **kw)
    body = {"model": "default", "max_tokens": 4, "temperature": 0, "is_deterministic": value}
    if endpoint == "completions":
        return requests.post(url + "/v1/completions", json={**body, "prompt": "Hello"}, **kw)
    return requests.post(url + "/v1/chat/completions",
                         json={**body, "messages": [{"role": "user", "content": "Hello"}]}, **kw)


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_is_deterministic_accepted_on_every_endpoint(llm42_server, endpoint):
    r = _post(llm42_server.url, endpoint, True, timeout=120)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("value", ["true", 1, None, [True], {"a": 1}])
def test_non_boolean_is_rejected_with_400(llm42_server, endpoint, value):
    r = _post(llm42_server.url, endpoint, value, timeout=60)
    assert r.status_code == 400, r.text
    assert "is_deterministic" in r.text


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_deterministic_without_enable_flag_is_400(plain_server, endpoint):
    r = _post(plain_server.url, endpoint, True, timeout=60)
    assert r.status_code == 400, r.text
    assert "--enable-llm42" in r.text
    # false is harmless on any server
    assert _post(plain_server.url, endpoint, False, timeout=60).status_code == 200


def test_normal_requests_unchanged_with_llm42_on(llm42_server, plain_server):
    """A normal request, sent alone, is bitwise identical with and without --enable-llm42: plain
    SGLang at its bf16 LM head, while llm42's default `--llm42-fp32-logits` is on. The guard of
    issue 33: fp32 logits are computed for deterministic rows and passes, never normal rows."""
    for prompt in ["The capital of France is", "def add(a, b):"]:
        on = generate(llm42_server.url, prompt, det=None, max_new_tokens=16)
        off = generate(plain_server.url, prompt, det=None, max_new_tokens=16)
        assert on[0] == off[0] and on[1] == off[1], prompt
        assert "llm42_verify_passes" not in on[2], "normal requests are never verified"


def test_stats_endpoint_and_reset(llm42_server):
    url = llm42_server.url
    assert requests.post(url + "/reset_llm42_stats", timeout=30).json()["success"]
    generate(url, "Count with me: one two three", det=True, max_new_tokens=20)
    stats = requests.get(url + "/llm42_stats", timeout=30).json()
    assert stats["enabled"] and stats["window_size"] == 8 and stats["verify_batch_size"] == 4
    assert stats["verify_passes"] >= 1 and stats["verified_tokens"] >= 1
    assert stats["padded_rows"] >= 3  # one request per pass, B = 4
    # passes and the results drained for them run inside the scheduler's next-batch step
    # ... and SGLang building the batch, which is timed apart from llm42's own work
    assert stats["schedule_time_s"] >= (stats["verify_time_s"] + stats["drain_time_s"]
                                        + stats["batch_build_time_s"])
    assert stats["verify_time_s"] > 0 and stats["batch_build_time_s"] > 0, stats
    assert (stats["drain_time_s"] > 0) == (stats["early_results"] > 0), stats
    requests.post(url + "/reset_llm42_stats", timeout=30)
    assert requests.get(url + "/llm42_stats", timeout=30).json()["verify_passes"] == 0


def test_per_request_meta_info(llm42_server):
    before = llm42_stats(llm42_server.url)
    _, _, meta = generate(llm42_server.url, "Tell me a story about", det=True,
                          max_new_tokens=20)
    after = llm42_stats(llm42_server.url)
    # 19 candidates after the prefill's token, W = 8: windows [1,9), [9,17), [17,20)
    assert meta["llm42_verify_passes"] >= 3
    # alone on the server: its counters are the server's whole change
    for key in ("rollbacks", "tokens_rolled_back"):
        assert meta[f"llm42_{key}"] == after[key] - before[key], (key, meta, after, before)
    # each rollback drops at least the mismatched token
    assert meta["llm42_tokens_rolled_back"] >= meta["llm42_rollbacks"]
    assert meta["completion_tokens"] == 20


def _stream_chunks(url: str, text: str, det: bool | None, max_new_tokens: int) -> list[dict]:
    sp = {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True}
    if det is not None:
        sp["is_deterministic"] = det
    return stream_chunks(url, "/generate", {"text": text, "sampling_params": sp})


def test_llm42_counters_ride_only_with_a_deterministic_finish(llm42_server):
    """The counters go out once, with the deterministic request's finishing chunk. Sent with
    every step (SGLang's customized_info), they made each normal request beside a deterministic
    one carry a list that grew by a None per key per token, scanned whole for every chunk in the
    process that serves HTTP: quadratic in its output (benchmarks/results/cpu-output-path)."""
    url = llm42_server.url
    chunks = concurrently(
        [lambda: _stream_chunks(url, "Tell me a story about", True, 24)]
        + [lambda k=k: _stream_chunks(url, f"List {k} colours:", None, 24) for k in range(4)])
    det, normals = chunks[0], chunks[1:]
    assert len(det) > 1 and det[-1]["meta_info"]["llm42_verify_passes"] >= 1, det[-1]
    keys = ("llm42_verify_passes", "llm42_rollbacks", "llm42_tokens_rolled_back",
            "llm42_restarts")
    assert not [c for c in det[:-1] if set(keys) & set(c["meta_info"])], "before its finish"
    for normal in normals:
        assert len(normal) > 1
        assert not [c for c in normal if set(keys) & set(c["meta_info"])], "normal request"


def _mode(server, body=None, **kwargs) -> requests.Response:
    return requests.post(server.url + "/llm42_benchmark_mode", json=body, timeout=30, **kwargs)


def test_benchmark_modes_switch_on_a_running_server(llm42_server):
    """One server start runs the llm42, injected and comparison-skipped benchmark rows: the
    switch takes effect on the next request, and determinism holds with every window forced to
    mismatch."""
    url, prompt = llm42_server.url, "Count with me: one two three four"
    base = generate(url, prompt, det=True, max_new_tokens=24)
    try:
        assert _mode(llm42_server, {"inject_mismatch_rate": 1.0}).json() == {
            "success": True, "skip_compare": False, "inject_mismatch_rate": 1.0,
            "window_size": WINDOW, "verify_batch_size": VERIFY_BATCH,
            "max_verify_wait": WINDOW // 4, "overlap_verify": True,
            "max_finish_wait": WINDOW // 4, "inline_pad_ratio": 2.0, "inline_prefill": True,
            "batched_prefill": False, "defer_verify_on_prefill": False,
            "fold_passes": False}
        requests.post(url + "/reset_llm42_stats", timeout=30)
        injected = generate(url, prompt, det=True, max_new_tokens=24)
        stats = requests.get(url + "/llm42_stats", timeout=30).json()
        assert stats["inject_mismatch_rate"] == 1.0 and stats["benchmark_modes"] is True
        assert stats["injected_mismatches"] >= 3 and stats["rollbacks"] >= 3, stats
        assert injected[:2] == base[:2], "tokens and logprobs as without injection"

        assert _mode(llm42_server, {"inject_mismatch_rate": 0, "skip_compare": True}).json() == {
            "success": True, "skip_compare": True, "inject_mismatch_rate": 0.0,
            "window_size": WINDOW, "verify_batch_size": VERIFY_BATCH,
            "max_verify_wait": WINDOW // 4, "overlap_verify": True,
            "max_finish_wait": WINDOW // 4, "inline_pad_ratio": 2.0, "inline_prefill": True,
            "batched_prefill": False, "defer_verify_on_prefill": False,
            "fold_passes": False}
        requests.post(url + "/reset_llm42_stats", timeout=30)
        generate(url, prompt, det=True, max_new_tokens=24)
        stats = requests.get(url + "/llm42_stats", timeout=30).json()
        assert stats["skip_compare"] and stats["verify_passes"] >= 3, stats
        assert stats["rollbacks"] == stats["injected_mismatches"] == 0, stats

        # pass scheduling: passes queued behind the decode step in flight (the default) or
        # after its result is processed, every full window verified at once; when a row is
        # verified does not change what it returns
        overlapped = {}
        for overlap in (True, False):
            assert _mode(llm42_server, {"skip_compare": False, "max_verify_wait": 0,
                                        "overlap_verify": overlap}).json()["overlap_verify"] is (
                overlap)
            requests.post(url + "/reset_llm42_stats", timeout=30)
            scheduled = generate(url, prompt, det=True, max_new_tokens=24)
            stats = requests.get(url + "/llm42_stats", timeout=30).json()
            assert (stats["max_verify_wait"], stats["overlap_verify"]) == (0, overlap), stats
            assert scheduled[:2] == base[:2], "tokens and logprobs as with the flags' defaults"
            overlapped[overlap] = stats["overlapped_passes"]
        assert overlapped[True] >= 1 and overlapped[False] == 0, overlapped
        # passes held back from steps about to prefill: when, not what
        assert _mode(llm42_server, {"defer_verify_on_prefill": True}).json()[
            "defer_verify_on_prefill"] is True
        deferred = generate(url, prompt, det=True, max_new_tokens=24)
        stats = requests.get(url + "/llm42_stats", timeout=30).json()
        assert stats["defer_verify_on_prefill"] is True and deferred[:2] == base[:2], stats
    finally:
        _mode(llm42_server, {"inject_mismatch_rate": 0.0, "skip_compare": False,
                             "max_verify_wait": None, "overlap_verify": True,
                             "defer_verify_on_prefill": False})
    stats = requests.get(url + "/llm42_stats", timeout=30).json()
    assert not stats["skip_compare"] and stats["inject_mismatch_rate"] == 0.0


def test_a_finish_wait_changes_when_a_request_completes_not_what_it_returns(llm42_server):
    """--llm42-max-finish-wait (switched at runtime, with a longer max verify wait so that it
    can take effect): finishing windows wait for a shared pass, their finishes withheld, and
    every output is bitwise the one verified at once (0); the default is W // 4 (capped at the
    max verify wait); the server is healthy after."""
    url = llm42_server.url
    prompts = ["Count with me: one two three four", "The quick brown fox jumps over",
               "def add(a, b):"]
    try:
        assert _mode(llm42_server, {"max_finish_wait": 0}).json()["max_finish_wait"] == 0
        base = generate(url, prompts, det=True, max_new_tokens=13, ignore_eos=True)
        r = _mode(llm42_server, {"max_verify_wait": WINDOW - 1, "max_finish_wait": WINDOW - 1})
        assert r.status_code == 200 and r.json()["max_finish_wait"] == WINDOW - 1, r.text
        waited = concurrently([lambda p=p: generate(url, p, det=True, max_new_tokens=13,
                                                    ignore_eos=True) for p in prompts])
        batched = generate(url, prompts, det=True, max_new_tokens=13, ignore_eos=True)
        for p, ref, got, bat in zip(prompts, base, waited, batched):
            assert got[:2] == ref[:2] and bat[:2] == ref[:2], p
    finally:
        _mode(llm42_server, {"max_verify_wait": None, "max_finish_wait": None})
    stats = requests.get(url + "/llm42_stats", timeout=30).json()
    assert stats["max_finish_wait"] == stats["max_verify_wait"] == WINDOW // 4


@pytest.mark.parametrize("body, field", [
    ({"skip_compare": "yes"}, "skip_compare"),
    ({"inject_mismatch_rate": 1.5}, "inject_mismatch_rate"),
    ({"inject_mismatch_rate": True}, "inject_mismatch_rate"),
    ({"window_size": 0}, "window_size must be an integer >= 1"),
    ({"window_size": 8.0}, "window_size must be an integer >= 1"),  # a float, even a whole one
    ({"window_size": True}, "window_size must be an integer >= 1"),
    ({"window_size": 2048}, "window_size 2048 refused"),  # over the context length (1024)
    ({"verify_batch_size": 0}, "verify_batch_size must be an integer >= 1"),
    ({"max_verify_wait": WINDOW}, "--llm42-max-verify-wait must be in [0, window size)"),
    ({"overlap_verify": "on"}, "overlap_verify must be true or false"),
    ({"max_passes_per_step": 1}, "'max_passes_per_step'"),  # not switchable
    ([0.5], "JSON object"),
])
def test_benchmark_mode_bad_body_is_400_naming_the_field(llm42_server, body, field):
    r = _mode(llm42_server, body)
    assert r.status_code == 400 and field in r.json()["error"]["message"], r.text
    malformed = _mode(llm42_server, data="{", headers={"Content-Type": "application/json"})
    assert malformed.status_code == 400, malformed.text
    stats = requests.get(llm42_server.url + "/llm42_stats", timeout=30).json()
    assert not stats["skip_compare"] and stats["inject_mismatch_rate"] == 0.0
    assert stats["window_size"] == WINDOW and stats["max_verify_wait"] == WINDOW // 4


def test_benchmark_modes_are_off_without_the_flag(inject_server, plain_server):
    """403 on the llm42 endpoint, and SGLang's own /set_internal_state cannot switch them
    either: skip_compare would turn determinism off."""
    for server in (inject_server, plain_server):
        r = _mode(server, {"skip_compare": True})
        assert r.status_code == 403 and "--llm42-benchmark-modes" in r.json()["error"]["message"]
    r = requests.post(inject_server.url + "/set_internal_state", timeout=30, json={
        "server_args": {"llm42_benchmark_mode": {"skip_compare": True}}})
    # SGLang 0.5.17 types those values as numbers (400); the scheduler refuses them regardless
    assert r.status_code == 400 or r.json()["updated"] is False, r.text
    stats = requests.get(inject_server.url + "/llm42_stats", timeout=30).json()
    assert stats["skip_compare"] is False and stats["inject_mismatch_rate"] == 0.5


# -- window_size switched at runtime --------------------------------------------------------------
SWITCHED_WINDOW = 16
SWITCH_PROMPTS = ["Count with me: one two three four", "The quick brown fox jumps over"]
SWITCH_TOKENS = 40  # 39 candidates after the solo prefill's token: 3 windows of 16, 5 of 8


@pytest.fixture(scope="module")
def window16_server(tiny_model, tmp_path_factory):
    """llm42_server's model and flags, started with the window the test switches llm42_server
    to; its explicit max verify wait (W // 4, the default's value: outputs unchanged) is what a
    smaller window must stay above."""
    args = _llm42_args(window=SWITCHED_WINDOW) + [
        "--llm42-max-verify-wait", str(SWITCHED_WINDOW // 4), "--llm42-benchmark-modes"]
    server = _start(tiny_model, args, "window16", tmp_path_factory)
    yield server
    server.stop()


def _windows_match(meta: dict, window: int) -> bool:
    """Each pass commits at most W tokens, and all but the rolled-back ones and the last commit
    exactly W: ceil(n / W) <= passes <= ceil(n / W) + rollbacks for n candidates."""
    num_windows = -(-(meta["completion_tokens"] - 1) // window)
    return num_windows <= meta["llm42_verify_passes"] <= num_windows + meta["llm42_rollbacks"]


def test_window_switch_serves_as_a_server_started_with_that_window(llm42_server,
                                                                   window16_server):
    """One server start for a window sweep: after POST {"window_size": 16}, a deterministic
    request gives bitwise the tokens and logprobs of a server started with
    --llm42-window-size 16, with passes of 16 tokens, also with every window forced to
    mismatch; switched back to 8, bitwise its own output before the switch."""
    url = llm42_server.url

    def run(server_url):  # one batched /generate: outputs are batch-invariant
        return generate(server_url, SWITCH_PROMPTS, det=True, max_new_tokens=SWITCH_TOKENS)

    before, reference = concurrently([lambda: run(url), lambda: run(window16_server.url)])
    try:
        assert _mode(llm42_server, {"window_size": SWITCHED_WINDOW}).json() == {
            "success": True, "skip_compare": False, "inject_mismatch_rate": 0.0,
            "window_size": SWITCHED_WINDOW, "verify_batch_size": VERIFY_BATCH,
            "max_verify_wait": SWITCHED_WINDOW // 4, "overlap_verify": True,
            "max_finish_wait": SWITCHED_WINDOW // 4, "inline_pad_ratio": 2.0,
            "inline_prefill": True, "batched_prefill": False, "defer_verify_on_prefill": False,
            "fold_passes": False}
        switched = run(url)
        stats = requests.get(url + "/llm42_stats", timeout=30).json()
        assert (stats["window_size"], stats["max_verify_wait"]) == (16, 4), stats
        for prompt, ref, got in zip(SWITCH_PROMPTS, reference, switched):
            assert_same(ref, got, f"switched to W=16 vs started with W=16: {prompt!r}")
            assert _windows_match(got[2], SWITCHED_WINDOW), got[2]
        assert _mode(llm42_server, {"inject_mismatch_rate": 1.0}).status_code == 200
        requests.post(url + "/reset_llm42_stats", timeout=30)
        injected = run(url)
        stats = requests.get(url + "/llm42_stats", timeout=30).json()
        assert stats["injected_mismatches"] >= 2 * 3, stats  # every window of both requests
        for prompt, ref, got in zip(SWITCH_PROMPTS, reference, injected):
            assert_same(ref, got, f"W=16, every window forced to mismatch: {prompt!r}")
    finally:
        reply = _mode(llm42_server, {"window_size": WINDOW, "inject_mismatch_rate": 0.0})
        assert reply.status_code == 200, reply.text
    for prompt, ref, got in zip(SWITCH_PROMPTS, before, run(url)):
        assert_same(ref, got, f"switched back to W=8: {prompt!r}")
        assert _windows_match(got[2], WINDOW), got[2]


def test_window_switch_below_an_explicit_max_verify_wait_is_400(window16_server):
    """--llm42-max-verify-wait 4 must stay below the window: W = 4 is refused naming both."""
    r = _mode(window16_server, {"window_size": 4})
    message = r.json()["error"]["message"]
    assert r.status_code == 400 and message.startswith("window_size 4 refused"), r.text
    assert "--llm42-max-verify-wait" in message
    assert _mode(window16_server, {"window_size": 5}).json()["max_verify_wait"] == 4  # explicit
    assert _mode(window16_server, {"window_size": SWITCHED_WINDOW}).status_code == 200


def _switch_while_streaming(server, rid: str, det: bool, modes: list[dict]):
    """Stream a long request; once its first chunk arrived (it is in the scheduler) POST each
    of `modes`, then abort it. The replies, and the request's last chunk."""
    sp = {"max_new_tokens": CONTEXT - 64, "temperature": 0, "is_deterministic": det,
          "ignore_eos": True}
    body = {"text": "Hello", "rid": rid, "stream": True, "sampling_params": sp}
    replies, last = [], None
    with requests.post(server.url + "/generate", json=body, stream=True, timeout=300) as r:
        assert r.status_code == 200, r.text
        for line in r.iter_lines():
            if not line.startswith(b"data: {"):
                continue
            last = json.loads(line[6:])
            if not replies:
                replies = [_mode(server, mode) for mode in modes]
                requests.post(server.url + "/abort_request", json={"rid": rid}, timeout=60)
    return replies, last


def test_window_switch_with_a_deterministic_request_in_flight_is_409(llm42_server):
    """Its windows would change under it and a pass would mix row widths: refused, saying
    why, and the server keeps its window. A normal request in flight does not matter."""
    [refused], last = _switch_while_streaming(llm42_server, "llm42-switch-det", True,
                                              [{"window_size": SWITCHED_WINDOW}])
    assert refused.status_code == 409, refused.text
    message = refused.json()["error"]["message"]
    assert "needs an idle server (no deterministic requests in flight)" in message, message
    assert "from 8 to 16" in message, message
    # it was still running after the refusal: aborted, not finished
    assert last["meta_info"]["finish_reason"]["type"] == "abort", last["meta_info"]
    stats = requests.get(llm42_server.url + "/llm42_stats", timeout=30).json()
    assert stats["window_size"] == WINDOW and stats["benchmark_mode_refusal"]["busy"], stats

    replies, last = _switch_while_streaming(llm42_server, "llm42-switch-normal", False, [
        {"window_size": SWITCHED_WINDOW}, {"window_size": WINDOW}])
    assert [r.status_code for r in replies] == [200, 200], [r.text for r in replies]
    assert [r.json()["window_size"] for r in replies] == [SWITCHED_WINDOW, WINDOW]
    assert last["meta_info"]["finish_reason"]["type"] == "abort", last["meta_info"]
