"""The proof's cross-server check (`--reference`): every llm42 trial must equal another proof's
outputs bitwise, e.g. a server at other W and B with the row-invariant verifier."""

from __future__ import annotations

import argparse
import json

import pytest

from benchmarks import determinism_proof


def _args(tmp_path, reference=None):
    return argparse.Namespace(num_prompts=1, seed=42, features="", lora_name=None,
                              background="0,16", repeats=1, reference=reference)


@pytest.fixture
def same_outputs(monkeypatch):
    """Every trial answers each request with the same (ids, logprobs)."""
    async def run_trial(url, reqs, level, rng, args, send_flag):
        return [([7, 8, 9], [-0.5, -0.25, -1.0], {}) for _ in reqs]
    monkeypatch.setattr(determinism_proof, "run_trial", run_trial)


def test_a_matching_reference_holds_and_a_one_bit_difference_fails(tmp_path, same_outputs):
    run = determinism_proof.run_mode("http://x", "llm42", _args(tmp_path))
    assert run["expectation_holds"]
    ref = tmp_path / "proof.json"
    ref.write_text(json.dumps({"runs": [run]}))
    assert determinism_proof.run_mode("http://x", "llm42", _args(tmp_path, ref))[
        "expectation_holds"]
    off = json.loads(ref.read_text())
    off["runs"][0]["outputs"] = [[ids, [lps[0], lps[1], -1.0000000000000002]]
                                 for ids, lps in off["runs"][0]["outputs"]]
    ref.write_text(json.dumps(off))
    run = determinism_proof.run_mode("http://x", "llm42", _args(tmp_path, ref))
    assert not run["expectation_holds"]
    assert all(r["first_divergence"] == 2 for r in run["requests"])
