"""logit_bias, min_new_tokens and penalties on deterministic requests (CPU server).

The fast path gets them from SGLang's model runner; the verifier adds them itself
(`llm42.sglang.verify_logits`), penalties computed from the tokens before each position, and a
rollback rebuilds the fast path's penalizer state (`llm42.sglang.penalty_rewind`). Each kind is
compared bitwise: alone, repeated, among normal traffic that uses biases, min_new_tokens and
penalties of its own, in one batched call, and on the server that forces a mismatch in half of
all windows. The effect checks fail if the verifier
leaves a feature out: its tokens win every mismatch, so the output would lose the feature.
"""

from __future__ import annotations

import pytest

from helpers import PROMPTS, assert_bitwise_everywhere, generate, natural_rollbacks_are_rare

pytestmark = pytest.mark.server

PROMPTS3 = PROMPTS[:3]
BIASED = 1000  # a token the tiny model never picks by itself
MIN_NEW = 10


PENALTIES = {"frequency_penalty": 1.0, "presence_penalty": 0.5, "repetition_penalty": 1.3}


def _det(url, prompt, sampling, temperature=0.8, **kw):
    return generate(url, prompt, det=True, max_new_tokens=16, temperature=temperature, seed=5,
                    sampling=sampling, **kw)


def _likely_stops(url) -> list[int]:
    """Every token the unconstrained requests draw: as stop tokens they end each request at
    its first token, so only min_new_tokens keeps the output going."""
    return sorted({t for p in PROMPTS3 for t in _det(url, p, {})[0]})


def _normal_traffic(url, stops, n: int):
    mixes = [{"logit_bias": {str(BIASED): 8.0}}, {"min_new_tokens": 3, "stop_token_ids": stops},
             {"frequency_penalty": 0.5}, {"repetition_penalty": 1.2, "presence_penalty": -0.5},
             {}, {"top_k": 1, "logit_bias": {"7": -3.0}}]
    return [lambda i=i: generate(url, PROMPTS[i % len(PROMPTS)], det=None, temperature=0.9,
                                 max_new_tokens=8 + 3 * (i % 4), sampling=mixes[i % len(mixes)])
            for i in range(n)]


def _check_effect(kind, stops, outs, url):
    if kind == "logit_bias":
        for p, out in zip(PROMPTS3, outs):
            assert BIASED in out[0], f"{p!r}: the biased token never appears: {out[0]}"
            assert BIASED not in _det(url, p, {})[0], "the token needs the bias to appear"
    elif kind == "penalties":  # greedy: the tiny model repeats itself without them
        for p, out in zip(PROMPTS3, outs):
            plain = _det(url, p, {}, temperature=0)[0]
            repeats = len(out[0]) - len(set(out[0]))
            assert repeats < len(plain) - len(set(plain)), f"{p!r}: penalties had no effect"
    else:
        for p, out in zip(PROMPTS3, outs):
            assert len(out[0]) >= MIN_NEW, f"{p!r}: {len(out[0])} tokens < min_new_tokens"
            assert not set(out[0][:MIN_NEW]) & set(stops), f"{p!r}: stop token before the min"
            unbounded = _det(url, p, {"stop_token_ids": stops})[0]
            assert len(unbounded) < MIN_NEW, "without min_new_tokens a stop token ends it early"


@pytest.mark.parametrize("kind", ["logit_bias", "min_new_tokens", "penalties"])
def test_logit_features_bitwise_alone_loaded_batched_and_injected(llm42_server, inject_server,
                                                                  kind):
    url = llm42_server.url
    stops = _likely_stops(url)
    sampling = {"logit_bias": {"logit_bias": {str(BIASED): 8.0}},
                "min_new_tokens": {"min_new_tokens": MIN_NEW, "stop_token_ids": stops},
                "penalties": PENALTIES}[kind]
    t = 0.0 if kind == "penalties" else 0.8

    def send(u, p):
        return _det(u, p, sampling, t)

    refs, loaded = assert_bitwise_everywhere(
        url, send, PROMPTS3, normal_traffic=_normal_traffic(url, stops, 15),
        batched=lambda u: generate(u, PROMPTS3, det=True, max_new_tokens=16, temperature=t,
                                   seed=5, sampling=sampling),
        inject_url=inject_server.url)
    _check_effect(kind, stops, refs, url)
    # the verifier adds what the fast path added: no extra rollbacks from the feature
    natural_rollbacks_are_rare(loaded)
