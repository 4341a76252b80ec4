"""Which servers the driver (`benchmarks/driver.py`) starts for its configs, and which
variants it switches in at runtime instead.
"""

from __future__ import annotations

import argparse

import pytest


def test_driver_configs_map_to_server_flags():
    from benchmarks import driver

    args = argparse.Namespace(
        configs="nondet,nondet-no-overlap,llm42,llm42-no-overlap,llm42-skip-compare,"
                "llm42-batched-prefill,llm42-solo-prefill",
        window_sizes="16", verify_batch_size=4, det_ratios="0.1,1.0", variant_ratios="1.0",
        inject_mismatch_rate=0.05, llm42_args=None, switch_variants=False)
    got = {c.label: (c.config, c.flags, c.ratios) for c in driver.server_configs(args)}
    llm42 = ["--enable-llm42", "--llm42-window-size", "16", "--llm42-verify-batch-size", "4"]
    assert got == {
        "nondet": ("nondet", [], [0.0]),
        "nondet-no-overlap": ("nondet-no-overlap", ["--disable-overlap-schedule"], [0.0]),
        "llm42-w16": ("llm42", llm42, [0.1, 1.0]),
        "llm42-w16-no-overlap": ("llm42", llm42 + ["--disable-overlap-schedule"], [0.1, 1.0]),
        "llm42-w16-skip": ("llm42", llm42 + ["--llm42-skip-compare"], [1.0]),
        "llm42-w16-batched-prefill": ("llm42", llm42 + ["--llm42-batched-prefill"], [0.1, 1.0]),
        "llm42-w16-solo-prefill": ("llm42", llm42 + ["--no-llm42-batched-prefill"], [0.1, 1.0]),
    }
    with pytest.raises(SystemExit, match="unknown config"):
        driver.server_configs(argparse.Namespace(**{**vars(args), "configs": "llm43"}))
    # --llm42-args reach every llm42 server (not the baselines) and tell them apart in tables
    extra = argparse.Namespace(**{**vars(args), "configs": "nondet,llm42-batched-prefill",
                                  "llm42_args": ["--llm42-max-verify-wait 64"]})
    got = {c.label: (c.flags, c.meta.get("llm42_args")) for c in driver.server_configs(extra)}
    assert got == {
        "nondet": ([], None),
        "llm42-w16-max-verify-wait64-batched-prefill": (
            llm42 + ["--llm42-max-verify-wait", "64", "--llm42-batched-prefill"],
            "--llm42-max-verify-wait 64"),
    }
    # repeated --llm42-args: one server per value ('' = defaults) for each llm42 config
    variants = argparse.Namespace(**{**vars(args), "configs": "llm42",
                                     "llm42_args": ["", "--llm42-verify-batch-size 4"]})
    got = {c.label: c.flags for c in driver.server_configs(variants)}
    assert got == {"llm42-w16": llm42,
                   "llm42-w16-verify-batch-size4": llm42 + ["--llm42-verify-batch-size", "4"]}


def test_switch_variants_put_a_window_sweep_on_one_server():
    """--switch-variants: every window of one --llm42-args value runs on one server, started
    with the largest window; the other windows, and the skip / inject configs of every window,
    are switched in by their mode (with window_size, since the server hosts several)."""
    from benchmarks import driver

    args = argparse.Namespace(
        configs="nondet,llm42,llm42-inject", window_sizes="16,32,64,128", verify_batch_size=8,
        det_ratios="1.0", variant_ratios="1.0", inject_mismatch_rate=0.5,
        llm42_args=["", "--llm42-max-passes-per-step 1"], switch_variants=True)
    configs = driver.server_configs(args)
    assert [c.label for c in configs] == ["nondet", "llm42-w128",
                                          "llm42-w128-max-passes-per-step1"]
    for host, suffix in zip(configs[1:], ["", "-max-passes-per-step1"]):
        assert host.flags[1:3] == ["--llm42-window-size", "128"]
        assert host.flags[-1] == "--llm42-benchmark-modes"
        assert [v.label for v in host.switched] == [
            f"llm42-w{w}{suffix}" for w in (16, 32, 64)] + [
            f"llm42-w{w}{suffix}-inject0.5" for w in (16, 32, 64, 128)]
        modes = [(v.meta["window_size"], v.meta["benchmark_mode"]) for v in host.switched]
        assert [modes[0], modes[4], modes[6]] == [
            (16, {"skip_compare": False, "inject_mismatch_rate": 0.0, "window_size": 16}),
            (32, {"skip_compare": False, "inject_mismatch_rate": 0.5, "window_size": 32}),
            (128, {"skip_compare": False, "inject_mismatch_rate": 0.5, "window_size": 128})]
        assert all(v.flags is host.flags for v in host.switched)
        assert driver.plain_mode(host) == {"skip_compare": False, "inject_mismatch_rate": 0.0,
                                           "window_size": 128}
    # one window: its modes stay without window_size (what a server before the window switch
    # accepts); without --switch-variants one start per window, as before
    one = driver.server_configs(argparse.Namespace(**{**vars(args), "window_sizes": "64",
                                                      "llm42_args": None}))
    assert [v.meta["benchmark_mode"] for v in one[1].switched] == [
        {"skip_compare": False, "inject_mismatch_rate": 0.5}]
    assert driver.plain_mode(one[1]) == driver._PLAIN_MODE
    apart = driver.server_configs(argparse.Namespace(**{**vars(args), "switch_variants": False,
                                                        "llm42_args": None}))
    assert len(apart) == 1 + 4 + 4 and not any(c.switched for c in apart)


def test_pass_scheduling_variants_share_one_server():
    """--llm42-args variants that differ only in the max verify wait and overlap-verify run on
    one server (started with the first), each switching both; another flag keeps its own."""
    from benchmarks import driver

    args = argparse.Namespace(
        configs="nondet,llm42", window_sizes="64", verify_batch_size=8, det_ratios="0.1,1.0",
        variant_ratios=None, inject_mismatch_rate=0.5, switch_variants=True,
        llm42_args=["", "--llm42-max-verify-wait 48 --llm42-overlap-verify",
                    "--no-llm42-overlap-verify", "--llm42-max-passes-per-step=1"])
    configs = driver.server_configs(args)
    assert [c.label for c in configs] == ["nondet", "llm42-w64",
                                          "llm42-w64-max-passes-per-step=1"]
    host = configs[1]
    assert host.flags[-1] == "--llm42-benchmark-modes" and not configs[2].switched
    assert [(v.label, v.meta["benchmark_mode"]) for v in host.switched] == [
        ("llm42-w64-max-verify-wait48-overlap-verify",
         {"skip_compare": False, "inject_mismatch_rate": 0.0, "max_verify_wait": 48,
          "overlap_verify": True, "max_finish_wait": None, "inline_pad_ratio": 2.0,
          "inline_prefill": True, "batched_prefill": None, "defer_verify_on_prefill": False,
          "fold_passes": False}),
        ("llm42-w64-no-overlap-verify",
         {"skip_compare": False, "inject_mismatch_rate": 0.0, "max_verify_wait": None,
          "overlap_verify": False, "max_finish_wait": None, "inline_pad_ratio": 2.0,
          "inline_prefill": True, "batched_prefill": None, "defer_verify_on_prefill": False,
          "fold_passes": False})]
    # back to its own: the flags' defaults (overlap-verify on since defaults version 4)
    assert driver.plain_mode(host) == {"skip_compare": False, "inject_mismatch_rate": 0.0,
                                       "max_verify_wait": None, "overlap_verify": True,
                                       "max_finish_wait": None, "inline_pad_ratio": 2.0,
                                       "inline_prefill": True, "batched_prefill": None,
                                       "defer_verify_on_prefill": False, "fold_passes": False}
    assert [c.ratios for c in [host, *host.switched]] == [[0.1, 1.0]] * 3
    # a survey: the variants after the first at their own ratios
    survey = driver.server_configs(argparse.Namespace(**vars(args), args_variant_ratios="0.1"))
    assert [c.ratios for c in [survey[1], *survey[1].switched, survey[2]]] == [
        [0.1, 1.0], [0.1], [0.1], [0.1]]
    assert driver.scheduling_mode("--llm42-max-verify-wait=12 --x 1") == (
        "--x 1", {"max_verify_wait": 12, "overlap_verify": True, "max_finish_wait": None,
                  "inline_pad_ratio": 2.0, "inline_prefill": True, "batched_prefill": None,
                  "defer_verify_on_prefill": False, "fold_passes": False})
    assert driver.scheduling_mode("--llm42-max-finish-wait 8")[1]["max_finish_wait"] == 8
    assert driver.scheduling_mode("--llm42-inline-pad-ratio 0.5")[1]["inline_pad_ratio"] == 0.5
    assert driver.scheduling_mode("--no-llm42-fold-passes")[1]["fold_passes"] is False
    assert driver.scheduling_mode("--llm42-fold-passes")[1]["fold_passes"] is True


def test_pass_tokens_sweep_keeps_the_pass_size_on_one_server():
    """--pass-tokens 512: W 16 B 32, W 32 B 16, W 64 B 8 on one server (started with the largest
    window), B switched with W in each mode; a window that does not divide it is an error."""
    from benchmarks import driver

    args = argparse.Namespace(
        configs="nondet,llm42", window_sizes="16,32,64", verify_batch_size=4, pass_tokens=512,
        det_ratios="0.1,1.0", variant_ratios=None, inject_mismatch_rate=0.5, llm42_args=None,
        switch_variants=True)
    host = driver.server_configs(args)[1]
    assert host.label == "llm42-w64-b8"
    assert host.flags[:5] == ["--enable-llm42", "--llm42-window-size", "64",
                              "--llm42-verify-batch-size", "8"]
    assert [(v.label, v.meta["verify_batch_size"], v.meta["benchmark_mode"]) for v in
            host.switched] == [
        ("llm42-w16-b32", 32, {"skip_compare": False, "inject_mismatch_rate": 0.0,
                               "window_size": 16, "verify_batch_size": 32}),
        ("llm42-w32-b16", 16, {"skip_compare": False, "inject_mismatch_rate": 0.0,
                               "window_size": 32, "verify_batch_size": 16})]
    assert driver.plain_mode(host)["verify_batch_size"] == 8
    with pytest.raises(SystemExit, match="not a multiple of window 48"):
        driver.server_configs(argparse.Namespace(**{**vars(args), "window_sizes": "16,48"}))


def test_the_benchmark_client_takes_every_config_the_driver_starts():
    """The driver passes each server's config to `bench_serving --config-label`: a label the
    client refuses loses that row on the GPU (it did: `nondet-defaults`, 2026-12-06)."""
    from benchmarks import bench_serving, driver

    args = argparse.Namespace(
        configs=",".join(driver.CONFIGS), window_sizes="16,64", verify_batch_size=4,
        det_ratios="0.1", variant_ratios="1.0", inject_mismatch_rate=0.05, llm42_args=None,
        switch_variants=False)
    labels = {c.config for c in driver.server_configs(args)}
    assert "nondet-defaults" in labels
    parser = bench_serving.build_parser()
    for label in sorted(labels):
        parsed = parser.parse_args(["--config-label", label])
        assert parsed.config_label == label


def test_speculative_configs_add_spec_args_and_keep_a_start_of_their_own():
    """nondet-spec / llm42-spec: `--spec-args` on plain SGLang and on llm42 (after llm42's and
    the variant's flags), labelled by the algorithm and recorded in the rows; an llm42-spec
    server is never a switched variant of a plain llm42 one (speculation is a start flag); spec
    args that name no algorithm are refused."""
    from benchmarks import driver

    args = argparse.Namespace(
        configs="nondet,nondet-spec,llm42,llm42-spec", window_sizes="16", verify_batch_size=32,
        det_ratios="0.1,1.0", variant_ratios=None, inject_mismatch_rate=0.5,
        llm42_args=["--llm42-max-verify-wait 8"], switch_variants=True,
        spec_args="--speculative-algorithm ngram --speculative-num-draft-tokens 4")
    spec = ["--speculative-algorithm", "ngram", "--speculative-num-draft-tokens", "4"]
    llm42 = ["--enable-llm42", "--llm42-window-size", "16", "--llm42-verify-batch-size", "32",
             "--llm42-max-verify-wait", "8"]
    got = [(c.label, c.config, c.flags, c.ratios, c.meta.get("speculative_algorithm"),
            c.switched) for c in driver.server_configs(args)]
    assert got == [
        ("nondet", "nondet", [], [0.0], None, []),
        ("nondet-spec-ngram", "nondet-spec", spec, [0.0], "NGRAM", []),
        ("llm42-w16-max-verify-wait8", "llm42", llm42, [0.1, 1.0], None, []),
        ("llm42-w16-max-verify-wait8-spec-ngram", "llm42", llm42 + spec, [0.1, 1.0], "NGRAM",
         [])]
    # the driver's default: NGRAM with 4 draft tokens
    default = driver.build_parser().parse_args(["--out-dir", "o", "--configs", "nondet-spec"])
    assert [c.flags for c in driver.server_configs(default)] == [
        ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "4"]]
    with pytest.raises(SystemExit, match="names no --speculative-algorithm"):
        driver.server_configs(argparse.Namespace(**{**vars(args), "spec_args": "--x 1"}))


def test_llm42_args_may_set_the_server_environment():
    """NAME=value before the flags of an --llm42-args value: that server's environment (an A/B of
    an internal choice, e.g. the fp32 logits layout), a start of its own, named in the label."""
    from benchmarks import driver

    args = argparse.Namespace(
        configs="llm42", window_sizes="64", verify_batch_size=8, det_ratios="0.1",
        variant_ratios=None, inject_mismatch_rate=0.5, switch_variants=True,
        llm42_args=["", "LLM42_FP32_LOGITS_LAYOUT=recompute", "LLM42_FP32_LOGITS_LAYOUT=recompute "
                    "--no-llm42-overlap-verify"])
    configs = driver.server_configs(args)
    assert [c.label for c in configs] == ["llm42-w64", "llm42-w64-fp32-logits-layout=recompute"]
    env_host = configs[1]
    assert env_host.meta["server_env"] == {"LLM42_FP32_LOGITS_LAYOUT": "recompute"}
    assert not any(f.startswith("LLM42_") for f in env_host.flags)
    assert [v.meta["benchmark_mode"]["overlap_verify"] for v in env_host.switched] == [False]
    assert driver.server_env("A=1 B_2='x y' --flag Z=3") == ({"A": "1", "B_2": "x y"},
                                                           ["--flag", "Z=3"])
