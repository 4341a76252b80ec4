"""Request states for the core unit tests: prompt length P, window W, u verified of n outputs."""

from __future__ import annotations

from llm42.core import DetRequestState

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
