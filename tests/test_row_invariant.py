"""`--llm42-verifier row-invariant`: a deterministic request's output depends on the request alone.

Token ids and logprobs, greedy and seeded top-p, bitwise equal across W in {3, 8, 16, 64} and B in
{1, 2, 4, 32} (switched at runtime), batched and solo prefill, prefix cache on and off, two
chunked-prefill sizes, both scheduler loops, a row budget per step and none, with and without
NGRAM speculation, alone, among normal traffic and batched, through injected rollbacks. The control:
the fixed-shape verifier's logprobs change with W and B on the same requests.
"""

from __future__ import annotations

import pytest
import requests
from conftest import CONTEXT, _start, wait_idle_and_healthy
from helpers import PROMPTS, background_requests, concurrently, generate, llm42_stats
from helpers import assert_same as assert_same_one

from benchmarks.timeline import load_segments
from llm42.sglang import row_pass

SAMPLINGS = [pytest.param({}, id="greedy"),
             pytest.param({"temperature": 0.8, "seed": 5, "sampling": {"top_p": 0.9}},
                          id="top_p-seeded")]
# (W, B, --llm42-inline-pad-ratio, --llm42-inline-prefill) switched in after the server's own
# (8, 4, INLINE_ALWAYS, on); ratio 0: only full steps of R rows are inline, so here every output
# token after o_0 is verified by a pass (and o_0 too without inline prompt rows)
SHAPES = [(16, 32, 0.0, True), (16, 32, 0.0, False),
          (3, 1, INLINE_ALWAYS := float(row_pass.ROWS_PER_FORWARD["cpu"]), False),
          (64, 2, 1.0, True)]
ROW_BUDGET = 2  # row_server's --llm42-max-pass-rows-per-step (row_server_apart: no budget)


def _row_args(window: int, batch: int, rate: float, verifier: str = "row-invariant") -> list[str]:
    return ["--enable-llm42", "--llm42-verifier", verifier,
            "--llm42-window-size", str(window), "--llm42-verify-batch-size", str(batch),
            "--llm42-inject-mismatch-rate", str(rate), "--random-seed", "7",
            "--context-length", str(CONTEXT)]


@pytest.fixture(scope="module")
def row_server(tiny_model, tmp_path_factory):
    """W = 8, B = 4, the prefix cache (on by default under this verifier), 32-token prefill
    chunks, overlap loop, at most ROW_BUDGET rows verified per step (its step timeline
    recorded), every decode step of at most R rows inline, prompts' rows inline with their
    prefill; W, B, the pad ratio and inline prompt rows switchable. Every fast-path prefill's KV
    is perturbed (`prefill_faults`: before inline prompt rows overwrite it, or with o_0 for a
    prompt pass to repair), so a prompt whose KV the verifier did not rewrite diverges."""
    timeline = tmp_path_factory.mktemp("row-invariant-timeline")
    server = _start(tiny_model, _row_args(8, 4, 0.3) + [
        "--chunked-prefill-size", "32", "--llm42-benchmark-modes",
        "--llm42-inline-pad-ratio", str(INLINE_ALWAYS),
        "--llm42-max-pass-rows-per-step", str(ROW_BUDGET), "--llm42-timeline-dir",
        str(timeline)], "row-invariant", tmp_path_factory,
        env={"LLM42_TEST_PERTURB_PREFILL": "1"})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def row_server_apart(tiny_model, tmp_path_factory):
    """Another layout: W = 16, B = 1, no prefix cache, solo prefills (each deterministic prompt
    in a batch of its own, then verified by prompt rows), 64-token chunks, SGLang's normal
    loop, and NGRAM speculative decoding on the fast path (candidates from speculative steps).
    Its verifier is the default, auto, which runs row-invariant here."""
    server = _start(tiny_model, _row_args(16, 1, 0.5, verifier="auto") + [
        "--no-llm42-batched-prefill", "--no-llm42-prefix-cache", "--chunked-prefill-size", "64",
        "--disable-overlap-schedule",
        "--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "4"],
        "row-invariant-apart", tmp_path_factory)
    yield server
    server.stop()


def _switch(url: str, window: int, batch: int, pad_ratio: float | None = None,
            inline_prefill: bool | None = None, batched_prefill: bool | None = None,
            fold_passes: bool | None = None) -> None:
    """W and B, and the pad ratio, inline prompt rows, batched prefill and folded passes when
    given (the fixed-shape control's server keeps its own)."""
    mode = {"window_size": window, "verify_batch_size": batch}
    if batched_prefill is not None:
        mode["batched_prefill"] = batched_prefill
    if fold_passes is not None:
        mode["fold_passes"] = fold_passes
    if pad_ratio is not None:
        mode["inline_pad_ratio"] = pad_ratio
    if inline_prefill is not None:
        mode["inline_prefill"] = inline_prefill
    r = requests.post(url + "/llm42_benchmark_mode", timeout=60, json=mode)
    assert r.status_code == 200 and r.json()["verify_batch_size"] == batch, r.text


def _outputs(url: str, prompts, sampling: dict):
    return [(ids, lps) for ids, lps, _ in generate(url, prompts, max_new_tokens=20, **sampling)]


def assert_same(ref: list, got: list, what: str) -> None:
    """Per prompt, token ids and logprobs bitwise (`helpers.assert_same` on each)."""
    for k, (ref_one, got_one) in enumerate(zip(ref, got, strict=True)):
        assert_same_one(ref_one, got_one, f"{what}, prompt {k}")


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_outputs_depend_on_the_request_alone(row_server, row_server_apart, sampling):
    prompts = PROMPTS[:3]
    url = row_server.url
    ref = _outputs(url, prompts, sampling)
    try:
        for window, batch, pad_ratio, inline_prefill in SHAPES:
            before = llm42_stats(url)
            _switch(url, window, batch, pad_ratio, inline_prefill)
            got = [_outputs(url, [p], sampling)[0] for p in prompts]  # alone
            assert_same(ref, got, f"alone at W {window}, B {batch}, pad ratio {pad_ratio}, "
                                  f"inline prompt rows {inline_prefill}")
            after = llm42_stats(url)
            # alone: 15 padding rows a step, more than 1.0 x 1 row: by passes
            declined = after["inline_declined_steps"] - before["inline_declined_steps"]
            assert (declined > 0) == (pad_ratio < 15)
            inline_prompts = after["inline_prefill_prompts"] - before["inline_prefill_prompts"]
            assert inline_prompts == (len(prompts) if inline_prefill else 0), inline_prompts
            # a prompt alone in its prefill: its rows are the whole forward, no extend
            rows_only = after["inline_prefill_rows_only"] - before["inline_prefill_rows_only"]
            assert (rows_only >= len(prompts)) == inline_prefill, rows_only
        # deterministic prompts prefilled in batches of their own, together: rows only
        _switch(url, 8, 4, INLINE_ALWAYS, True, batched_prefill=False)
        before = llm42_stats(url)
        apart = concurrently([lambda: _outputs(url, prompts, sampling),
                              *background_requests(url, 6)])[0]
        after = llm42_stats(url)
        assert_same(ref, apart, "deterministic prompts prefilled apart from normal ones")
        steps, rows_only = (after[k] - before[k] for k in ("inline_prefill_steps",
                                                           "inline_prefill_rows_only"))
        assert steps > 0 and rows_only == steps, (steps, rows_only)  # never beside an extend
        _switch(url, 8, 4, INLINE_ALWAYS, True, batched_prefill=True)
        loaded = concurrently([lambda: _outputs(url, prompts, sampling),
                               *background_requests(url, 12)])[0]
        assert_same(ref, loaded, "batched among normal traffic")
    finally:
        _switch(url, 8, 4, INLINE_ALWAYS, True, batched_prefill=True)
    assert_same(ref, _outputs(row_server_apart.url, prompts, sampling),
                "W 16, B 1, solo prefills, no prefix cache, other chunks, normal loop, NGRAM")
    stats = llm42_stats(url)
    assert stats["rollbacks"] > 0 and stats["verifier"] == "row-invariant"
    assert stats["row_pass_rows"] == row_pass.ROWS_PER_FORWARD["cpu"], stats
    assert stats["prefix_cache"] is True, "on by default under the row-invariant verifier"
    # row_server verified decode rows inline (steps of <= 16 rows), the NGRAM server by passes
    # only: the same bits either way (the comparison above)
    assert stats["inline_verify"] is True and stats["inline_verified_tokens"] > 0, stats
    assert stats["inline_misses"] == 0, stats
    apart = llm42_stats(row_server_apart.url)
    assert apart["verifier"] == "row-invariant", "auto runs row-invariant where it can"
    assert apart["prefix_cache"] is False
    assert apart["inline_verify"] is False and apart["inline_verified_tokens"] == 0, apart
    wait_idle_and_healthy(row_server)
    wait_idle_and_healthy(row_server_apart)


def test_prefix_cache_hits_give_the_bits_of_misses_across_windows(row_server, row_server_apart):
    """Verified prompt rows of one W are reused at another (their KV does not depend on W): a
    hit at W = 16 after a miss at W = 8 gives the output of a server without the cache."""
    prompt = " ".join(PROMPTS[3:6])  # several rows of either window
    url = row_server.url
    before = llm42_stats(url)["cached_prompt_tokens"]
    miss = _outputs(url, [prompt], {})
    try:
        _switch(url, 16, 2)
        hit = _outputs(url, [prompt], {})
    finally:
        _switch(url, 8, 4)
    assert llm42_stats(url)["cached_prompt_tokens"] > before, "no prefix-cache hit"
    assert_same(miss, hit, "prefix-cache hit at W 16 vs miss at W 8")
    assert_same(miss, _outputs(row_server_apart.url, [prompt], {}), "server without the cache")
    wait_idle_and_healthy(row_server)


def test_a_row_budget_holds_jobs_back_and_changes_no_output(row_server, row_server_apart):
    """Six deterministic requests in one batch: their prompts, then their windows, are ready in
    the same steps. row_server verifies at most ROW_BUDGET rows a step, so it holds jobs back
    to later steps (stats), and no step of its timeline verified more, except a prompt alone;
    the outputs are bitwise those of row_server_apart, which has no budget. Passes only here
    (no inline step or prompt row): the budget bounds passes."""
    url, prompts = row_server.url, PROMPTS[:6]
    try:
        _switch(url, 8, 4, 0.0, False)
        before = llm42_stats(url)
        got = _outputs(url, prompts, {})
    finally:
        _switch(url, 8, 4, INLINE_ALWAYS, True)
    assert_same(_outputs(row_server_apart.url, prompts, {}), got, "budget of 2 rows vs none")
    wait_idle_and_healthy(row_server)  # idle: the step timeline is flushed
    after = llm42_stats(url)
    assert after["max_pass_rows_per_step"] == ROW_BUDGET, after
    assert after["row_cap_deferred_jobs"] > before["row_cap_deferred_jobs"], after
    assert after["row_capped_steps"] > before["row_capped_steps"], after
    steps = [r for segment in load_segments(after["timeline"]) for r in segment if r["rows"]]
    over = [r for r in steps if r["rows"] > ROW_BUDGET and r["rows"] != r["prompt_rows"]]
    assert not over, f"steps over the budget of {ROW_BUDGET} rows with windows in them: {over}"
    assert any(r["rows"] == ROW_BUDGET for r in steps), "the budget was never used in full"


@pytest.mark.parametrize("inline_prefill", [True, False])
def test_a_request_alone_takes_no_pass_or_one(row_server, inline_prefill):
    """Inline prompt rows: the prefill's forward verifies the prompt and o_0, and o_1's decode
    step (launched before the prefill's result is processed) is inline, as is every later one:
    no pass at all. Without them, o_1's step cannot be inline; the prompt pass replays o_0 at
    position P and verifies o_1 with the prompt (`prompt_verifies_next`): one pass, not a prompt
    pass and a catch-up pass."""
    url = row_server.url
    wait_idle_and_healthy(row_server)
    try:
        _switch(url, 8, 4, INLINE_ALWAYS, inline_prefill)
        before = llm42_stats(url)
        ids, _, meta = generate(url, PROMPTS[5] + f" Once more, {inline_prefill}.",
                                max_new_tokens=16, ignore_eos=True)
        after = llm42_stats(url)
    finally:
        _switch(url, 8, 4, INLINE_ALWAYS, True)
    assert len(ids) == 16 and meta["llm42_verify_passes"] == (0 if inline_prefill else 1), meta
    inline = after["inline_verified_tokens"] - before["inline_verified_tokens"]
    if inline_prefill:
        assert inline == len(ids), (inline, meta)
        assert after["inline_prefill_prompts"] == before["inline_prefill_prompts"] + 1
    else:  # o_0 and o_1 by the prompt pass (or o_0 alone)
        assert inline >= len(ids) - 2, (inline, meta)
    assert after["inline_misses"] == before["inline_misses"]
    wait_idle_and_healthy(row_server)


def test_a_step_of_exactly_r_rows_runs_sglangs_own_forward_in_pass_mode(row_server,
                                                                         row_server_apart):
    """A decode step of exactly R rows is a row-invariant forward already: it runs as SGLang's
    own forward in pass mode, no second batch built (`inline_own_forward_steps`). Four
    deterministic requests among twelve long normal ones fill R = 16 rows; their outputs are
    bitwise those of the passes-only server."""
    url, rows = row_server.url, row_pass.ROWS_PER_FORWARD["cpu"]
    prompts = [p + " Sixteen rows." for p in PROMPTS[:4]]
    normal = [lambda k=k: generate(url, PROMPTS[k % len(PROMPTS)], det=None, max_new_tokens=64,
                                   ignore_eos=True) for k in range(rows - len(prompts))]
    before = llm42_stats(url)
    got = concurrently([lambda: generate(url, prompts, max_new_tokens=40), *normal])[0]
    after = llm42_stats(url)
    ref = generate(row_server_apart.url, prompts, max_new_tokens=40)
    assert_same([(ids, lps) for ids, lps, _ in ref], [(ids, lps) for ids, lps, _ in got],
                "steps of R rows in pass mode vs passes only")
    own = after["inline_own_forward_steps"] - before["inline_own_forward_steps"]
    assert own > 0, "no decode step of exactly R rows ran inline"
    assert after["inline_misses"] == before["inline_misses"], after
    wait_idle_and_healthy(row_server)


def test_inline_rows_whose_logits_are_adjusted_are_sampled_again(row_server):
    """A frequency penalty and a logit bias change a deterministic row's logits before the
    Sampler, so an inline step's token is not the verifier's by construction: the verifier
    samples it again with them replayed, and it must agree (no miss). Inline (steps and prompt
    rows) and passes only give the same bits on one server."""
    url = row_server.url
    prompts = [PROMPTS[1], PROMPTS[2] + " Again."]
    sampling = {"temperature": 0.7, "seed": 3,
                "sampling": {"frequency_penalty": 0.6, "logit_bias": {"11": 2.5}}}
    before = llm42_stats(url)
    inline = _outputs(url, prompts, sampling)
    after = llm42_stats(url)
    try:
        _switch(url, 8, 4, 0.0, False)  # passes only: no inline step or prompt row
        passes = _outputs(url, prompts, sampling)
    finally:
        _switch(url, 8, 4, INLINE_ALWAYS, True)
    assert_same(passes, inline, "penalty and bias, inline vs passes only")
    assert after["inline_verified_tokens"] > before["inline_verified_tokens"], after
    assert after["inline_misses"] == before["inline_misses"], after
    wait_idle_and_healthy(row_server)


def test_a_rounds_rows_form_one_pass_whatever_b(row_server):
    """B = 1, W = 3: a new prompt's job is many 3-token rows, and they are verified in one pass
    (its entries packed into R-row forwards), not one pass per row as B says for fixed shapes."""
    url = row_server.url
    try:
        _switch(url, 3, 1, inline_prefill=False)  # prompt rows by a pass
        before = llm42_stats(url)
        generate(url, PROMPTS[4] + " A prompt no cache has seen.", max_new_tokens=4)
        after = llm42_stats(url)
    finally:
        _switch(url, 8, 4, inline_prefill=True)
    rows = after["verify_rows"] - before["verify_rows"]
    passes = after["verify_passes"] - before["verify_passes"]
    assert rows >= 5 and passes == 1, (rows, passes)
    wait_idle_and_healthy(row_server)


def test_due_passes_fold_into_decode_steps_and_change_no_output(row_server, row_server_apart):
    """Pad ratio 0 (no step short of R rows is inline by itself) and W = 4: three deterministic
    requests decode in steps of three rows, so their full windows (4 entries each, 15 rows with
    the step's) ride in the next decode step's padding instead of passes of their own, and the
    server's injected mismatches roll some of them back. The outputs are bitwise those of the
    same server with every pass apart, and those of the passes-only server."""
    url, prompts = row_server.url, [p + " Folded." for p in PROMPTS[:3]]
    try:
        _switch(url, 4, 4, 0.0, True, fold_passes=True)
        before = llm42_stats(url)
        folded = _outputs(url, prompts, {})
        mid = llm42_stats(url)
        _switch(url, 4, 4, fold_passes=False)
        apart = _outputs(url, prompts, {})
        after = llm42_stats(url)
    finally:
        _switch(url, 8, 4, INLINE_ALWAYS, True, fold_passes=False)
    assert_same(apart, folded, "passes folded into decode steps vs apart")
    assert_same(_outputs(row_server_apart.url, prompts, {}), folded,
                "passes folded into decode steps vs the passes-only server")
    assert mid["fold_passes"] is True and after["fold_passes"] is False
    assert mid["folded_passes"] > before["folded_passes"], mid
    assert mid["rollbacks"] > before["rollbacks"], "no folded decision rolled back"
    assert after["folded_passes"] == mid["folded_passes"], after
    assert after["verify_passes"] > mid["verify_passes"], "fold off: passes apart"
    assert after["inline_misses"] == before["inline_misses"], after
    wait_idle_and_healthy(row_server)


def test_the_fixed_shape_verifier_is_the_control(llm42_server):
    """The same requests on the fixed-shape verifier: logprobs change with W and B (what the
    row-invariant verifier removes), so the checks above can fail."""
    url = llm42_server.url
    prompts = PROMPTS[:3]
    ref = _outputs(url, prompts, {})
    try:
        _switch(url, 16, 32)
        other = _outputs(url, prompts, {})
    finally:
        _switch(url, 8, 4)
    assert llm42_stats(url)["row_pass_rows"] is None  # fixed-shape passes
    assert [lps for _, lps in ref] != [lps for _, lps in other], (
        "the fixed-shape verifier gave W 8 / B 4 and W 16 / B 32 the same bits: the control "
        "does not diverge")
