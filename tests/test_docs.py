"""The reference pages agree with the code: every llm42 flag of `sglang.launch_server` is in
docs/flags.md once with the default its parser uses, and docs/api.md lists exactly the keys
`GET /llm42_stats` answers.

The flags come from SGLang's own parser with the plugins loaded, in a subprocess (as
`launch_server` builds it; loading the plugins in this process would patch SGLang for every later
test), so the check survives however llm42 declares them.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
README = DOCS.parent / "README.md"

_PARSER_DEFAULTS = """
import argparse, json
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
print(json.dumps({flag: action.default for action in parser._actions
                  for flag in action.option_strings if "llm42" in flag}))
"""


@pytest.fixture(scope="module")
def parser_defaults() -> dict:
    out = subprocess.run([sys.executable, "-c", _PARSER_DEFAULTS], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _table_rows(markdown: str, heading: str | None = None) -> list[list[str]]:
    """Cells of the body rows of the markdown tables (under `heading`, up to the next heading)."""
    if heading is not None:
        start = markdown.index(heading)
        end = markdown.find("\n#", start + len(heading))
        markdown = markdown[start:end if end != -1 else None]
    rows = []
    for line in markdown.splitlines():
        if line.startswith("|") and not set(line) <= set("|-: "):
            rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows[1:] if rows else rows  # the header row of the (first) table


def _documented_default(cell: str):
    """`a-word` -> that string, 'off' / 'on' -> bool, 'auto: ...' / 'none' -> None, else the
    leading number."""
    word = cell.split()[0].strip("`:")
    if cell.startswith("`"):  # a value in code, `auto` included
        return word
    if word in ("off", "on"):
        return word == "on"
    if word in ("auto", "none"):
        return None
    return float(word)


def _documented_flags() -> dict[str, object]:
    flags: dict[str, object] = {}
    for cells in _table_rows((DOCS / "flags.md").read_text(), "| flag |"):
        for code in re.findall(r"`(--[a-z0-9-]+)[^`]*`", cells[0]):
            assert code not in flags, f"{code} is documented twice in docs/flags.md"
            flags[code] = _documented_default(cells[1])
    return flags


def test_every_flag_is_documented_once_with_its_default(parser_defaults):
    documented = _documented_flags()
    assert "--enable-llm42" in parser_defaults, "the llm42 plugin did not load its flags"
    missing = sorted(set(parser_defaults) - set(documented))
    stale = sorted(set(documented) - set(parser_defaults))
    assert not missing, f"flags missing from docs/flags.md: {missing}"
    assert not stale, f"docs/flags.md documents flags the server does not have: {stale}"
    for flag, default in parser_defaults.items():
        if flag.startswith("--no-"):  # the negative form of a boolean row: its default is the row's
            default = parser_defaults["--" + flag[len("--no-"):]]
        assert documented[flag] == default, (
            f"docs/flags.md gives {flag} the default {documented[flag]!r}, the parser "
            f"{default!r}")


def test_documented_stats_keys_are_the_endpoints():
    """The keys of GET /llm42_stats on an --enable-llm42 server: the scheduler's snapshot, merged
    over data-parallel ranks by the endpoint."""
    from llm42.core.config import Llm42Config
    from llm42.sglang.endpoints import merge_snapshots
    from llm42.sglang.runtime import Llm42Runtime

    scheduler = SimpleNamespace(model_config=SimpleNamespace(vocab_size=32, context_len=256),
                                enable_overlap=True, enable_metrics=False)
    served = set(merge_snapshots([Llm42Runtime(scheduler, Llm42Config()).snapshot()]))
    api = (DOCS / "api.md").read_text()
    documented = [re.sub(r"`", "", cells[0]) for cells in
                  _table_rows(api, "## `GET /llm42_stats`")]
    assert len(documented) == len(set(documented)), "a key is documented twice in docs/api.md"
    undocumented, stale = sorted(served - set(documented)), sorted(set(documented) - served)
    assert not undocumented, f"/llm42_stats keys missing from docs/api.md: {undocumented}"
    assert not stale, f"docs/api.md lists keys /llm42_stats does not answer: {stale}"


def test_readme_is_a_front_door():
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    assert not re.search(r"\b[0-9a-f]{7,40}\b", text), "a commit hash in README.md"


@pytest.mark.parametrize("page", [README, *sorted(DOCS.glob("*.md"))], ids=lambda p: p.name)
def test_links_resolve(page):
    text = page.read_text()
    links = re.findall(r"\]\(([^)#]+)", text) + re.findall(r"^\[[^\]]+\]: (\S+)", text, re.M)
    missing = [link for link in links
               if not link.startswith("http") and not (page.parent / link).exists()]
    assert not missing, f"{page.name} links to missing files: {missing}"


# Settings whose defaults decide a headline number (echoed by /llm42_stats, recorded in results).
_HEADLINE_SETTINGS = ("verifier", "window_size", "verify_batch_size", "max_verify_wait",
                      "fp32_logits", "batched_prefill", "overlap_verify", "max_finish_wait",
                      "defaults_version")
_OLDER_DEFAULTS = "previous defaults"  # how a caption or row says it predates the defaults


def _headline() -> list[tuple[str, list[str]]]:
    """The tables of the README's headline section: each one's caption (the text between it and
    the table before) and its rows."""
    text = README.read_text()
    start = text.index("## When to use it")
    section = text[start:text.index("\n## ", start + 5)]
    tables, caption, rows = [], [], None
    for line in section.splitlines():
        if line.startswith("|"):
            if rows is None:
                rows = []
            rows.append(line)
        else:
            if rows is not None:
                tables.append(("\n".join(caption), rows[2:]))  # past header and rule
                caption, rows = [], None
            caption.append(line)
    if rows is not None:
        tables.append(("\n".join(caption), rows[2:]))
    return tables


def _llm42_records(target: Path) -> list[dict]:
    folder = target.parent
    return [rec for path in sorted(folder.rglob("results.jsonl"))
            for rec in map(json.loads, path.read_text().splitlines())
            if rec.get("config") == "llm42" and not rec.get("skipped")]


def _benchmark_defaults() -> dict:
    """The settings a default launch echoes on the benchmarks' GPU (triton, 256 requests):
    `--llm42-verifier auto` resolves to row-invariant there, and the settings that default by
    the verifier follow it."""
    from dataclasses import replace

    from llm42.core.config import AUTO, ROW_INVARIANT, Llm42Config

    config = Llm42Config()
    if config.verifier == AUTO:
        config = replace(config, verifier=ROW_INVARIANT)
    return config.echo()


def _ran_at_defaults(record: dict, defaults: dict) -> bool:
    stats = record.get("llm42_stats") or {}
    return all(stats.get(key) == defaults[key] for key in _HEADLINE_SETTINGS)


def test_headline_rows_come_from_the_defaults_or_say_so():
    """Each row of the README's headline table links a results file with an llm42 run at the
    defaults in force (the settings /llm42_stats recorded, `defaults_version` included), unless
    the caption or the row says it comes from the previous defaults."""
    defaults = _benchmark_defaults()
    refs = dict(re.findall(r"^\[([^\]]+)\]: (\S+)", README.read_text(), re.M))
    tables = _headline()
    assert tables and tables[0][1], "the README has no headline table"
    assert _OLDER_DEFAULTS not in tables[0][0], "the first headline table is not today's"
    for caption, row in ((caption, row) for caption, rows in tables for row in rows):
        if _OLDER_DEFAULTS in caption or _OLDER_DEFAULTS in row:
            continue
        targets = {README.parent / refs[ref] for ref in re.findall(r"\]\[([^\]]+)\]", row)}
        assert targets, f"headline row without a results link: {row}"
        for target in targets:
            assert any(_ran_at_defaults(rec, defaults) for rec in _llm42_records(target)), (
                f"headline row {row!r} links {target}, which has no llm42 run at today's "
                f"defaults {({k: defaults[k] for k in _HEADLINE_SETTINGS})}: rerun it, or say "
                f"'{_OLDER_DEFAULTS}' in the row or the table's caption")


def test_headline_check_tells_defaults_apart():
    """The check above fails a record of other settings or of an older defaults version."""
    defaults = _benchmark_defaults()
    record = {"llm42_stats": {key: defaults[key] for key in _HEADLINE_SETTINGS}}
    assert _ran_at_defaults(record, defaults)
    for key, other in (("window_size", 16), ("fp32_logits", False), ("overlap_verify", False),
                       ("max_finish_wait", 16), ("defaults_version", 5),
                       ("verifier", "fixed-shape")):
        assert not _ran_at_defaults({"llm42_stats": {**record["llm42_stats"], key: other}},
                                    defaults), key
    assert not _ran_at_defaults({}, defaults)
