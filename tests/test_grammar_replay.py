"""`grammar_replay` on a real xgrammar matcher inside SGLang's `XGrammarGrammar` (no server).

The verifier's mask for output token k must be the matcher's bitmask after the first k tokens,
however far the matcher had got, and every rewind must leave the matcher where a fresh one fed
the kept tokens would be. Each check compares against such a fresh matcher.
"""

from __future__ import annotations

import random
import string

import pytest
import torch

# SGLang before xgrammar: xgrammar imports transformers, which then refuses SGLang's image
# processors on a host without torchvision.
backend = pytest.importorskip("sglang.srt.constrained.xgrammar_backend")
XGrammarGrammar = backend.XGrammarGrammar
import xgrammar  # noqa: E402

from llm42.compat import grammar_bitmask  # noqa: E402
from llm42.sglang import grammar_replay  # noqa: E402

VOCAB = list(string.ascii_lowercase + string.digits + ",{}\":[] ") + ["</s>"]
EOS = len(VOCAB) - 1
REGEX = r"[a-z]{3}(,[0-9]{2}){3}"


@pytest.fixture(scope="module")
def compiled():
    info = xgrammar.TokenizerInfo(VOCAB, stop_token_ids=[EOS])
    return xgrammar.GrammarCompiler(info).compile_regex(REGEX)


def _grammar(compiled, tokens=()) -> XGrammarGrammar:
    grammar = XGrammarGrammar(xgrammar.GrammarMatcher(compiled), len(VOCAB), compiled, None)
    for t in tokens:
        grammar.accept_token(t)
    return grammar


def _mask(grammar) -> torch.Tensor:
    mask = xgrammar.allocate_token_bitmask(1, len(VOCAB))
    if not grammar.is_terminated():
        grammar.fill_vocab_mask(mask, 0)
    return mask[0]


def _sample_text(seed: int) -> list[int]:
    """A random string of the grammar, then EOS: its token ids."""
    rng = random.Random(seed)
    text = "".join(rng.choice(string.ascii_lowercase) for _ in range(3))
    text += "".join("," + "".join(rng.choice(string.digits) for _ in range(2)) for _ in range(3))
    return [VOCAB.index(c) for c in text] + [EOS]


def _assert_like_fresh(compiled, grammar, tokens, what):
    fresh = _grammar(compiled, tokens)
    assert grammar.accepted_tokens == list(tokens), what
    assert torch.equal(_mask(grammar), _mask(fresh)), what
    assert grammar.is_terminated() == fresh.is_terminated(), what


class _Req:
    rid = "r"
    to_finish = None

    def __init__(self, grammar):
        self.grammar = grammar


@pytest.mark.parametrize("seed", range(4))
def test_rewind_and_replace_leave_the_matcher_as_a_fresh_one(compiled, seed):
    tokens = _sample_text(seed)  # ends in EOS: the matcher terminates on it
    rng = random.Random(seed)
    for kept in range(len(tokens) + 1):
        req = _Req(_grammar(compiled, tokens))
        grammar_replay.rewind(req, kept)
        _assert_like_fresh(compiled, req.grammar, tokens[:kept], f"rewind to {kept}")
    # a correction at index i: the matcher has o_0 .. o_{i-1} and the new token
    other = _sample_text(seed + 100)
    for i in range(len(tokens) - 1):
        req = _Req(_grammar(compiled, tokens))
        allowed = [t for t in range(len(VOCAB)) if _allows(compiled, tokens[:i], t)]
        new = rng.choice(allowed)
        grammar_replay.replace_last(req, i, new)
        _assert_like_fresh(compiled, req.grammar, tokens[:i] + [new], f"replace {i}")
        assert req.to_finish is None
    # a token the matcher accepted past the output (one past a withheld finish) is forgotten
    req = _Req(_grammar(compiled, other[:5]))
    grammar_replay.rewind(req, 4)
    _assert_like_fresh(compiled, req.grammar, other[:4], "token past the output")


def _allows(compiled, prefix, token) -> bool:
    mask = _mask(_grammar(compiled, prefix))
    return bool((int(mask[token // 32]) >> (token % 32)) & 1)


def test_a_rejected_correction_aborts_the_request_not_the_scheduler(compiled):
    tokens = _sample_text(0)
    req = _Req(_grammar(compiled, tokens))
    grammar_replay.replace_last(req, 0, VOCAB.index("7"))  # the regex starts with a letter
    assert req.to_finish is not None


@pytest.mark.parametrize("seed", range(3))
def test_masks_are_the_fast_paths_and_the_matcher_ends_where_it_began(compiled, seed,
                                                                       monkeypatch):
    # the CPU stand-ins the server installs (`llm42.compat.grammar_bitmask`)
    monkeypatch.setattr(XGrammarGrammar, "apply_vocab_mask", grammar_bitmask.apply_vocab_mask)
    monkeypatch.setattr(backend, "_allocate_token_bitmask", grammar_bitmask.allocate_token_bitmask)
    tokens = _sample_text(seed)
    n = len(tokens)
    # two requests in one pass, rows interleaved, a grammar-free request among them; output
    # indices up to and past the terminating EOS (rows there are not masked, as on the fast path)
    a, b, free = _Req(_grammar(compiled, tokens)), _Req(_grammar(compiled, tokens[:6])), _Req(None)
    rows = [(a, k) for k in range(n - 5, n + 2)] + [(b, k) for k in (2, 3, 4, 5, 6)]
    rows += [(free, 3)]
    random.Random(seed).shuffle(rows)
    logits = torch.randn(len(rows), len(VOCAB), generator=torch.Generator().manual_seed(seed))
    masked = logits.clone()
    grammar_replay.apply_masks(masked, [r for r, _ in rows], [k for _, k in rows])
    for i, (req, k) in enumerate(rows):
        expect = logits[i].clone()
        full = tokens if req is a else tokens[:6]
        if req is not free and k <= len(full):
            fresh = _grammar(compiled, full[:k])
            if not fresh.is_terminated():
                grammar_bitmask.apply_vocab_mask(None, expect.view(1, -1),
                                                 _mask(fresh).view(1, -1))
        assert torch.equal(masked[i], expect), (i, k)
    assert torch.isinf(masked).any(), "some row was masked"
    _assert_like_fresh(compiled, a.grammar, tokens, "after the masks")
    _assert_like_fresh(compiled, b.grammar, tokens[:6], "after the masks")
