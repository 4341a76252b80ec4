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


def test_several_references_each_lead_and_a_proof_keeps_its_own_outputs(tmp_path, monkeypatch):
    """`--reference` twice (a non-speculative server, then an NGRAM one): every trial is compared
    with both, the first leading; the proof.json written keeps this server's own outputs (a
    later proof compares with them, not with its references), and a speculative server's
    steps give the accept length."""
    answer = {"ids": [7, 8, 9]}

    async def run_trial(url, reqs, level, rng, args, send_flag):
        meta = {"spec_verify_ct": 2, "completion_tokens": 3}
        return [(list(answer["ids"]), [-0.5, -0.25, -1.0], meta) for _ in reqs]

    monkeypatch.setattr(determinism_proof, "run_trial", run_trial)
    paths = []
    for name, ids in (("none", [7, 8, 9]), ("ngram", [7, 8, 6])):
        answer["ids"] = ids
        run = determinism_proof.run_mode("http://x", "llm42", _args(tmp_path))
        assert run["outputs"][0][0] == ids
        (tmp_path / name).mkdir()
        paths.append(tmp_path / name / "proof.json")
        paths[-1].write_text(json.dumps({"runs": [run]}))
    answer["ids"] = [7, 8, 9]
    run = determinism_proof.run_mode("http://x", "llm42", _args(tmp_path, paths))
    assert not run["expectation_holds"], "the second reference differs from the first"
    [req] = [r for r in run["requests"] if r["label"] == "p0-greedy"]
    assert [(d["trial"], d["first_divergence"]) for d in req["per_repetition"]] == [
        ("reference-ngram", 2), ("r0-bg0", None), ("r0-bg16", None)]
    assert run["outputs"][0][0] == [7, 8, 9]
    assert req["spec_accept_length"] == run["spec_accept_length"] == 1.5
    assert "1.5 tokens per step" in determinism_proof.markdown(
        {"timestamp": "t", "url": "u", "model": "m", "gpu": "g", "git_commit": "c",
         "server_args": "", "num_requests": 1, "num_trials": 2, "background_levels": [0, 16],
         "repeats": 1, "max_new_tokens": 3, "command": "", "runs": [run]})
    parsed = determinism_proof.build_parser().parse_args(
        ["--reference", str(paths[0]), "--reference", str(paths[1])])
    assert parsed.reference == [str(p) for p in paths]
