"""One list of settings: the `--llm42-*` flags, their defaults and the `/llm42_stats` echo are all
derived from `Llm42Config`'s fields, so a new setting cannot be half-wired."""

from __future__ import annotations

import argparse
import dataclasses
from types import SimpleNamespace

import pytest

from llm42.core.config import Llm42Config, setting_fields
from llm42.sglang import server_args
from llm42.sglang.runtime import Llm42Runtime

# Flag names and defaults users and scripts rely on: a derived flag must not rename or move them.
PUBLISHED_FLAGS = {
    "enable_llm42": False,
    "llm42_window_size": 64,
    "llm42_verify_batch_size": 8,
    "llm42_inject_mismatch_rate": 0.0,
    "llm42_skip_compare": False,
    "llm42_max_verify_wait": None,
    "llm42_max_finish_wait": None,
    "llm42_max_passes_per_step": 0,
    "llm42_max_pass_rows_per_step": None,
    "llm42_defer_verify_on_prefill": False,
    "llm42_overlap_verify": True,
    "llm42_batched_prefill": None,
    "llm42_prefix_cache": None,
    "llm42_solo_prefill_min_tokens": None,
    "llm42_timeline_dir": None,
    "llm42_benchmark_modes": False,
    "llm42_fp32_logits": True,
    "llm42_verifier": "auto",
    "llm42_inline_verify": None,
    "llm42_inline_pad_ratio": 2.0,
    "llm42_inline_prefill": True,
    "llm42_fold_passes": False,
    "llm42_allow_unproven_backend": False,
}

# A value other than the default for every setting (a bool flips).
OTHER_VALUES = {
    "window_size": 16, "verify_batch_size": 2, "inject_mismatch_rate": 0.25,
    "skip_compare": True, "max_verify_wait": 3, "max_finish_wait": 2, "max_passes_per_step": 2,
    "max_pass_rows_per_step": 3,
    "defer_verify_on_prefill": True, "overlap_verify": False, "batched_prefill": False,
    "prefix_cache": True, "solo_prefill_min_tokens": 300, "benchmark_modes": True,
    "fp32_logits": False, "verifier": "row-invariant", "inline_verify": False,
    "inline_pad_ratio": 0.5, "inline_prefill": False, "fold_passes": True,
    "allow_unproven_backend": True,
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    server_args.add_cli_args_hook(lambda p: None, parser)
    return parser


def _argv(values: dict) -> list[str]:
    argv = []
    for field in setting_fields():
        flag, value = field.metadata["flag"], values[field.name]
        if isinstance(value, bool):
            argv += [flag if value else "--no-" + flag[2:]] if value != field.default else []
        else:
            argv += [flag, str(value)]
    return argv


def test_every_setting_but_the_seed_has_a_flag_with_the_fields_default():
    flagged = {f.name for f in setting_fields()}
    # the seed is SGLang's --random-seed, radix_cache its --disable-radix-cache
    assert {f.name for f in dataclasses.fields(Llm42Config)} - flagged == {"seed", "radix_cache"}
    assert set(OTHER_VALUES) == flagged, "OTHER_VALUES must cover every setting"
    for field in setting_fields():
        assert server_args.FLAG_DEFAULTS[server_args.dest(field.metadata["flag"])] == field.default


def test_flag_names_and_defaults_are_the_published_ones():
    assert server_args.FLAG_DEFAULTS == PUBLISHED_FLAGS
    parsed = vars(_parser().parse_args([]))
    assert parsed == PUBLISHED_FLAGS, "argparse defaults differ from FLAG_DEFAULTS"
    assert server_args.config_from_values(parsed, seed=None) == Llm42Config()


def test_each_flag_sets_its_own_field():
    parsed = vars(_parser().parse_args(_argv(OTHER_VALUES)))
    config = server_args.config_from_values(parsed, seed=5)
    assert config == Llm42Config(seed=5, **OTHER_VALUES)
    for name, value in OTHER_VALUES.items():
        assert value != getattr(Llm42Config(), name), f"{name}: pick a value off the default"


@pytest.mark.parametrize("config", [Llm42Config(), Llm42Config(**OTHER_VALUES)],
                         ids=["defaults", "other values"])
def test_stats_echo_every_setting_resolved(config):
    scheduler = SimpleNamespace(model_config=SimpleNamespace(vocab_size=100))
    snap = Llm42Runtime(scheduler, config).snapshot()
    for field in setting_fields():
        resolved = field.metadata["echo_as"] or field.name
        assert snap[field.name] == getattr(config, resolved), field.name
    assert "seed" not in snap
    # resolved, not raw: the wait W // 4 and the threshold the prefix cache moves
    if config == Llm42Config():
        assert (snap["max_verify_wait"], snap["solo_prefill_min_tokens"]) == (16, 1024)


def test_prefix_cache_says_it_moves_the_solo_prefill_threshold():
    assert Llm42Config(prefix_cache=True).solo_prefill_threshold is None  # every prompt batched
    assert Llm42Config().solo_prefill_threshold == 1024
    help_text = next(f.metadata["help"] for f in setting_fields() if f.name == "prefix_cache")
    assert "--llm42-solo-prefill-min-tokens from 1024 to 0" in help_text


def test_inline_verify_follows_the_row_invariant_verifier():
    """On by default with row-invariant (an inline row is the same forward as a pass row), off
    with fixed-shape, where asking for it is refused naming both flags."""
    assert Llm42Config(verifier="row-invariant").uses_inline_verify
    assert not Llm42Config(verifier="row-invariant", inline_verify=False).uses_inline_verify
    assert not Llm42Config(verifier="fixed-shape").uses_inline_verify
    with pytest.raises(ValueError, match="--llm42-inline-verify needs --llm42-verifier"):
        Llm42Config(verifier="fixed-shape", inline_verify=True).validate()
    Llm42Config(verifier="auto", inline_verify=True).validate()  # a request for row-invariant
