"""Llm42Stats arithmetic and Llm42Config flag validation."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import pytest
from core_factories import accept, rollback

from llm42.core import Llm42Config, Llm42Stats

SNAPSHOT_KEYS = {
    "verify_passes",
    "graphed_passes",
    "verify_rows",
    "prompt_rows",
    "cached_prompt_tokens",
    "padded_rows",
    "verified_tokens",
    "rollbacks",
    "tokens_rolled_back",
    "injected_mismatches",
    "inconsistent_tokens",
    "retraction_restarts",
    "recompute_pct",
    "verify_time_s",
    "det_requests_finished",
    "early_results",
    "overlapped_passes",
    "drain_time_s",
    "row_capped_steps",
    "row_cap_deferred_jobs",
    "inline_steps",
    "inline_verified_tokens",
    "inline_misses",
    "inline_declined_steps",
    "inline_own_forward_steps",
    "inline_launch_time_s",
    "inline_sample_time_s",
    "inline_prefill_steps",
    "inline_prefill_rows",
    "inline_prefill_prompts",
    "inline_prefill_time_s",
    "inline_prefill_rows_only",
    "folded_passes",
    "fold_missed",
    "schedule_time_s",
    "batch_build_time_s",
    "steps_decode", "steps_prefill", "steps_det_prefill",
    "step_time_decode_s", "step_time_prefill_s", "step_time_det_prefill_s",
    "by_sampling_kind",
}

ACCEPT = accept(4, verified=5, outputs=5, num_inconsistent=1)
ROLLBACK = rollback(4, accepted=1, rejected=5, corrected=3, verified=7, mismatch=6, injected=True)


def test_snapshot_keys_and_zero_state() -> None:
    snapshot = Llm42Stats().snapshot()
    assert set(snapshot) == SNAPSHOT_KEYS, f"unexpected keys {set(snapshot) ^ SNAPSHOT_KEYS}"
    assert snapshot.pop("by_sampling_kind") == {}
    assert all(value == 0 for value in snapshot.values()), snapshot


def test_stats_arithmetic() -> None:
    stats = Llm42Stats()
    stats.observe_pass(num_real_rows=3, num_pad_rows=5, seconds=0.25)
    stats.observe_pass(num_real_rows=8, num_pad_rows=0, seconds=0.5, num_prompt_rows=6,
                       graphed=True)
    stats.observe_decision(ACCEPT, "greedy")  # commits 4
    stats.observe_decision(ROLLBACK, "top_p")  # commits 1 accepted + 1 corrected, drops 5
    stats.observe_decision(ACCEPT, "top_p")  # commits 4
    stats.observe_finished()
    stats.observe_cached_prompt(128)
    stats.observe_restart()
    stats.observe_early_result(0.0625)
    stats.observe_early_result()
    stats.observe_schedule(1.0, 0.25)
    stats.observe_schedule(0.5)
    stats.observe_overlapped_passes(2)
    stats.observe_row_cap(3)  # a step that held three jobs back
    stats.observe_row_cap(0)  # a step within its budget
    stats.observe_row_cap(1)
    stats.observe_inline_step(0.25, own_forward=True)
    stats.observe_inline_sample(0.125)
    stats.observe_inline_token(True)
    stats.observe_inline_token(True)
    stats.observe_inline_token(False)  # a miss: left to a pass
    stats.observe_inline_declined()
    stats.observe_inline_prefill(rows=40, launch_seconds=0.5)
    stats.observe_inline_prefill(rows=2, launch_seconds=0.25, rows_only=True)
    for folded in (True, True, False):
        stats.observe_fold(folded)
    stats.observe_inline_prompt()
    stats.observe_step("decode", 0.125)
    stats.observe_step("decode", 0.25)
    stats.observe_step("det_prefill", 0.5)
    snapshot = stats.snapshot()
    assert snapshot.pop("by_sampling_kind") == {
        "greedy": {"decisions": 1, "rollbacks": 0, "verified_tokens": 4, "tokens_rolled_back": 0,
                   "recompute_pct": 0.0},
        "top_p": {"decisions": 2, "rollbacks": 1, "verified_tokens": 6, "tokens_rolled_back": 5,
                  "recompute_pct": 100 * 5 / 11},
    }
    expected = {
        "verify_passes": 2,
        "graphed_passes": 1,
        "verify_rows": 11,
        "prompt_rows": 6,
        "cached_prompt_tokens": 128,
        "padded_rows": 5,
        "verified_tokens": 10,
        "rollbacks": 1,
        "tokens_rolled_back": 5,
        "injected_mismatches": 1,
        "inconsistent_tokens": 2,
        "recompute_pct": 100 * 5 / 15,
        "verify_time_s": 0.75,
        "det_requests_finished": 1,
        "retraction_restarts": 1,
        "early_results": 2,
        "overlapped_passes": 2,
        "drain_time_s": 0.0625,
        "row_capped_steps": 2,
        "row_cap_deferred_jobs": 4,
        "inline_steps": 1, "inline_verified_tokens": 2, "inline_misses": 1,
        "inline_declined_steps": 1, "inline_own_forward_steps": 1,
        "inline_launch_time_s": 0.25, "inline_sample_time_s": 0.125,
        "inline_prefill_steps": 2, "inline_prefill_rows": 42, "inline_prefill_prompts": 1,
        "inline_prefill_time_s": 0.75, "inline_prefill_rows_only": 1,
        "folded_passes": 2, "fold_missed": 1,
        "schedule_time_s": 1.5,
        "batch_build_time_s": 0.25,
        "steps_decode": 2, "steps_prefill": 0, "steps_det_prefill": 1,
        "step_time_decode_s": 0.375, "step_time_prefill_s": 0.0, "step_time_det_prefill_s": 0.5,
    }
    assert snapshot == pytest.approx(expected), f"expected {expected}, found {snapshot}"
    stats.reset()
    zeroed = stats.snapshot()
    assert zeroed.pop("by_sampling_kind") == {}, "reset must zero everything"
    assert all(value == 0 for value in zeroed.values()), "reset must zero everything"


@pytest.mark.parametrize("params, kind", [
    ((1.0, 1.0, 1, 0.0), "greedy"),  # temperature 0 as SGLang normalizes it: top_k 1
    ((0.0, 1.0, 1 << 30, 0.0), "greedy"),  # a raw temperature 0
    ((0.8, 1.0, 1 << 30, 0.0), "temperature"),  # no truncation
    ((0.7, 0.9, 1 << 30, 0.0), "top_p"),
    ((1.0, 1.0, 50, 0.0), "top_k"),
    ((1.0, 1.0, 1 << 30, 0.05), "min_p"),
    ((0.7, 0.95, 40, 0.02), "top_k+top_p+min_p"),  # combinations keep one order
])
def test_sampling_kind(params, kind) -> None:
    from llm42.core.stats import sampling_kind

    assert sampling_kind(*params) == kind


def test_pad_rows_never_count_as_verified() -> None:
    stats = Llm42Stats()
    stats.observe_pass(num_real_rows=0, num_pad_rows=8, seconds=0.1)
    snapshot = stats.snapshot()
    assert (snapshot["verify_rows"], snapshot["verified_tokens"]) == (0, 0)
    assert (snapshot["padded_rows"], snapshot["recompute_pct"]) == (8, 0.0)


CONFIG_ERRORS = [
    # (config kwargs, context length, expected message fragment)
    ({"window_size": 0}, None, "--llm42-window-size must be >= 1, got 0"),  # zero window
    ({"window_size": 2048}, 1024, "context length found is 1024"),  # window > context
    ({"verify_batch_size": 0}, None, "--llm42-verify-batch-size must be >= 1"),  # zero batch
    ({"inject_mismatch_rate": -0.5}, None, "--llm42-inject-mismatch-rate must be in [0, 1]"),
    ({"inject_mismatch_rate": 1.01}, None, "--llm42-inject-mismatch-rate"),  # above 1
    ({"inject_mismatch_rate": math.nan}, None, "--llm42-inject-mismatch-rate"),  # NaN
    ({"max_verify_wait": -1}, None, "--llm42-max-verify-wait must be in [0, window size), got -1"),
    ({"window_size": 8, "max_verify_wait": 8}, None, "got 8 with --llm42-window-size 8"),
    ({"window_size": 8, "max_finish_wait": 8}, None,
     "--llm42-max-finish-wait must be in [0, window size), got 8 with --llm42-window-size 8"),
    ({"max_finish_wait": -1}, None, "--llm42-max-finish-wait must be in [0, window size)"),
    ({"solo_prefill_min_tokens": -1}, None, "--llm42-solo-prefill-min-tokens must be >= 0"),
    ({"max_passes_per_step": -1}, None, "--llm42-max-passes-per-step must be >= 0"),
    ({"inline_pad_ratio": -1.0}, None, "--llm42-inline-pad-ratio must be a number >= 0"),
    ({"inline_pad_ratio": math.inf}, None, "--llm42-inline-pad-ratio must be a number >= 0"),
    ({"verifier": "row-invariant", "max_pass_rows_per_step": 0}, None,  # an empty budget
     "--llm42-max-pass-rows-per-step must be >= 1 (leave it out for no cap), got 0"),
    ({"verifier": "fixed-shape", "max_pass_rows_per_step": 4}, None,  # B x W rows: refused...
     "--llm42-max-pass-rows-per-step needs --llm42-verifier row-invariant, got --llm42-verifier "
     "fixed-shape"),
    ({"verifier": "fixed-shape", "max_pass_rows_per_step": 4}, None,  # ...with a pointer
     "cap its passes with --llm42-max-passes-per-step instead"),
    ({"solo_prefill_min_tokens": 512, "batched_prefill": False}, None,
     "drop --no-llm42-batched-prefill"),  # a threshold between two paths, one of them off
    ({"verifier": "exact"}, None,
     "--llm42-verifier must be one of auto, fixed-shape, row-invariant"),
    ({"verifier": "fixed-shape", "prefix_cache": True, "batched_prefill": False}, None,
     "--llm42-prefix-cache shares prompt KV written by prompt passes"),
]


FIXED = {"verifier": "fixed-shape"}


@pytest.mark.parametrize("kwargs, n, logprobs, alone, verified", [
    (FIXED, 100, False, False, True),  # fixed-shape: a short prompt joins a batch, prompt rows
    (FIXED, 5000, False, True, False),  # fixed-shape: a long one prefills alone, o_0 final
    ({**FIXED, "batched_prefill": False}, 100, False, True, False),  # fixed-shape solo prefill
    ({"verifier": "row-invariant"}, 100, False, True, True),  # apart from normal prompts by
    # default (batches of deterministic prompts), then prompt rows: a prefill's KV would depend
    # on the prefill path
    ({"verifier": "row-invariant", "batched_prefill": True}, 5000, False, False, True),  # or
    # batched, whatever its length
    ({"verifier": "row-invariant", "solo_prefill_min_tokens": 1000}, 100, False, False, True),
    ({"verifier": "row-invariant", "solo_prefill_min_tokens": 1000}, 5000, False, True, True),
    ({"verifier": "row-invariant", "prefix_cache": True, "batched_prefill": False}, 100, False,
     True, True),  # so the prefix cache works with solo prefills too
    ({"verifier": "row-invariant"}, 10, True, True, False),  # prompt logprobs: its prefill's
])
def test_prefill_path_and_prompt_verification(kwargs, n, logprobs, alone, verified) -> None:
    config = Llm42Config(**kwargs)
    config.validate()
    assert config.prefills_alone(n, wants_prompt_logprobs=logprobs) is alone
    assert config.verifies_prompt(n, wants_prompt_logprobs=logprobs) is verified


@pytest.mark.parametrize(("kwargs", "context_length", "message"), CONFIG_ERRORS)
def test_config_errors(kwargs, context_length, message) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        Llm42Config(**kwargs).validate(context_length)


@pytest.mark.parametrize(
    ("kwargs", "context_length"),
    [
        ({}, None),  # defaults
        ({}, 64),  # default window equal to the context length
        ({"window_size": 1, "verify_batch_size": 1, "inject_mismatch_rate": 1.0}, 1),  # edges
        ({"skip_compare": True, "seed": 123}, 4096),  # benchmark mode
        ({"window_size": 8, "max_verify_wait": 7}, None),  # longest wait
    ],
)
def test_config_valid(kwargs, context_length) -> None:
    config = Llm42Config(**kwargs)
    config.validate(context_length)
    assert Llm42Config().window_size == 64 and Llm42Config().verify_batch_size == 8


def test_verify_wait_default_is_a_quarter_window() -> None:
    assert Llm42Config(window_size=64).verify_wait_steps == 16
    assert Llm42Config(window_size=3).verify_wait_steps == 0
    assert Llm42Config(window_size=64, max_verify_wait=0).verify_wait_steps == 0


@pytest.mark.parametrize(
    ("kwargs", "threshold"),
    [
        ({}, 1024),  # long prompts alone, short ones verified by prompt passes
        ({"solo_prefill_min_tokens": 300}, 300),
        ({"solo_prefill_min_tokens": 0}, None),  # every prompt batched
        ({"prefix_cache": True}, None),  # long shared prefixes are what the cache is for
        ({"prefix_cache": True, "solo_prefill_min_tokens": 2000}, 2000),
        ({"batched_prefill": False}, 0),  # every prompt alone
    ],
)
def test_which_deterministic_prefills_run_alone(kwargs, threshold) -> None:
    config = Llm42Config(**kwargs)
    config.validate()
    assert config.solo_prefill_threshold == threshold
    for n in (1, 299, 300, 1023, 1024, 5000):
        alone = threshold is not None and n >= threshold
        assert config.prefills_alone(n, wants_prompt_logprobs=False) is alone, n
        assert config.prefills_alone(n, wants_prompt_logprobs=True) is True, n


@pytest.mark.parametrize("body, mode", [
    ({}, {}),
    ({"skip_compare": True}, {"skip_compare": True}),
    ({"inject_mismatch_rate": 1}, {"inject_mismatch_rate": 1.0}),
    ({"skip_compare": False, "inject_mismatch_rate": 0.25},
     {"skip_compare": False, "inject_mismatch_rate": 0.25}),
    ({"window_size": 1}, {"window_size": 1}),  # the smallest window
    ({"window_size": 32, "verify_batch_size": 16},  # a (W, B) sweep at a constant pass size
     {"window_size": 32, "verify_batch_size": 16}),
    ({"window_size": 128, "inject_mismatch_rate": 0}, {"window_size": 128,
                                                       "inject_mismatch_rate": 0.0}),
    ({"max_verify_wait": 0, "overlap_verify": True},  # pass scheduling, outputs unchanged
     {"max_verify_wait": 0, "overlap_verify": True}),
    ({"max_verify_wait": 48, "overlap_verify": False},
     {"max_verify_wait": 48, "overlap_verify": False}),
    ({"max_finish_wait": 8}, {"max_finish_wait": 8}),
    ({"max_finish_wait": None}, {"max_finish_wait": None}),  # back to the default
    ({"inline_pad_ratio": 0}, {"inline_pad_ratio": 0.0}),  # inline for full steps only
    ({"batched_prefill": False}, {"batched_prefill": False}),
    ({"batched_prefill": None}, {"batched_prefill": None}),  # the verifier's default
    ({"defer_verify_on_prefill": True}, {"defer_verify_on_prefill": True}),
])
def test_benchmark_mode_parses(body, mode) -> None:
    from llm42.core.config import parse_benchmark_mode

    assert parse_benchmark_mode(body) == mode


@pytest.mark.parametrize("body, message", [
    ({"skip_compare": 1}, "skip_compare must be true or false"),
    ({"inject_mismatch_rate": -0.1}, "inject_mismatch_rate must be a number in [0, 1]"),
    ({"inject_mismatch_rate": float("nan")}, "inject_mismatch_rate must be"),
    ({"inject_mismatch_rate": "0.5"}, "inject_mismatch_rate must be"),
    ({"inline_pad_ratio": -1}, "inline_pad_ratio must be a number >= 0"),
    ({"inline_pad_ratio": True}, "inline_pad_ratio must be a number >= 0"),
    ({"window_size": 0}, "window_size must be an integer >= 1, got 0"),  # empty window
    ({"window_size": -16}, "window_size must be an integer >= 1, got -16"),
    ({"window_size": 16.0}, "window_size must be an integer >= 1, got 16.0"),  # a float
    ({"window_size": True}, "window_size must be an integer >= 1, got True"),  # bool is an int
    ({"window_size": "16"}, "window_size must be an integer >= 1"),
    ({"verify_batch_size": 0}, "verify_batch_size must be an integer >= 1, got 0"),
    ({"verify_batch_size": 4.0}, "verify_batch_size must be an integer >= 1, got 4.0"),
    ({"max_verify_wait": -1}, "max_verify_wait must be an integer >= 0 or null, got -1"),
    ({"max_verify_wait": 4.0}, "max_verify_wait must be an integer >= 0 or null, got 4.0"),
    ({"max_verify_wait": True}, "max_verify_wait must be an integer >= 0 or null, got True"),
    ({"overlap_verify": 1}, "overlap_verify must be true or false, got 1"),
    ({"batched_prefill": "no"}, "batched_prefill must be true or false or null, got 'no'"),
    ({"defer_verify_on_prefill": None}, "defer_verify_on_prefill must be true or false, got None"),
    ({"max_finish_wait": -2}, "max_finish_wait must be an integer >= 0 or null, got -2"),
    ({"max_finish_wait": 1.5}, "max_finish_wait must be an integer >= 0 or null, got 1.5"),
    ({"max_passes_per_step": 1}, "unknown field 'max_passes_per_step'"),  # not switchable
    (None, "JSON object"),
])
def test_benchmark_mode_errors_name_the_field(body, message) -> None:
    from llm42.core.config import parse_benchmark_mode

    with pytest.raises(ValueError, match=re.escape(message)):
        parse_benchmark_mode(body)


def test_benchmark_mode_needs_the_flag_and_keeps_the_rest() -> None:
    from llm42.core.config import with_benchmark_mode

    with pytest.raises(PermissionError, match="--llm42-benchmark-modes"):
        with_benchmark_mode(Llm42Config(), {"skip_compare": True})
    config = Llm42Config(window_size=16, max_passes_per_step=1, benchmark_modes=True)
    switched = with_benchmark_mode(config, {"inject_mismatch_rate": 0.5})
    assert switched.inject_mismatch_rate == 0.5 and not switched.skip_compare
    assert switched.window_size == 16 and switched.max_passes_per_step == 1


def test_window_switch_is_validated_like_the_flags() -> None:
    """A new W: the derived max verify wait follows it, an explicit one must stay below it, it
    must fit the context, and no deterministic request may be in flight (409, not 400)."""
    from llm42.core.config import ModeSwitchBusy, with_benchmark_mode

    config = Llm42Config(window_size=64, benchmark_modes=True, inject_mismatch_rate=0.5)
    switched = with_benchmark_mode(config, {"window_size": 16}, context_length=1024)
    assert (switched.window_size, switched.verify_wait_steps) == (16, 4)  # W // 4, not 16
    assert switched.inject_mismatch_rate == 0.5, "other fields kept"
    waits = replace(config, max_verify_wait=20)
    assert with_benchmark_mode(waits, {"window_size": 32}).verify_wait_steps == 20
    with pytest.raises(ValueError, match=re.escape(
            "window_size 16 refused: --llm42-max-verify-wait must be in [0, window size), "
            "got 20 with --llm42-window-size 16")):
        with_benchmark_mode(waits, {"window_size": 16})
    with pytest.raises(ValueError, match="window_size 2048 refused: .*context length found is "
                                         "1024"):
        with_benchmark_mode(config, {"window_size": 2048}, context_length=1024)
    with pytest.raises(ModeSwitchBusy, match=re.escape(
            "window_size cannot switch from 64 to 16 while 2 deterministic request(s) are in "
            "flight: a window or pass-size switch needs an idle server")):
        with_benchmark_mode(config, {"window_size": 16}, num_det_in_flight=2)
    with pytest.raises(ModeSwitchBusy, match="verify_batch_size cannot switch from 8 to 4"):
        with_benchmark_mode(config, {"verify_batch_size": 4}, num_det_in_flight=1)
    assert with_benchmark_mode(config, {"verify_batch_size": 4}).verify_batch_size == 4
    # the window it already has, or other fields, switch with requests in flight
    assert with_benchmark_mode(config, {"window_size": 64, "skip_compare": True},
                               num_det_in_flight=2).skip_compare


def test_pass_scheduling_switches_in_flight_and_is_validated_like_the_flags() -> None:
    """max_verify_wait and overlap_verify decide only when a row is verified: they switch with
    deterministic requests in flight; a wait must stay below the window, as the flag must."""
    from llm42.core.config import with_benchmark_mode

    config = Llm42Config(window_size=64, benchmark_modes=True)
    switched = with_benchmark_mode(config, {"max_verify_wait": 48, "overlap_verify": True},
                                   num_det_in_flight=3)
    assert (switched.verify_wait_steps, switched.overlap_verify) == (48, True)
    assert switched.echo()["max_verify_wait"] == 48
    auto = with_benchmark_mode(switched, {"max_verify_wait": None, "window_size": 32})
    assert auto.verify_wait_steps == 8, "null: the default again, W // 4 of the new W"
    with pytest.raises(ValueError, match=re.escape(
            "--llm42-max-verify-wait must be in [0, window size), got 64 with "
            "--llm42-window-size 64")):
        with_benchmark_mode(config, {"max_verify_wait": 64})
