"""n > 1 (native `n`, OpenAI `n`): sample i of a request draws with its own seed.

SGLang expands a request with n > 1 in `TokenizerManager._handle_batch_request`: per prompt, one
prompt-caching request (max_new_tokens 0), then n children, identical but for their rid
(`<rid>_<uuid>`), sharing one SamplingParams. With the same seed all n would draw the same noise
and be the same sample. llm42 gives sample i the seed

    seed_i = (seed + i) wrapped into [-2**63, 2**63)      seed: the request's, or 42 if none

(so sample 0 is the request sent with n = 1). It is written into the child's own copy of its
SamplingParams before it is sent to the scheduler, where the fast path (`sampling_info_hook`)
and the verifier (`verifier.seed_of`) read `sampling_seed` as for any request: nothing else
changes. Deterministic requests and normal requests with a seed get it (an unseeded normal
request's samples already draw random noise each).

The index is the number of siblings already sent: the n children of a prompt are sent back to
back with no await in between (nothing can finish or be removed meanwhile), and the
prompt-caching request has finished, and left the sibling set, before the first child is sent.

    BEFORE TokenizerManager._send_one_request: send_one_request_hook (patches/)
"""

from __future__ import annotations

import copy

from llm42.sglang.request_fields import is_deterministic_params
from llm42.sglang.verifier import DEFAULT_SEED

_INT64 = 1 << 64


def sample_seed(seed: int | None, index: int) -> int:
    """The seed of sample `index` of a request whose seed is `seed` (None: SGLang's 42)."""
    value = (DEFAULT_SEED if seed is None else int(seed)) + index
    return (value + (1 << 63)) % _INT64 - (1 << 63)


def send_one_request_hook(manager, tokenized_obj, *args, **kwargs):
    sp = getattr(tokenized_obj, "sampling_params", None)
    if (sp is None or (getattr(sp, "n", 1) or 1) <= 1 or sp.max_new_tokens == 0
            or not getattr(manager.server_args, "enable_llm42", False)):
        return None  # not a sample (the prompt-caching request has max_new_tokens 0)
    logical = manager.child_rid_to_logical_rid.get(tokenized_obj.rid)
    if logical is None or not (is_deterministic_params(sp) or sp.sampling_seed is not None):
        return None
    siblings = manager.logical_rid_to_child_rids.get(logical, ())
    index = sum(1 for rid in siblings if rid != tokenized_obj.rid
                and getattr(manager.rid_to_state.get(rid), "dispatched", False))
    own = copy.copy(sp)  # the children share one SamplingParams
    own.sampling_seed = sample_seed(sp.sampling_seed, index)
    tokenized_obj.sampling_params = own
    return None
