"""The sampled requests of a workload, kept on disk between the benchmark runs of one driver.

Every run of `benchmarks.bench_serving` samples its workload again: it imports transformers,
loads the tokenizer and tokenizes the dataset, about 6 s here and 17 s on the GPU machine's
Python, paid once per run. A device call of five runs paid over a minute of its ten for the same
1,024 rows. With `--rows-cache DIR` the first run writes the rows and later runs with the same
sampling inputs read them back (no transformers import at all). The key holds everything the
sampling depends on, the dataset file's size and modification time included, so a changed input
is a miss, never a stale hit.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

from benchmarks.workloads import DatasetRow

# The bench_serving arguments the sampled rows are a function of (with the tokenizer's path).
SAMPLING_ARGS = ("dataset_name", "dataset_path", "num_prompts", "seed", "random_input_len",
                 "random_output_len", "random_range_ratio", "sharegpt_output_len", "context_len")


def cache_key(args, tokenizer_path: str) -> str:
    inputs = {name: getattr(args, name, None) for name in SAMPLING_ARGS}
    inputs["tokenizer"] = str(Path(tokenizer_path).resolve()) if Path(
        tokenizer_path).exists() else tokenizer_path
    if args.dataset_path and Path(args.dataset_path).is_file():
        stat = Path(args.dataset_path).stat()
        inputs["dataset_path"] = str(Path(args.dataset_path).resolve())
        inputs["dataset_file"] = [stat.st_size, stat.st_mtime_ns]
    blob = json.dumps(inputs, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:20]


def load_or_sample(cache_dir: str | None, args, tokenizer_path: str,
                   sample: Callable[[], list[DatasetRow]]) -> list[DatasetRow]:
    """The cached rows for these sampling inputs, else `sample()`'s, written for the next run."""
    if not cache_dir:
        return sample()
    path = Path(cache_dir) / f"rows-{cache_key(args, tokenizer_path)}.json"
    if path.is_file():
        return [DatasetRow(*row) for row in json.loads(path.read_text(encoding="utf-8"))]
    rows = sample()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")  # a reader never sees half a file
    tmp.write_text(json.dumps([[r.prompt, r.prompt_len, r.output_len] for r in rows]),
                   encoding="utf-8")
    os.replace(tmp, path)
    return rows
