"""Randomized decode-verify-rollback simulation: verified output always equals the reference.

A fake engine drives several requests through the core exactly as the adapter does: a "fast path"
decodes candidates that are sometimes wrong, a deterministic fake verifier replays the planned
(B, W) passes, and ``decide`` / ``apply`` commit or roll back. The reference sequence of a request
is what a fully deterministic run produces; committed tokens must always be a prefix of it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from llm42.core import (
    PAD_TOKEN_ID,
    DetRequestState,
    Llm42Stats,
    MismatchInjector,
    VerifyPass,
    build_prompt_rows,
    build_row,
    decide,
    num_job_rows,
    plan_passes,
    select_jobs,
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

    def refresh_finishing(self) -> None:
        """What the adapter does after each event: EOS or max tokens mark the request finishing."""
        is_finished = self.output_ids[-1] == EOS or len(self.output_ids) >= self.max_tokens
        if is_finished:
            self.state.mark_finishing()
        else:  # a rollback that dropped the finishing token cleared the flag with it
            assert not self.state.is_finishing, f"{self.state.rid}: finishing without a finish"
        self.is_done = is_finished and self.state.num_candidate_tokens == 0


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
    corrupt_in_place: bool = False,
    verify_prompt: bool = False,
    max_passes: int = 0,
    hold_rate: float = 0.0,
):
    """verify_prompt: o_0 comes from a fast-path prefill (wrong at ``error_rate``) and is
    verified by prompt passes, which run before any window (as in the adapter)."""
    rng = random.Random(seed)
    requests = {
        r.state.rid: r
        for r in (make_request(i, rng, window_size, verify_prompt) for i in range(num_requests))
    }
    injector = MismatchInjector(rate=inject_rate, seed=seed)
    stats = Llm42Stats()
    for request in requests.values():  # solo prefill: o_0 right and verified; else a candidate
        token_id = true_next_token(request.reference, [])
        if verify_prompt and rng.random() < error_rate:
            token_id = (token_id + rng.randrange(1, VOCAB)) % VOCAB
        request.output_ids.append(token_id)
        request.state.on_first_token()
        request.refresh_finishing()
    ready_since: dict[str, int] = {}
    prefills = random.Random(seed + 1)  # steps that would also prefill hold their passes back
    for step in range(10_000):
        active = [r for r in requests.values() if not r.is_done]
        if not active:
            break
        # 1. Fast path: every active, non-finishing request not being verified decodes one token;
        #    a ready window or prompt waits up to max_wait steps for the pass to fill
        #    (select_jobs).
        waiting = [r for r in active if r.state.is_ready]
        for r in waiting:
            ready_since.setdefault(r.state.rid, step)
        chosen = select_jobs([num_job_rows(r.state) for r in waiting],
                             [step - ready_since[r.state.rid] for r in waiting],
                             [r.state.is_finishing for r in waiting], batch_size, max_wait,
                             max_passes, hold=prefills.random() < hold_rate)
        ready = [waiting[i] for i in chosen]
        for r in ready:
            ready_since.pop(r.state.rid, None)
        for request in active:
            if request in ready or request.state.is_finishing:
                continue
            token_id = true_next_token(request.reference, request.output_ids)
            if rng.random() < error_rate:
                token_id = (token_id + rng.randrange(1, VOCAB)) % VOCAB
            request.output_ids.append(token_id)
            request.state.append_candidates()
            request.refresh_finishing()
        # 2. Plan and run the verify passes; inject into a copy of the compared candidates (as
        #    the adapter does) or, with corrupt_in_place, into the list the rows are built from.
        injected: dict[str, tuple[list[int], int | None]] = {}
        for request in ready:
            u, end = request.state.num_verified_tokens, request.state.compare_end
            corrupted, index = injector.corrupt(request.output_ids[u:end], VOCAB)
            candidate_ids = list(request.output_ids)
            candidate_ids[u:end] = corrupted
            if corrupt_in_place:
                request.output_ids[:] = candidate_ids
            injected[request.state.rid] = (candidate_ids, None if index is None else u + index)
        rows = [row for r in ready for row in (
            build_prompt_rows(r.state, PROMPT) if r.state.is_prompt_pending
            else [build_row(r.state, r.output_ids)])]
        for verify_pass in plan_passes(rows, batch_size, window_size):
            stats.observe_pass(verify_pass.num_real_rows, verify_pass.num_pad_rows, 0.0)
            verifier_rows = fake_verifier(verify_pass, requests)
            real_rows = verify_pass.rows[: verify_pass.num_real_rows]
            for row, verifier_ids in zip(real_rows, verifier_rows, strict=False):
                if row.sample_from == row.num_real:
                    continue  # a leading prompt row: decides nothing
                request = requests[row.rid.split("/")[0]]
                verifier_ids = verifier_ids[row.sample_from :]
                candidate_ids, injected_index = injected[request.state.rid]
                decision = decide(
                    request.state, candidate_ids, verifier_ids, injected_index=injected_index
                )
                # 3. Apply like the adapter: truncate, write the corrected token, then the state.
                del request.output_ids[decision.new_num_output_tokens :]
                if decision.is_rollback:
                    request.output_ids[-1] = decision.corrected_token_id
                request.state.apply(decision)
                stats.observe_decision(decision)
                committed = request.output_ids[: request.state.num_verified_tokens]
                assert committed == request.reference[: len(committed)], (
                    f"{request.state.rid}: committed {committed} is not a prefix of {request.reference}"
                )
                request.refresh_finishing()
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
    "corrupt_in_place": st.booleans(),
    "verify_prompt": st.booleans(),
    "max_passes": st.integers(0, 2),
    "hold_rate": st.sampled_from([0.0, 0.5, 1.0]),
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
