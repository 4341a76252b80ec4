"""The GPU determinism proof's request set covers every sampling kind llm42 serves."""

from __future__ import annotations

from benchmarks.determinism_proof import det_body, det_requests


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
