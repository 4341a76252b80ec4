"""Compare / commit / rollback decision for one verified window: a pure function.

``decide()`` reads the state and the token lists and returns a frozen ``VerifyDecision``; the
adapter truncates its token list / KV to match, writes the corrected token, then applies it:

    decision = decide(state, output_ids, verifier_ids)
    del output_ids[decision.new_num_output_tokens :]  # then, on a rollback, the last entry
    state.apply(decision)                             # becomes decision.corrected_token_id

Row entry j (0 <= j < num_real) predicts output index kW + 1 + j:

    output index   kW+1 ... u-1 | u ........ m-1 | m | m+1 ... min(n, e) ... n-1
    role           re-run       | accepted       | x | rejected (incl. [e, n))
    re-run entries are never compared, a difference there counts as ``num_inconsistent``;
    x is the first mismatch: it is replaced by the verifier's token, which is then verified.
"""

from __future__ import annotations

from collections.abc import Sequence

from llm42.core.errors import InvariantError
from llm42.core.verify_decision import VerifyDecision
from llm42.core.window import DetRequestState

__all__ = ["PAD_TOKEN_ID", "VerifyDecision", "decide"]

PAD_TOKEN_ID = -1
"""Token id of padding entries in verification plans (never a real vocabulary id)."""


def decide(
    state: DetRequestState,
    output_ids: Sequence[int],
    verifier_ids: Sequence[int],
    *,
    skip_compare: bool = False,
    injected_index: int | None = None,
) -> VerifyDecision:
    """Compare window ``state.window_index`` with the verifier and decide what to commit.

    output_ids:     the request's full output list, length n (injected corruption included).
    verifier_ids:   [>= num_real] verifier token for output index kW + 1 + j at entry j; entries
                    from num_real on are padding and ignored.
    skip_compare:   accept every candidate (measures the cost of verification alone).
    injected_index: output index the ``MismatchInjector`` corrupted in this window, if any. It
                    counts as a mismatch even when the planted token happens to equal the
                    verifier's: only verifier tokens are ever committed, whether the adapter
                    corrupted its real list or a copy.
    """
    u, n = state.num_verified_tokens, state.num_output_tokens
    first_predicted = state.window_start + 1  # output index predicted by row entry 0
    end = state.compare_end
    if len(output_ids) != n:
        raise InvariantError(
            f"{state.rid}: state has {n} output tokens, list has {len(output_ids)}"
        )
    if end <= u:
        raise InvariantError(f"{state.rid}: nothing to verify (verified={u}, output={n})")
    if len(verifier_ids) < state.num_real_entries:
        raise InvariantError(
            f"{state.rid}: expected >= {state.num_real_entries} verifier tokens, "
            f"found {len(verifier_ids)}"
        )
    if injected_index is not None and not u <= injected_index < end:
        raise InvariantError(
            f"{state.rid}: injected index {injected_index} outside the compared range [{u}, {end})"
        )
    real_verifier_ids = verifier_ids[: state.num_real_entries]
    if any(token_id < 0 for token_id in real_verifier_ids):
        raise InvariantError(
            f"{state.rid}: padding id in real verifier entries {real_verifier_ids}"
        )

    # 1. Re-run entries before u: compare only to report verifier non-determinism.
    num_inconsistent = sum(
        1 for i in range(first_predicted, u) if verifier_ids[i - first_predicted] != output_ids[i]
    )
    # 2. First mismatch among the compared candidates [u, end); the injected one always is.
    num_compared = end - u
    mismatch_index = None
    if not skip_compare:
        mismatch_index = next(
            (
                i
                for i in range(u, end)
                if i == injected_index or verifier_ids[i - first_predicted] != output_ids[i]
            ),
            None,
        )
    if mismatch_index is None:
        return VerifyDecision(
            num_compared=num_compared,
            num_accepted=num_compared,
            num_rejected=0,
            corrected_token_id=None,
            new_num_verified=end,
            new_num_output_tokens=n,
            mismatch_index=None,
            num_inconsistent=num_inconsistent,
        )
    # 3. Rollback: keep [0, m), replace m by the verifier's token, drop (m, n).
    num_accepted = mismatch_index - u
    num_rejected = n - u - num_accepted
    new_num_verified = u + num_accepted + 1
    return VerifyDecision(
        num_compared=num_compared,
        num_accepted=num_accepted,
        num_rejected=num_rejected,
        corrected_token_id=verifier_ids[mismatch_index - first_predicted],
        new_num_verified=new_num_verified,
        new_num_output_tokens=new_num_verified,
        mismatch_index=mismatch_index,
        injected=injected_index == mismatch_index,
        num_inconsistent=num_inconsistent,
    )
