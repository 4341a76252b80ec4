"""llm42 settings: one dataclass field each, with the flag that sets it and the flag's help.

The adapter derives the `--llm42-*` flags, their defaults and the stats echo from these fields
(`setting_fields`, `Llm42Config.echo`), builds a config from the parsed flags and validates it
before the scheduler starts:

    config = Llm42Config(window_size=args.llm42_window_size, verify_batch_size=8)
    config.validate(context_length=model_config.context_len)  # ValueError on bad flags
"""

from __future__ import annotations

import math
from dataclasses import Field, dataclass, field, fields, replace

# Prompts this long or longer prefill alone by default (see Llm42Config.solo_prefill_threshold):
# 64 rows of W = 16, two full B = 32 passes (512 tokens each), cost about as much as a solo prefill
# of 1,024 tokens.
DEFAULT_SOLO_PREFILL_MIN_TOKENS = 1024
# Raised whenever a default changes what deterministic requests return or what llm42 costs
# (1: W 64, B 8, bf16 logits; 2: W 16, B 32, fp32 logits for every row; 3: fp32 logits for
# deterministic and pass rows only; 4: W 64, B 8 again, overlap-verify on: issue 33's 8B
# ShareGPT throughput, docs/tuning.md; 5: a finishing window waits like a full one,
# --llm42-max-finish-wait; 6: --llm42-verifier auto, row-invariant where it can run: outputs
# depend on the request alone, and issue 34's 8B ShareGPT numbers favour it). `/llm42_stats`
# reports it, so benchmark results record it and the README's headline rows can be checked
# against the defaults in force.
DEFAULTS_VERSION = 6


def _setting(default, flag: str | None, help: str, *, echo_as: str | None = None,
             echoed: bool = True):
    """A field set by `flag` (None: not a flag of llm42's own). `echo_as` names the property whose
    resolved value the stats report (a default that depends on other settings); `echoed=False`
    keeps it out of the stats."""
    return field(default=default, metadata={"flag": flag, "help": help, "echo_as": echo_as,
                                             "echoed": echoed})


# --llm42-verifier: how a verification pass computes its rows (`llm42/sglang/row_pass.py`);
# auto: row-invariant where it can run, else fixed-shape (`llm42/sglang/verifier_choice.py`).
AUTO, FIXED_SHAPE, ROW_INVARIANT = "auto", "fixed-shape", "row-invariant"
VERIFIERS = (AUTO, FIXED_SHAPE, ROW_INVARIANT)


@dataclass(frozen=True)
class Llm42Config:
    window_size: int = _setting(
        64, "--llm42-window-size",
        "Tokens decoded per deterministic request before they are verified (W).")
    verify_batch_size: int = _setting(
        8, "--llm42-verify-batch-size",
        "Rows per verification pass (B); a fixed-shape pass always has B x W tokens.")
    inject_mismatch_rate: float = _setting(
        0.0, "--llm42-inject-mismatch-rate",
        "Fault injection for tests/benchmarks: probability that a verification window gets one "
        "corrupted candidate (seeded by --random-seed).")
    skip_compare: bool = _setting(
        False, "--llm42-skip-compare",
        "Benchmarking only: run verification passes but commit every candidate (measures the "
        "cost of verification alone; output is NOT deterministic).")
    # SGLang's --random-seed; not echoed by the stats (not a setting of llm42's own).
    seed: int = _setting(0, None, "Seeds the mismatch injector.", echoed=False)
    # SGLang's radix cache is on (no --disable-radix-cache): the prefix cache's default needs it.
    radix_cache: bool = _setting(True, None, "SGLang's radix cache is on.", echoed=False)
    max_verify_wait: int | None = _setting(
        None, "--llm42-max-verify-wait",
        "Decode steps a full window may wait (decoding on) so that passes fill up with B rows "
        "instead of padding; 0 verifies every window at once. Default: W / 4 (0 with "
        "--llm42-verifier row-invariant, whose passes compute no dummy rows).",
        echo_as="verify_wait_steps")
    max_finish_wait: int | None = _setting(
        None, "--llm42-max-finish-wait",
        "Decode steps a finishing request's last window may wait, its finish withheld, so that "
        "it shares a pass with other rows instead of forcing one of its own (each step decodes "
        "one token past the finish, which is dropped); past the max verify wait it is due "
        "anyway. Default: W / 4, capped at the max verify wait (0 with --llm42-verifier "
        "row-invariant); 0: verified at once. Outputs unchanged; a deterministic request "
        "completes up to N steps later.",
        echo_as="finish_wait_steps")
    max_passes_per_step: int = _setting(
        0, "--llm42-max-passes-per-step",
        "At most this many verification passes per scheduler step, so that a burst of due "
        "windows is spread over several decode steps instead of stalling one (jobs that waited "
        "2 x the max verify wait + 1 steps run regardless); 0: no cap (default).")
    max_pass_rows_per_step: int | None = _setting(
        None, "--llm42-max-pass-rows-per-step",
        "With --llm42-verifier row-invariant: verify at most this many rows (a decode window, "
        "or up to W prompt tokens, each) per scheduler step, a latency budget so that no pass "
        "stalls the batch for more than one step. The most pressing jobs run first (finishing "
        "requests, then the longest waiting), the others wait for the next step; a prompt of "
        "more rows runs alone. Outputs unchanged. Default: no cap.")
    defer_verify_on_prefill: bool = _setting(
        False, "--llm42-defer-verify-on-prefill",
        "Hold verification passes back in scheduler steps that are about to prefill (a waiting "
        "request and room for it), so that a prefill and a pass do not lengthen the same gap "
        "between decode steps; overdue jobs (2 x the max verify wait + 1 steps) run regardless.")
    overlap_verify: bool = _setting(
        True, "--llm42-overlap-verify",
        "Overlap scheduler (SGLang's default): queue a verification pass behind the decode step "
        "in flight and process that step's result while the GPU verifies, instead of waiting "
        "for it first (full windows, prompts and a finishing request's partial window, whose "
        "token past the finish is dropped). On by default; --no-llm42-overlap-verify waits "
        "first. Outputs "
        "unchanged; the H200 determinism proof passed with it.")
    batched_prefill: bool | None = _setting(
        None, "--llm42-batched-prefill",
        "Prefill deterministic requests on the fast path together with other requests and "
        "verify their prompt afterwards; --no-llm42-batched-prefill prefills them in batches "
        "of their own: one prompt each under the fixed-shape verifier (its o_0 comes from that "
        "prefill), every waiting deterministic prompt together under the row-invariant one "
        "(prompt rows verify each whatever its batch; with inline prompt rows the extend is "
        "skipped, so a prompt is computed once). Default: on under the fixed-shape verifier "
        "(or with --llm42-solo-prefill-min-tokens), off under the row-invariant one. Requests "
        "asking for prompt logprobs are always prefilled alone.",
        echo_as="batches_prefill")
    prefix_cache: bool | None = _setting(
        None, "--llm42-prefix-cache",
        "With batched prefill (the default): deterministic requests share verified prompt KV "
        "through SGLang's radix cache, in whole rows of W tokens (needs the radix cache on). "
        "Also moves the default of --llm42-solo-prefill-min-tokens from 1024 to 0 (every "
        "prompt is batched, so that long shared prefixes are reused): long prompts then take "
        "prompt passes instead of a solo prefill, which changes their outputs under the "
        "fixed-shape verifier. Default: on with --llm42-verifier row-invariant where the radix "
        "cache is on (its verified prompt rows are the same bits whatever W, B or the prefill "
        "path, so sharing them changes no output), off otherwise.",
        echo_as="uses_prefix_cache")
    solo_prefill_min_tokens: int | None = _setting(
        None, "--llm42-solo-prefill-min-tokens",
        "With batched prefill: deterministic prompts of this many tokens or more prefill in a "
        "batch of their own instead of being recomputed by prompt passes (cheaper for long "
        "prompts); 0: every prompt is batched. Default: 1024, or 0 with --llm42-prefix-cache or "
        "--llm42-verifier row-invariant. Given under the row-invariant verifier, it turns "
        "batched prefill on (off there by default).",
        echo_as="solo_prefill_threshold")
    fp32_logits: bool = _setting(
        True, "--llm42-fp32-logits",
        "Compute the LM head's logits in fp32 (bf16 inputs, fp32 accumulation and output, one "
        "read of the bf16 weights) for every row of a verification pass and for deterministic "
        "rows of ordinary batches, instead of rounding them to bf16. bf16 logits quantize "
        "near-ties, so tiny differences between the decode batch and the verification pass "
        "flip the argmax: fewer rollbacks on real weights. Changes deterministic outputs; "
        "normal requests keep SGLang's bf16 LM head bits (one GEMM for both kinds of row where "
        "that is exact, checked per batch size on the device; else a recompute of the "
        "deterministic rows).")
    verifier: str = _setting(
        AUTO, "--llm42-verifier",
        "How verification passes compute. fixed-shape runs every pass as one B x W "
        "extend forward, so outputs also depend on W, B and the prefill flags. row-invariant "
        "runs each entry as a decode row of its own in forwards of a fixed row count, so a "
        "deterministic output depends on the request alone (not on W, B, the prefill path or "
        "the prefix cache); proven on CPU (torch_native) and CUDA (triton decode attention). "
        "auto (default): row-invariant where it can run (its decode attention backend, at "
        "least its forward's rows of --max-running-requests, GEMMs checked row-invariant at "
        "startup), else fixed-shape; the log and /llm42_stats say which.")
    inline_verify: bool | None = _setting(
        None, "--llm42-inline-verify",
        "With --llm42-verifier row-invariant: a decode step of at most the verifier's forward "
        "rows that carries a deterministic row whose KV is verified runs as one row-invariant "
        "forward of that row count, so that row's token is verified as it is made (no window, "
        "no pass, no rollback, its finish not withheld); other steps decode as usual and their "
        "windows are verified by passes. Outputs are the same either way. Default: on with "
        "--llm42-verifier row-invariant, off otherwise (refused with fixed-shape).",
        echo_as="uses_inline_verify")
    inline_pad_ratio: float = _setting(
        2.0, "--llm42-inline-pad-ratio",
        "With inline verification: a decode step of N rows (N <= R, the row-invariant "
        "forward's rows) carrying d deterministic rows runs inline only when its padding is at "
        "most this many rows per deterministic row (R - N <= ratio x d); otherwise it decodes "
        "as usual and its deterministic rows' windows are verified by passes. Padding slows "
        "every row of the step, a pass costs one R-row forward per R verified tokens: at low "
        "load or a small deterministic share, passes are cheaper. 0: only full "
        "steps; a large value: every step of at most R rows. Outputs are the same either way.")
    inline_prefill: bool = _setting(
        True, "--llm42-inline-prefill",
        "With inline verification: a prefill batch carrying a deterministic prompt whose KV "
        "before its chunk is verified runs that chunk's row-invariant prompt rows in the same "
        "forward, after SGLang's extend: they overwrite its KV with the verifier's, and SGLang "
        "samples o_0 from the verifier's logits, so prompt and o_0 are verified as they arrive, "
        "with no prompt pass and no drain of the overlap loop, and the request's first decode "
        "step is inline too. --no-llm42-inline-prefill verifies prompts by passes. Outputs are "
        "the same either way.")
    fold_passes: bool = _setting(
        False, "--llm42-fold-passes",
        "With inline verification: the entries of the windows and prompts due for a pass ride "
        "in the padding of the next decode step that has room for them (N + entries <= R "
        "rows; that step then runs as the R-row row-invariant forward), instead of a forward "
        "of their own that stalls the whole batch; decided before the step after it is built, "
        "as a pass is. While a prefill comes, due jobs wait for the decode step after it "
        "(as --llm42-defer-verify-on-prefill holds passes); one that finds no such step (too "
        "many rows, overdue) runs as a pass. Off by default: on the 8B shape online (H100) it "
        "did not lower normal requests' ITL p99 (1.505x against 1.489x plain SGLang's with "
        "passes apart). Outputs are the same either way.")
    benchmark_modes: bool = _setting(
        False, "--llm42-benchmark-modes",
        "Benchmarking only: accept POST /llm42_benchmark_mode {\"skip_compare\": bool, "
        "\"inject_mismatch_rate\": float, \"window_size\": int, \"verify_batch_size\": int, "
        "\"max_verify_wait\": int or null, \"overlap_verify\": bool, \"max_finish_wait\": int or "
        "null, \"inline_pad_ratio\": number, \"inline_prefill\": bool, \"batched_prefill\": "
        "bool or null, \"defer_verify_on_prefill\": bool, \"fold_passes\": bool} to switch "
        "those settings on the running server between benchmark runs (one server start for "
        "llm42, comparison-skipped and injected runs, a window sweep and a survey of the pass "
        "scheduling). A window or B switch needs an idle server: with deterministic requests "
        "in flight it is refused (409). Off (default): the endpoint answers 403, since "
        "skip_compare turns determinism off.")
    allow_unproven_backend: bool = _setting(
        False, "--llm42-allow-unproven-backend",
        "Experiments only: start even though the attention backend SGLang resolved has no "
        "determinism proof (proven: triton on GPU, torch_native on CPU); logs a warning and "
        "/llm42_stats reports the backend as unproven_backend. Without it such a launch stops.")

    @property
    def requested_verifier(self) -> str:
        """`verifier`, except that auto with a flag only the row-invariant verifier has is a
        request for it (refused where it cannot run, instead of silently ignoring the flag)."""
        if self.verifier == AUTO and (self.inline_verify or
                                      self.max_pass_rows_per_step is not None):
            return ROW_INVARIANT
        return self.verifier

    def echo(self) -> dict:
        """Every echoed setting by field name, resolved (`echo_as`), and the version of the
        defaults: what `/llm42_stats` reports."""
        return {**{f.name: getattr(self, f.metadata["echo_as"] or f.name)
                   for f in fields(self) if f.metadata["echoed"]},
                "defaults_version": DEFAULTS_VERSION}

    @property
    def solo_prefill_threshold(self) -> int | None:
        """Prompt length from which a deterministic prefill runs alone; None: never (every prompt
        is verified by prompt passes).

        A prompt pass recomputes a prompt already prefilled on the fast path, in rows of W tokens
        at the per-pass cost of a small eager forward: cheap for short prompts, which would waste
        a prefill batch of their own, but about twice the work of a solo prefill for long ones
        (H200, ArXiv-like prompts, ratio 1.0: 0.80x SGLang's deterministic mode batched, 1.56x
        solo). With the prefix cache every prompt is batched by default, so that long shared
        prefixes are reused."""
        if not self.batches_prefill:
            return 0
        if self.solo_prefill_min_tokens is None:
            # row-invariant: a prompt is verified by prompt rows either way, alone buys nothing
            batched = self.uses_prefix_cache or self.verifier == ROW_INVARIANT
            return None if batched else DEFAULT_SOLO_PREFILL_MIN_TOKENS
        return self.solo_prefill_min_tokens or None

    def verifies_prompt(self, num_prompt_tokens: int, wants_prompt_logprobs: bool) -> bool:
        """Whether prompt rows verify a deterministic prompt (its KV and o_0) after its prefill.
        Fixed-shape: exactly the prompts that do not prefill alone. Row-invariant: every prompt
        whatever its prefill batch (a prefill's KV would depend on the prefill path), except one
        asking for prompt logprobs, which come only from its prefill."""
        if self.verifier == ROW_INVARIANT:
            return not wants_prompt_logprobs
        return not self.prefills_alone(num_prompt_tokens, wants_prompt_logprobs)

    def prefills_alone(self, num_prompt_tokens: int, wants_prompt_logprobs: bool) -> bool:
        """Whether a deterministic request prefills in a batch of its own instead of being
        verified by prompt passes; a function of the request alone, so each request always takes
        the same (deterministic) path. Prompt logprobs come only from a prefill."""
        threshold = self.solo_prefill_threshold
        return wants_prompt_logprobs or (threshold is not None and num_prompt_tokens >= threshold)

    @property
    def batches_prefill(self) -> bool:
        """Whether deterministic prompts prefill among normal ones (`--llm42-batched-prefill`).
        By default only under the fixed-shape verifier, whose prompt passes would otherwise
        meet one prompt a prefill batch. Under the row-invariant verifier deterministic prompts
        share batches of their own, whose extend inline prompt rows skip: each prompt is
        computed once, not by the extend and then by its rows (H100, 8B shape, ShareGPT at
        10 %: 0.960x and 0.900x nondet in two calls, against 0.882-0.896x batched, and 12-14
        passes instead of 95-97, benchmarks/results/h100-2026-12-07-v6-defaults)."""
        if self.batched_prefill is not None:
            return self.batched_prefill
        return self.verifier != ROW_INVARIANT or self.solo_prefill_min_tokens is not None

    @property
    def verify_wait_steps(self) -> int:
        """Decode steps a ready job may wait for a pass to fill up (see planner.select_jobs).
        0 under the row-invariant verifier, chosen when its passes computed only their real
        rows; they now run R-row forwards (one 64-row window in 256 at 10 % online on the H100),
        so a wait may fill them: unmeasured yet (docs/tuning.md, online serving)."""
        if self.max_verify_wait is not None:
            return self.max_verify_wait
        return 0 if self.verifier == ROW_INVARIANT else self.window_size // 4

    @property
    def uses_prefix_cache(self) -> bool:
        """Whether deterministic requests share verified prompt rows (`--llm42-prefix-cache`).
        By default only under the row-invariant verifier, whose prompt rows do not depend on W,
        B or the prefill path, and only where SGLang's radix cache is on."""
        if self.prefix_cache is not None:
            return self.prefix_cache
        return self.verifier == ROW_INVARIANT and self.radix_cache

    @property
    def uses_inline_verify(self) -> bool:
        """Whether decode steps verify deterministic rows as they are made
        (`--llm42-inline-verify`): by default wherever the verifier is row-invariant, since an
        inline row is the same forward as a pass row and changes no output."""
        if self.inline_verify is not None:
            return self.inline_verify
        return self.verifier == ROW_INVARIANT

    @property
    def finish_wait_steps(self) -> int:
        """Decode steps a finishing request's last window may wait for a pass shared with other
        rows (see verify_round.due_jobs). By default W // 4: at a small deterministic share most
        passes are otherwise forced by finishing requests and run mostly padded (H100, 8B shape,
        ShareGPT at 10 %: 181 passes at once, 116 with a wait of 15 steps, 0.878x -> 0.907x
        plain SGLang in one call). Capped at the max verify wait, past which a job is due
        anyway, so a longer verify wait (the online preset's 48) does not delay finishes more."""
        if self.max_finish_wait is not None:
            return self.max_finish_wait
        return min(self.window_size // 4, self.verify_wait_steps)

    def validate(self, context_length: int | None = None) -> None:
        """Raise ``ValueError`` saying which flag is wrong, what was found and what to pass."""
        if self.window_size < 1:
            raise ValueError(f"--llm42-window-size must be >= 1, got {self.window_size}")
        if context_length is not None and self.window_size > context_length:
            raise ValueError(
                f"--llm42-window-size must be <= the model context length, got "
                f"{self.window_size} but the context length found is {context_length}; "
                f"pass --llm42-window-size {min(64, context_length)} or smaller"
            )
        if self.verify_batch_size < 1:
            raise ValueError(
                f"--llm42-verify-batch-size must be >= 1, got {self.verify_batch_size}"
            )
        for flag, wait in (("--llm42-max-verify-wait", self.max_verify_wait),
                           ("--llm42-max-finish-wait", self.max_finish_wait)):
            if wait is not None and not 0 <= wait < self.window_size:
                raise ValueError(
                    f"{flag} must be in [0, window size), got {wait} with "
                    f"--llm42-window-size {self.window_size}"
                )
        if not (math.isfinite(self.inline_pad_ratio) and self.inline_pad_ratio >= 0):
            raise ValueError(f"--llm42-inline-pad-ratio must be a number >= 0, got "
                             f"{self.inline_pad_ratio}")
        if self.max_passes_per_step < 0:
            raise ValueError(
                f"--llm42-max-passes-per-step must be >= 0 (0: no cap), got "
                f"{self.max_passes_per_step}"
            )
        if self.solo_prefill_min_tokens is not None:
            if self.solo_prefill_min_tokens < 0:
                raise ValueError(
                    f"--llm42-solo-prefill-min-tokens must be >= 0 (0: never alone), got "
                    f"{self.solo_prefill_min_tokens}"
                )
            if self.batched_prefill is False:
                raise ValueError(
                    "--llm42-solo-prefill-min-tokens chooses between solo and batched "
                    "prefill: drop --no-llm42-batched-prefill (which prefills every prompt alone)"
                )
        if (self.uses_prefix_cache and not self.batches_prefill
                and self.verifier == FIXED_SHAPE):
            raise ValueError(
                "--llm42-prefix-cache shares prompt KV written by prompt passes: drop "
                "--no-llm42-batched-prefill"
            )
        if self.verifier not in VERIFIERS:
            raise ValueError(f"--llm42-verifier must be one of {', '.join(VERIFIERS)}, got "
                             f"{self.verifier!r}")
        if self.max_pass_rows_per_step is not None:
            self._validate_row_cap()
        if self.inline_verify and self.verifier == FIXED_SHAPE:
            raise ValueError(
                f"--llm42-inline-verify needs --llm42-verifier {ROW_INVARIANT}, got "
                f"--llm42-verifier {self.verifier}: only a row-invariant row gives the bits of "
                "its pass in a decode step")
        if not 0.0 <= self.inject_mismatch_rate <= 1.0:  # also rejects NaN
            raise ValueError(
                f"--llm42-inject-mismatch-rate must be in [0, 1], got {self.inject_mismatch_rate}"
            )

    def _validate_row_cap(self) -> None:
        """--llm42-max-pass-rows-per-step: >= 1, and only with the row-invariant verifier.

        Under fixed-shape verification a cap would not change outputs either (a row's bits do
        not depend on the pass it shares, and delaying a job only delays its decision, as
        --llm42-max-passes-per-step does), but it would not bound anything useful: a fixed-shape
        pass costs B x W rows however many are real, so a cap below B only adds padded passes,
        and a cap of k x B rows is --llm42-max-passes-per-step k. Refused there, with a pointer
        to that flag. A row-invariant pass computes only its real rows, so rows are its cost."""
        if self.max_pass_rows_per_step < 1:
            raise ValueError(
                f"--llm42-max-pass-rows-per-step must be >= 1 (leave it out for no cap), got "
                f"{self.max_pass_rows_per_step}"
            )
        if self.verifier == FIXED_SHAPE:
            raise ValueError(
                f"--llm42-max-pass-rows-per-step needs --llm42-verifier {ROW_INVARIANT}, got "
                f"--llm42-verifier {self.verifier}: a {self.verifier} pass costs B x W rows "
                "however many are real; cap its passes with --llm42-max-passes-per-step instead"
            )


def setting_fields() -> list[Field]:
    """The fields a `--llm42-*` flag sets, in declaration order (the order of `--help`)."""
    return [f for f in fields(Llm42Config) if f.metadata["flag"] is not None]


# What POST /llm42_benchmark_mode may switch on a running server (--llm42-benchmark-modes).
# max_verify_wait, overlap_verify and max_finish_wait change only when a row is verified, and
# inline_pad_ratio and inline_prefill only which forward verifies it, so a defaults survey runs
# them on one server start too. batched_prefill decides a prompt's prefill batch when it is first
# scheduled (in-flight requests keep theirs); it changes outputs under the fixed-shape verifier
# only.
BENCHMARK_MODE_FIELDS = ("skip_compare", "inject_mismatch_rate", "window_size",
                         "verify_batch_size", "max_verify_wait", "overlap_verify",
                         "max_finish_wait", "inline_pad_ratio", "inline_prefill",
                         "batched_prefill", "defer_verify_on_prefill", "fold_passes")


class ModeSwitchBusy(RuntimeError):
    """A window switch asked for while deterministic requests are in flight (HTTP 409): each
    request keeps the W it started with, and a verification pass needs one W for all its rows."""


# Fields whose null means "the flag's default" (which may follow the verifier or W).
NULLABLE_MODE_FIELDS = ("batched_prefill", "max_finish_wait", "max_verify_wait")
_OR_NULL = {name: " or null" for name in NULLABLE_MODE_FIELDS}


def parse_benchmark_mode(body) -> dict:
    """A request body of POST /llm42_benchmark_mode, checked field by field: ``ValueError``
    names the field. Every field is optional; an empty body changes nothing."""
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object with some of "
                         f"{', '.join(BENCHMARK_MODE_FIELDS)}")
    unknown = sorted(set(body) - set(BENCHMARK_MODE_FIELDS))
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r}: only "
                         f"{', '.join(BENCHMARK_MODE_FIELDS)} can be switched at runtime")
    # null: the flag's default (batched_prefill: the verifier's; the waits: W // 4, following W)
    mode = {name: None for name in NULLABLE_MODE_FIELDS if body.get(name, False) is None}
    body = {name: value for name, value in body.items() if name not in mode}
    for name in ("skip_compare", "overlap_verify", "inline_prefill", "batched_prefill",
                 "defer_verify_on_prefill", "fold_passes"):
        if name in body:
            if not isinstance(body[name], bool):
                raise ValueError(f"{name} must be true or false{_OR_NULL.get(name, '')}, "
                                 f"got {body[name]!r}")
            mode[name] = body[name]
    for name, upper, bounds in (("inject_mismatch_rate", 1.0, "in [0, 1]"),
                                ("inline_pad_ratio", math.inf, ">= 0")):
        if name in body:
            value = body[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    math.isfinite(value) and 0.0 <= value <= upper):
                raise ValueError(f"{name} must be a number {bounds}, got {value!r}")
            mode[name] = float(value)
    for name in ("window_size", "verify_batch_size"):
        if name in body:
            value = body[name]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
            mode[name] = value
    for name in ("max_finish_wait", "max_verify_wait"):
        if name in body:
            wait = body[name]
            if isinstance(wait, bool) or not isinstance(wait, int) or wait < 0:
                raise ValueError(f"{name} must be an integer >= 0 or null, got {wait!r}")
            mode[name] = wait
    return mode


def with_benchmark_mode(config: Llm42Config, mode: dict, context_length: int | None = None,
                        num_det_in_flight: int = 0) -> Llm42Config:
    """The config a running server switches to, validated like the flags; only a server
    started with --llm42-benchmark-modes may (skip_compare turns determinism off).

    A new window size or pass size B needs no deterministic request in flight
    (``ModeSwitchBusy``): they change deterministic outputs, and nothing else is sized by them
    (dummy rows reuse SGLang's padding slot, prefix-cache rows live in a namespace per W and B);
    the default max verify wait (W // 4) follows W. A (W, B) sweep then needs one server start."""
    if not config.benchmark_modes:
        raise PermissionError("benchmark modes are off: start the server with "
                              "--llm42-benchmark-modes to switch them at runtime")
    mode = parse_benchmark_mode(mode)
    window = mode.get("window_size", config.window_size)
    for name in ("window_size", "verify_batch_size"):
        old, new = getattr(config, name), mode.get(name, getattr(config, name))
        if new != old and num_det_in_flight:
            raise ModeSwitchBusy(
                f"{name} cannot switch from {old} to {new} while {num_det_in_flight} "
                "deterministic request(s) are in flight: a window or pass-size switch needs an "
                "idle server (no deterministic requests in flight); retry once they finished")
    switched = replace(config, **mode)
    try:
        switched.validate(context_length)
    except ValueError as exc:
        raise ValueError(f"window_size {window} refused: {exc}") if (
            window != config.window_size) else exc
    return switched
