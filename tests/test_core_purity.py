"""llm42.core stays pure Python: importable with sglang, torch and numpy blocked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import sys
BLOCKED = ("sglang", "torch", "numpy")
for name in BLOCKED:
    sys.modules[name] = None  # any import of these now raises ImportError
import llm42.core
loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED and sys.modules[m])
adapter = sorted(m for m in sys.modules if m.startswith("llm42.sglang"))
assert not loaded and not adapter, f"llm42.core pulled in {loaded + adapter}"
print("ok", len(llm42.core.__all__))
"""


def test_core_imports_without_engine_packages() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, f"llm42.core is not pure:\n{result.stderr}"
    assert result.stdout.startswith("ok"), result.stdout


def test_the_tokenizer_process_side_imports_without_torch() -> None:
    """`endpoints` runs in the tokenizer process: it shares names with the scheduler hooks
    through torch-free modules (`keys`, `request_state`), never through the hooks."""
    probe = ("import sys\nsys.modules['torch'] = None\nimport llm42.sglang.endpoints\n"
             "assert not any(m.startswith('llm42.sglang.hooks_') for m in sys.modules)\n"
             "print('ok')")
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.startswith("ok"), result.stderr[-2000:]
