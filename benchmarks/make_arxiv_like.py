"""Write an ArXiv-like summarization JSONL (`article`, `abstract`) from Python stdlib docstrings.

    python -m benchmarks.make_arxiv_like --out arxiv_like.jsonl --num-records 512 --seed 0
    python -m benchmarks.bench_serving --dataset-name arxiv --dataset-path arxiv_like.jsonl ...

A stand-in for `ccdv/arxiv-summarization` on hosts without it (no network at run time): long
English technical prose as the article, and an abstract drawn from the first sentences of the
article's own paragraphs, with lengths in ArXiv's range (articles of a few thousand words,
abstracts of ~100-300 words). Docstrings are read with `ast` from the stdlib's source files (no
module is imported), files and paragraphs in sorted order, so a given seed and Python version
always give the same file. Every record says what it is in its `source` field; results built on
it must say "ArXiv-like (synthetic)", not "ArXiv".
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import re
import sys
import sysconfig
from pathlib import Path

_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "lib2to3", "__pycache__", "turtledemo"}
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def stdlib_paragraphs(stdlib_dir: Path | None = None, min_words: int = 12) -> list[str]:
    """Prose paragraphs (>= min_words words, not code-like) of every stdlib docstring."""
    root = Path(stdlib_dir or sysconfig.get_paths()["stdlib"])
    paragraphs: list[str] = []
    seen: set[str] = set()
    for path in sorted(root.rglob("*.py")):
        if _SKIP_DIRS & set(path.relative_to(root).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
            continue
        nodes = [tree] + [n for n in ast.walk(tree) if isinstance(
            n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        for node in nodes:
            doc = ast.get_docstring(node)
            for block in (doc or "").split("\n\n"):
                text = " ".join(block.split())
                if len(text.split()) >= min_words and _is_prose(text) and text not in seen:
                    seen.add(text)
                    paragraphs.append(text)
    return paragraphs


def _is_prose(text: str) -> bool:
    letters = sum(c.isalpha() or c.isspace() for c in text)
    return letters / len(text) > 0.85 and ">>>" not in text and text[0].isalpha()


def _first_sentence(paragraph: str) -> str:
    return _SENTENCE_END.split(paragraph, maxsplit=1)[0]


def make_records(paragraphs: list[str], *, num_records: int, seed: int,
                 article_words: tuple[int, int], abstract_words: tuple[int, int],
                 source: str) -> list[dict]:
    if len(paragraphs) < 50:
        raise ValueError(f"only {len(paragraphs)} stdlib paragraphs found; need at least 50.")
    rng = random.Random(seed)
    records = []
    for index in range(num_records):
        target = rng.randint(*article_words)
        chosen: list[str] = []
        words = 0
        while words < target:
            paragraph = rng.choice(paragraphs)
            chosen.append(paragraph)
            words += len(paragraph.split())
        abstract_target = rng.randint(*abstract_words)
        summary: list[str] = []
        for paragraph in chosen:
            if sum(len(s.split()) for s in summary) >= abstract_target:
                break
            summary.append(_first_sentence(paragraph))
        records.append({"id": f"arxiv-like-{seed}-{index}", "article": "\n\n".join(chosen),
                        "abstract": " ".join(summary), "source": source})
    return records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--num-records", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-article-words", type=int, default=1500)
    p.add_argument("--max-article-words", type=int, default=4000)
    p.add_argument("--min-abstract-words", type=int, default=100)
    p.add_argument("--max-abstract-words", type=int, default=250)
    p.add_argument("--stdlib-dir", default=None, help="default: this interpreter's stdlib")
    args = p.parse_args(argv)
    if not (0 < args.min_article_words <= args.max_article_words
            and 0 < args.min_abstract_words <= args.max_abstract_words):
        p.error("word ranges must satisfy 0 < min <= max")
    version = ".".join(map(str, sys.version_info[:3]))
    source = (f"synthetic ArXiv-like (Python {version} stdlib docstrings, seed {args.seed}); "
              "not the ArXiv dataset")
    records = make_records(stdlib_paragraphs(args.stdlib_dir), num_records=args.num_records,
                           seed=args.seed,
                           article_words=(args.min_article_words, args.max_article_words),
                           abstract_words=(args.min_abstract_words, args.max_abstract_words),
                           source=source)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(record) + "\n" for record in records)
    print(f"wrote {len(records)} records to {args.out} ({source})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
