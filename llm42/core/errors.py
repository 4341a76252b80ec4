"""Internal-invariant errors of the llm42 core.

A broken invariant means the adapter fed the core an impossible sequence of events (a bug), never
bad user input; user input is rejected with ``ValueError`` in ``config.py`` instead. The class
derives from ``AssertionError`` so it reads as one, but it is raised explicitly and therefore
survives ``python -O``.

    if state.num_verified_tokens > state.num_output_tokens:
        raise InvariantError(f"{state.rid}: verified {u} > output {n}")
"""

from __future__ import annotations


class InvariantError(AssertionError):
    """An internal llm42 invariant does not hold (a bug in the caller or in the core)."""
