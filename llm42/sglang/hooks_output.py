"""What leaves the scheduler for a deterministic request: only verified tokens, and nothing at
all (no fast-path logprob either) while none is verified."""

from __future__ import annotations

from llm42.core.window import DetRequestState
from llm42.sglang import inline_verify, kv_rollback
from llm42.sglang.keys import META_KEYS
from llm42.sglang.request_state import det_state, of


def output_ids_through_stop_getter(original_fget, req):
    """Unfinished deterministic requests publish only their verified tokens.

    After a retraction restart (`hooks_lifecycle.reset_for_retract_hook`) the request
    regenerates tokens it already streamed; they come back identical, so until it catches up the
    published list (the tokens streamed before the restart) stands for them and SGLang's
    monotonic stream offsets never see the output shrink."""
    ids = original_fget(req)
    fields = of(req)
    if fields is None or fields.det is None:
        return ids
    if not req.finished():
        ids = ids[: fields.det.num_verified_tokens]
    published = fields.published
    return published if published is not None and len(published) > len(ids) else ids


def stream_accept_hook(original, accumulator, *, req):
    """AROUND the output streamer's per-request accept: an unfinished deterministic request
    streams nothing while none of its tokens is verified.

    SGLang sends logprobs up to `max(len(output), 1)`: with no verified token it would send o_0's
    fast-path logprob and move its offset past it. That happens when the prompt pass is still
    pending (`--llm42-batched-prefill`), and when the overlap loop streams the batch a request
    was just retracted from (its output restarts from the prompt). A request aborted before
    anything was verified finishes with no output and no logprobs."""
    state = det_state(req)
    if state is not None:
        inline_verify.write_logprobs(req)  # tokens verified on arrival: the verifier's logprobs
        req.customized_info = counter_views(state) if req.finished() else None
    if state is not None and state.num_verified_tokens == 0:
        if not req.finished():
            return None
        # Aborted with nothing verified: SGLang appended the last fast-path token's logprob
        # after the abort cut the output; it would go out with an empty output.
        kv_rollback.truncate_logprobs(req, len(req.output_ids))
    return original(accumulator, req=req)


def counter_views(state: DetRequestState) -> dict:
    """A deterministic request's counters for SGLang's customized_info channel, attached only to
    its finishing output.

    SGLang ships customized_info per token, and once any request of a step carries it, every
    other request of that step gets a list of Nones, which the tokenizer process appends to that
    request's meta_info for its whole life. Attached at every step, a normal request beside a
    deterministic one accumulated one None per key per token, and each of its streamed chunks
    was scanned whole (`endpoints._collapse`): quadratic in its output, in the process that
    serves HTTP. Attached at the finish, a step carries it only when a deterministic request
    ends, and the counters are final."""
    return {key: _CounterView(state, attr) for key, attr in META_KEYS.items()}


class _CounterView:
    """Per-token view of one per-request counter: SGLang slices customized_info by token."""

    __slots__ = ("state", "name")

    def __init__(self, state: DetRequestState, name: str):
        self.state, self.name = state, name

    def __getitem__(self, index):
        value = getattr(self.state, self.name)
        if isinstance(index, slice):
            return [value] * len(range(*index.indices(1 << 30)))
        return value

    def __len__(self):
        return 1 << 30
