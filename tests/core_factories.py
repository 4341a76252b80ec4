"""Request states and decisions for the core unit tests: prompt length P, window W, u verified of
n outputs."""

from __future__ import annotations

from llm42.core import DetRequestState, VerifyDecision

P = 10  # prompt length used throughout


def make_state(window_size: int, u: int, n: int, *, finishing: bool = False) -> DetRequestState:
    return DetRequestState(
        rid="r",
        window_size=window_size,
        num_prompt_tokens=P,
        num_verified_tokens=u,
        num_output_tokens=n,
        deferred_finish="finish" if finishing else None,
    )


def accept(compared: int, verified: int, outputs: int, **kw) -> VerifyDecision:
    """Every compared candidate accepted: `verified` of `outputs` tokens verified after it."""
    return VerifyDecision(num_compared=compared, num_accepted=compared, num_rejected=0,
                          corrected_token_id=None, new_num_verified=verified,
                          new_num_output_tokens=outputs, mismatch_index=None, **kw)


def rollback(compared: int, accepted: int, rejected: int, corrected: int, verified: int,
             mismatch: int, **kw) -> VerifyDecision:
    """A mismatch at output index `mismatch`: the verifier's `corrected` token ends the output."""
    return VerifyDecision(num_compared=compared, num_accepted=accepted, num_rejected=rejected,
                          corrected_token_id=corrected, new_num_verified=verified,
                          new_num_output_tokens=verified, mismatch_index=mismatch, **kw)
