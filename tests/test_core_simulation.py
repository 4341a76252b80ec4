"""Randomized decode-verify-rollback simulation: verified output always equals the reference.

A fake engine drives several requests through the core's verify rounds (``llm42.core.
verify_round``, the very functions the adapter applies): a "fast path" decodes candidates that
are sometimes wrong, a deterministic fake verifier replays the planned (B, W) passes, and each
decision is applied to the token list as the adapter applies it to SGLang's. The reference
sequence of a request is what a fully deterministic run produces; committed tokens must always
be a prefix of it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from llm42.core import (
    PAD_TOKEN_ID,
    DetRequestState,
    Llm42Config,
    Llm42Stats,
    MismatchInjector,
    VerifyPass,
    cap_jobs,
    decide_job,
    due_jobs,
    job_rows,
    num_job_rows,
    plan_round,
    settle,
    withhold_finish,
)

VOCAB = 17
EOS = 0
P = 5
PROMPT = [3, 1, 4, 1, 5]  # every request's prompt (the fake model ignores it)


def true_next_token(reference: list[int], prefix: list[int]) -> int:
    """The deterministic model: the reference on the reference path, a hash off it."""
    if len(prefix) < len(reference) and prefix == reference[: len(prefix)]:
        return reference[len(prefix)]
    return (sum((i + 3) * t for i, t in enumerate(prefix)) * 31 + len(prefix)) % VOCAB


@dataclass(eq=False)
class SimRequest:
    state: DetRequestState
    reference: list[int]
    max_tokens: int
    output_ids: list[int] = field(default_factory=list)
    is_done: bool = False

    def check_finish(self) -> None:
        """As the adapter's `update_finish_state_hook` after a new last token: EOS or max tokens
        finish the request, unless unverified candidates caused it (then it waits)."""
        if self.output_ids[-1] == EOS or len(self.output_ids) >= self.max_tokens:
            self.is_done = not withhold_finish(self.state, "finished")


def make_request(index: int, rng: random.Random, window_size: int,
                 verify_prompt: bool = False) -> SimRequest:
    length = rng.randint(1, 40)
    reference = [rng.randrange(1, VOCAB) for _ in range(length)]
    ends_with_eos = rng.random() < 0.5
    if ends_with_eos:
        reference[-1] = EOS
    max_tokens = length + rng.randint(0, 5) if ends_with_eos else length
    state = DetRequestState(rid=f"r{index}", window_size=window_size, num_prompt_tokens=P,
                            verify_prompt=verify_prompt)
    return SimRequest(state=state, reference=reference, max_tokens=max_tokens)


def fake_verifier(verify_pass: VerifyPass, requests: dict[str, SimRequest]) -> list[list[int]]:
    """[B][W] next-token predictions computed only from the plan and the committed prefix KV."""
    out = []
    for row in verify_pass.rows:
        if row.is_pad:
            out.append([PAD_TOKEN_ID] * verify_pass.window_size)
            continue
        request = requests[row.rid.split("/")[0]]
        if "/prompt" in row.rid:  # prompt rows: only the last real entry predicts (o_0)
            out.append([PAD_TOKEN_ID] * (row.num_real - 1)
                       + [true_next_token(request.reference, [])]
                       + [PAD_TOKEN_ID] * (verify_pass.window_size - row.num_real))
            continue
        prefix_ids = request.output_ids[: row.prefix_len - P]  # the KV [0, P + kW), committed
        assert prefix_ids == request.reference[: len(prefix_ids)], "prefix KV not committed"
        assert row.positions[0] == row.prefix_len, "row must start right after its prefix"
        inputs = list(row.input_ids[: row.num_real])
        out.append(
            [
                true_next_token(request.reference, prefix_ids + inputs[: j + 1])
                for j in range(row.num_real)
            ]
            + [PAD_TOKEN_ID] * (verify_pass.window_size - row.num_real)
        )
    return out


def simulate(
    seed: int,
    window_size: int,
    batch_size: int,
    num_requests: int,
    error_rate: float,
    inject_rate: float,
    max_wait: int,
    verify_prompt: bool = False,
    max_passes: int = 0,
    hold_rate: float = 0.0,
    max_rows: int | None = None,
):
    """verify_prompt: o_0 comes from a fast-path prefill (wrong at ``error_rate``) and is
    verified by prompt passes, which run before any window (as in the adapter). max_rows: the
    row budget of a step (--llm42-max-pass-rows-per-step, row-invariant verifier)."""
    rng = random.Random(seed)
    requests = {
        r.state.rid: r
        for r in (make_request(i, rng, window_size, verify_prompt) for i in range(num_requests))
    }
    config = Llm42Config(window_size=window_size, verify_batch_size=batch_size,
                         max_verify_wait=max_wait, max_passes_per_step=max_passes,
                         max_pass_rows_per_step=max_rows,
                         verifier="fixed-shape" if max_rows is None else "row-invariant")
    injector = MismatchInjector(rate=inject_rate, seed=seed)
    stats = Llm42Stats()
    for request in requests.values():  # solo prefill: o_0 right and verified; else a candidate
        token_id = true_next_token(request.reference, [])
        if verify_prompt and rng.random() < error_rate:
            token_id = (token_id + rng.randrange(1, VOCAB)) % VOCAB
        request.output_ids.append(token_id)
        request.state.on_first_token()
        request.check_finish()
    prefills = random.Random(seed + 1)  # steps that would also prefill hold their passes back
    for step in range(10_000):
        active = [r for r in requests.values() if not r.is_done]
        if not active:
            break
        # 1. Which ready windows and prompts run now; the others wait (decoding on) up to
        #    max_wait steps for their pass to fill.
        waiting = [r for r in active if r.state.is_ready]
        chosen = due_jobs([r.state for r in waiting], step, config,
                          hold=prefills.random() < hold_rate)
        chosen, _ = cap_jobs([r.state for r in waiting], chosen, step, config)
        ready = [waiting[i] for i in chosen]
        rows = sum(num_job_rows(r.state) for r in ready)
        assert max_rows is None or rows <= max_rows or len(ready) == 1, f"{rows} rows"
        # 2. Fast path: every active request not being verified and not finishing decodes.
        for request in active:
            if request in ready or request.state.is_finishing:
                continue
            token_id = true_next_token(request.reference, request.output_ids)
            if rng.random() < error_rate:
                token_id = (token_id + rng.randrange(1, VOCAB)) % VOCAB
            request.output_ids.append(token_id)
            request.state.append_candidates()
            request.check_finish()
        # 3. The round's passes; each job is decided by its last row, applied like the adapter:
        #    truncate, write the corrected token, then settle the state and the finish.
        jobs = [job_rows(r.state, PROMPT, r.output_ids) for r in ready]
        for plan in plan_round(jobs, batch_size, window_size):
            stats.observe_pass(plan.vpass.num_real_rows, plan.vpass.num_pad_rows, 0.0)
            verifier_rows = fake_verifier(plan.vpass, requests)
            for i, (owner, decides) in enumerate(zip(plan.owners, plan.decides, strict=True)):
                if not decides:
                    continue  # a leading prompt row
                request, row = ready[owner], plan.vpass.rows[i]
                decision = decide_job(request.state, request.output_ids,
                                      verifier_rows[i][row.sample_from :], injector, VOCAB)
                del request.output_ids[decision.new_num_output_tokens :]
                if decision.is_rollback:
                    request.output_ids[-1] = decision.corrected_token_id
                settled = settle(request.state, decision)
                stats.observe_decision(decision)
                committed = request.output_ids[: request.state.num_verified_tokens]
                assert committed == request.reference[: len(committed)], (
                    f"{request.state.rid}: committed {committed} is not a prefix of {request.reference}"
                )
                if settled.finish is not None:
                    request.is_done = True
                elif settled.recheck_finish:
                    request.check_finish()
    else:
        raise AssertionError("simulation did not terminate")
    return requests, stats


SIMULATIONS = st.fixed_dictionaries({
    "seed": st.integers(0, 2**32 - 1),
    "window_size": st.integers(1, 8),
    "batch_size": st.integers(1, 4),
    "num_requests": st.integers(1, 5),
    "error_rate": st.sampled_from([0.0, 0.05, 0.3, 0.9]),
    "inject_rate": st.sampled_from([0.0, 0.3, 1.0]),
    "max_wait": st.integers(0, 7),
    "verify_prompt": st.booleans(),
    "max_passes": st.integers(0, 2),
    "hold_rate": st.sampled_from([0.0, 0.5, 1.0]),
    "max_rows": st.sampled_from([None, 1, 2, 5]),
})


@settings(max_examples=150, deadline=None)
@given(params=SIMULATIONS)
def test_verified_output_equals_reference(params) -> None:
    requests, stats = simulate(**params)
    verify_prompt, error_rate, inject_rate = (
        params["verify_prompt"], params["error_rate"], params["inject_rate"])
    for rid, request in requests.items():
        assert request.output_ids == request.reference, (
            f"{rid}: final {request.output_ids} != reference {request.reference}"
        )
        state = request.state
        assert state.num_verified_tokens == state.num_output_tokens == len(request.reference)
    snapshot = stats.snapshot()
    # o_0 is committed by the prefill, or by the prompt pass with verify_prompt
    total_committed = sum(len(r.reference) - (0 if verify_prompt else 1) for r in requests.values())
    assert snapshot["verified_tokens"] == total_committed, "each committed token counted once"
    assert snapshot["rollbacks"] == sum(r.state.num_rollbacks for r in requests.values())
    assert snapshot["tokens_rolled_back"] == sum(
        r.state.num_tokens_rolled_back for r in requests.values()
    )
    assert snapshot["inconsistent_tokens"] == 0, "the fake verifier is deterministic"
    if error_rate == 0.0 and inject_rate == 0.0:
        assert snapshot["rollbacks"] == 0, "a correct fast path never rolls back"


def test_simulation_exercises_rollbacks_and_injection() -> None:
    """Guard against a vacuous simulation: the harsh settings do roll back and inject."""
    _, stats = simulate(
        seed=1,
        window_size=4,
        batch_size=2,
        num_requests=4,
        error_rate=0.3,
        inject_rate=0.5,
        max_wait=2,
    )
    snapshot = stats.snapshot()
    assert snapshot["rollbacks"] > 0 and snapshot["injected_mismatches"] > 0, snapshot
    assert snapshot["padded_rows"] > 0 and snapshot["recompute_pct"] > 0, snapshot
    # prompt passes: a wrong fast-path o_0 is rolled back before its first window
    requests, stats = simulate(seed=2, window_size=4, batch_size=2, num_requests=5,
                               error_rate=0.9, inject_rate=0.0, max_wait=1, verify_prompt=True)
    assert stats.snapshot()["rollbacks"] >= len(requests) // 2
    assert all(r.output_ids == r.reference for r in requests.values())


def test_waiting_for_full_passes_saves_padding() -> None:
    """With waits allowed, the same work runs in fewer, fuller passes and the same tokens."""
    common = dict(seed=3, window_size=4, batch_size=4, num_requests=5, error_rate=0.1,
                  inject_rate=0.0)
    eager_requests, eager = simulate(max_wait=0, **common)
    patient_requests, patient = simulate(max_wait=3, **common)
    assert patient.snapshot()["padded_rows"] < eager.snapshot()["padded_rows"]
    for rid, request in eager_requests.items():
        assert patient_requests[rid].output_ids == request.output_ids == request.reference


def test_a_row_budget_spreads_the_passes_and_keeps_the_tokens() -> None:
    """One row per step: the same tokens, in more passes (one real row each)."""
    common = dict(seed=4, window_size=4, batch_size=4, num_requests=5, error_rate=0.1,
                  inject_rate=0.0, max_wait=0)
    free_requests, free = simulate(**common)
    capped_requests, capped = simulate(max_rows=1, **common)
    free_snap, capped_snap = free.snapshot(), capped.snapshot()
    assert capped_snap["verify_passes"] > free_snap["verify_passes"]
    assert capped_snap["verify_passes"] == capped_snap["verify_rows"], "one row per pass"
    for rid, request in free_requests.items():
        assert capped_requests[rid].output_ids == request.output_ids == request.reference
