"""The demo's verdicts and stats summary (llm42/demo_report.py), without a server: a verdict of
"identical" must mean every token id and every logprob bit, and the summary must explain the
numbers it shows. The demo run itself is `make demo`."""

from __future__ import annotations

import pytest

from llm42.demo_report import Answer, compare, stats_summary, verdict_line

BASE = Answer("The sky is blue.", (5, 6, 7, 8), (-0.5, -1.25, -0.0625, -2.0))

COMPARE_CASES = [
    # (other answer, first difference, same token ids)
    (BASE, None, True),  # the same bits: identical
    (Answer("x", (5, 6, 7, 8), (-0.5, -1.25, -0.0625, -2.0), seconds=9.0), None, True),  # text
    # and time are not what is compared: ids and logprobs are
    (Answer("", (5, 6, 9, 8), BASE.logprobs), 2, False),  # a token differs at 2
    (Answer("", BASE.token_ids, (-0.5, -1.25, -0.06250000000000001, -2.0)), 2, True),  # one
    # logprob off by one ulp, same tokens: not identical
    (Answer("", (5, 6, 7), (-0.5, -1.25, -0.0625)), 3, False),  # stopped one token earlier
    (Answer("", BASE.token_ids, (-0.5, -1.25, -0.0625, 0.0)), 3, True),  # -2.0 vs 0.0
]


@pytest.mark.parametrize("other, first, same_ids", COMPARE_CASES)
def test_compare_finds_the_first_differing_token_id_or_logprob(other, first, same_ids):
    c = compare(BASE, other)
    assert (c.first_difference, c.same_token_ids, c.identical) == (first, same_ids, first is None)


def test_signed_zero_and_nan_logprobs_compare_bitwise():
    zero = Answer("", (1,), (0.0,))
    assert not compare(zero, Answer("", (1,), (-0.0,))).identical
    nan = Answer("", (1,), (float("nan"),))
    assert compare(nan, Answer("", (1,), (float("nan"),))).identical


def test_deterministic_verdicts_say_identical_only_when_identical():
    same = verdict_line(compare(BASE, BASE), deterministic=True, device="cpu")
    assert same.startswith("IDENTICAL bit for bit") and "4 token ids" in same
    broken = verdict_line(compare(BASE, Answer("", (5, 9), (-0.5, -1.0))), deterministic=True,
                          device="cuda")
    assert broken.startswith("DIFFERENT from token 1") and "report" in broken


@pytest.mark.parametrize("device, needle", [("cpu", "on CPU"), ("cuda", "this run")])
def test_an_unchanged_normal_request_is_called_unchanged_not_faked(device, needle):
    line = verdict_line(compare(BASE, BASE), deterministic=False, device=device)
    assert line.startswith("unchanged") and needle in line
    assert "CHANGED" not in line


def test_a_changed_normal_request_says_where_and_what():
    logprobs_only = Answer("", BASE.token_ids, (-0.5, -1.5, -0.0625, -2.0))
    line = verdict_line(compare(BASE, logprobs_only), deterministic=False, device="cuda")
    assert line.startswith("CHANGED: the same token ids, but the logprobs differ from token 1")
    tokens = verdict_line(compare(BASE, Answer("", (5, 6, 1), (-0.5, -1.25, -3.0))),
                          deterministic=False, device="cpu")
    assert tokens.startswith("CHANGED from token 2")


STATS = {"enabled": True, "window_size": 16, "verify_batch_size": 32, "verify_passes": 6,
         "verified_tokens": 29, "rollbacks": 3, "tokens_rolled_back": 40,
         "recompute_pct": 57.97, "det_requests_finished": 2, "inconsistent_tokens": 0,
         "unproven_backend": None}


def test_stats_summary_explains_passes_rollbacks_and_recompute():
    text = "\n".join(stats_summary(STATS))
    assert "6 verification passes" in text and "32 windows of 16 tokens" in text
    assert "29 tokens were verified" in text
    assert "Rollbacks: 3 windows" in text and "40 decoded tokens" in text
    assert "Recompute 58.0 %" in text and "40 / (29 + 40)" in text
    assert "GET /llm42_stats" in text, "the summary points at the full counters"
    assert "WARNING" not in text and "without a determinism proof" not in text
    assert "{" not in text, "a summary, not the raw JSON"


def test_stats_summary_says_what_the_row_invariant_verifier_guarantees():
    """The default verifier where it runs: the summary says that a token's bits depend on its
    request alone and counts the tokens verified as they were made next to the passes'."""
    text = "\n".join(stats_summary({**STATS, "verifier": "row-invariant",
                                    "inline_verified_tokens": 11}))
    assert "Verifier row-invariant" in text and "request alone" in text
    assert "40 tokens were verified and sent: 11 as they were decoded (inline), 29 by 6 " \
        "verification passes" in text, text
    assert "Recompute 58.0 %" in text
    fixed = "\n".join(stats_summary({**STATS, "verifier": "fixed-shape"}))
    assert "row-invariant" not in fixed and "6 verification passes" in fixed


def test_stats_summary_flags_what_should_not_happen():
    text = "\n".join(stats_summary({**STATS, "inconsistent_tokens": 2,
                                    "unproven_backend": "fa3"}))
    assert "WARNING: 2 committed tokens" in text and "without a determinism proof: fa3" in text


@pytest.mark.parametrize("stats, needle", [
    ({"enabled": False}, "not enabled"),  # a server without --enable-llm42
    ("unavailable (HTTP 404: is the llm42 plugin installed?)", "HTTP 404"),  # no endpoint
])
def test_stats_summary_without_llm42_says_why(stats, needle):
    [line] = stats_summary(stats)
    assert needle in line
