"""The GPU determinism proof's request set covers every sampling kind llm42 serves."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.determinism_proof import FEATURES, _sample, det_body, det_requests


def test_proof_requests_cover_greedy_temperature_and_each_truncation():
    reqs = det_requests(num_prompts=4, seed=42)
    labels = [r.label for r in reqs]
    assert len(set(labels)) == len(labels) == 12
    bodies = [det_body(r, 16, send_flag=True)["sampling_params"] for r in reqs]
    for key in ("top_p", "top_k", "min_p"):
        sampled = [b for b in bodies if key in b]
        assert sampled and all("sampling_seed" in b and b["temperature"] > 0 for b in sampled)
    assert sum(b["temperature"] == 0 for b in bodies) == 4
    assert len({b.get("sampling_seed") for b in bodies if b["temperature"] > 0}) == 8


def test_feature_requests_carry_their_feature_and_a_seed_of_their_own():
    reqs = det_requests(num_prompts=2, seed=42, features=tuple(FEATURES), lora_name="proof")
    extra = [r for r in reqs if r.feature]
    assert len(reqs) == 2 * (3 + len(FEATURES)) and len({r.label for r in reqs}) == len(reqs)
    bodies = {r.label: det_body(r, 16, send_flag=True) for r in extra}
    seeds = [b["sampling_params"]["sampling_seed"] for b in bodies.values()]
    assert len(set(seeds)) == len(seeds)
    by_feature = {r.feature: bodies[r.label] for r in extra if r.prompt_index == 0}
    assert by_feature["n2"]["sampling_params"]["n"] == 2
    assert by_feature["penalty"]["sampling_params"]["frequency_penalty"] > 0
    json_sp = by_feature["json"]["sampling_params"]
    assert json.loads(json_sp["json_schema"])["type"] == "object"
    assert json_sp["ignore_eos"] is False  # the grammar decides where the output ends
    assert by_feature["lora"]["lora_path"] == "proof"
    assert all("lora_path" not in b for label, b in bodies.items() if "lora" not in label)
    with pytest.raises(ValueError, match="lora-name"):
        det_requests(1, 0, ("lora",))
    with pytest.raises(ValueError, match="unknown"):
        det_requests(1, 0, ("beam",))


def test_an_n2_answer_is_compared_sample_by_sample():
    out = [{"output_ids": [1, 2], "meta_info": {"output_token_logprobs": [[-0.5, 1], [-1.0, 2]],
                                                "llm42_rollbacks": 1}},
           {"output_ids": [3], "meta_info": {"output_token_logprobs": [[-0.25, 3]],
                                             "llm42_rollbacks": 2}}]
    ids, lps, meta = _sample(out)
    assert ids == [1, 2, -1, 3, -1] and meta["llm42_rollbacks"] == 3
    assert lps[:2] == [-0.5, -1.0] and lps[3] == -0.25 and math.isnan(lps[2])
