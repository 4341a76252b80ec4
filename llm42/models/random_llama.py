"""Seeded random-weight Llama checkpoints: a tiny one for CPU tests, real shapes for GPU proofs.

    from llm42.models import write_random_llama
    path = write_random_llama("/tmp/tiny-llama", preset="tiny", seed=0)   # ~13 MB, seconds

Each tensor is drawn from its own generator, seeded from ``(seed, tensor name)``, and streamed to
``model.safetensors`` in row chunks, so memory stays at one chunk even for ``llama-3.1-8b`` and the
same arguments always give a byte-identical file. Linear and embedding weights are N(0, std^2);
RMSNorm weights are ones (as Hugging Face initializes them). The tokenizer files are copied from
``tokenizer_dir`` (default: the converted SmolLM2 default model). With a preset whose vocabulary is
larger than the tokenizer's (the Llama-3 shapes with the default tokenizer), the model can emit ids
the tokenizer cannot decode; pass a matching ``tokenizer_dir`` or ``overrides={"vocab_size": ...}``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    # CPU tests: 4 layers, SmolLM2 vocabulary (tied embeddings keep it ~3.3M parameters).
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 49152,
        "max_position_embeddings": 2048,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
    },
    # meta-llama/Llama-3.2-1B shapes.
    "llama-3.2-1b": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
    },
    # meta-llama/Llama-3.1-8B shapes.
    "llama-3.1-8b": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
    },
}

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "tokenizer.model",
)
_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}  # torch name -> safetensors
_CHUNK_ELEMENTS = 1 << 24  # rows generated per step: at most 16M elements (64 MB in float32)


def llama_config(preset: str = "tiny", overrides: Mapping[str, Any] | None = None,
                 *, dtype: str = "float32") -> dict[str, Any]:
    """The ``config.json`` contents for a preset (unknown preset names raise ValueError)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}: expected one of {sorted(PRESETS)}")
    arch = {**PRESETS[preset], **(overrides or {})}
    arch.setdefault("head_dim", arch["hidden_size"] // arch["num_attention_heads"])
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "use_cache": True,
        "torch_dtype": dtype,
        **arch,
    }


def tensor_shapes(config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Hugging Face Llama parameter names and shapes for ``config``, in file order."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head_dim = config["head_dim"]
    q_dim = config["num_attention_heads"] * head_dim
    kv_dim = config["num_key_value_heads"] * head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (config["vocab_size"], hidden),
    }
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}"
        shapes[f"{prefix}.input_layernorm.weight"] = (hidden,)
        shapes[f"{prefix}.self_attn.q_proj.weight"] = (q_dim, hidden)
        shapes[f"{prefix}.self_attn.k_proj.weight"] = (kv_dim, hidden)
        shapes[f"{prefix}.self_attn.v_proj.weight"] = (kv_dim, hidden)
        shapes[f"{prefix}.self_attn.o_proj.weight"] = (hidden, q_dim)
        shapes[f"{prefix}.post_attention_layernorm.weight"] = (hidden,)
        shapes[f"{prefix}.mlp.gate_proj.weight"] = (inter, hidden)
        shapes[f"{prefix}.mlp.up_proj.weight"] = (inter, hidden)
        shapes[f"{prefix}.mlp.down_proj.weight"] = (hidden, inter)
    shapes["model.norm.weight"] = (hidden,)
    if not config.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (config["vocab_size"], hidden)
    return shapes


def write_random_llama(
    out_dir: str | Path,
    *,
    preset: str = "tiny",
    seed: int = 0,
    std: float = 0.02,
    dtype: str = "float32",
    tokenizer_dir: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> str:
    """Write a random Llama checkpoint (safetensors + config + tokenizer) and return its folder."""
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    if tokenizer_dir is None:
        from llm42.models.smollm2 import default_model_path

        tokenizer_dir = default_model_path()
    tokenizer_dir = Path(tokenizer_dir)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    copied = _copy_tokenizer(tokenizer_dir, out)
    config = llama_config(preset, overrides, dtype=dtype)
    config.update(_special_token_ids(out))
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if not copied:
        raise FileNotFoundError(
            f"no tokenizer files ({', '.join(TOKENIZER_FILES)}) in {tokenizer_dir}"
        )

    shapes = tensor_shapes(config)
    metadata = {"format": "pt", "llm42_preset": preset, "llm42_seed": str(seed),
                "llm42_std": repr(std)}
    write_random_tensors(out / "model.safetensors", shapes, seed=seed, std=std, dtype=dtype,
                         metadata=metadata)
    return str(out)


def write_random_tensors(path: Path, shapes: Mapping[str, tuple[int, ...]], *, seed: int,
                         std: float, dtype: str, metadata: Mapping[str, str]) -> None:
    """One safetensors file of seeded N(0, std^2) tensors (norm weights: ones), streamed."""
    _write_safetensors(path, shapes, dtype, metadata,
                       lambda name, shape: _tensor_chunks(name, shape, seed=seed, std=std,
                                                          dtype=dtype))


def _copy_tokenizer(src: Path, out: Path) -> list[str]:
    copied = []
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            if (src / name).resolve() != (out / name).resolve():
                shutil.copyfile(src / name, out / name)
            copied.append(name)
    return copied


def _special_token_ids(out: Path) -> dict[str, int]:
    """bos/eos/pad ids for config.json, read from the copied tokenizer (empty if unknown)."""
    tokenizer_json = out / "tokenizer.json"
    tokenizer_config = out / "tokenizer_config.json"
    if not (tokenizer_json.is_file() and tokenizer_config.is_file()):
        return {}
    vocab = json.loads(tokenizer_json.read_text()).get("model", {}).get("vocab", {})
    added = {t["content"]: t["id"] for t in json.loads(tokenizer_json.read_text()).get(
        "added_tokens", [])}
    settings = json.loads(tokenizer_config.read_text())
    ids = {}
    for role in ("bos", "eos", "pad"):
        token = settings.get(f"{role}_token")
        if isinstance(token, dict):
            token = token.get("content")
        token_id = added.get(token, vocab.get(token)) if token else None
        if token_id is not None:
            ids[f"{role}_token_id"] = token_id
    return ids


def _tensor_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"llm42-random-llama:{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _tensor_chunks(name: str, shape: tuple[int, ...], *, seed: int, std: float,
                   dtype: str) -> Iterator[bytes]:
    import torch

    torch_dtype = getattr(torch, dtype)
    if name.endswith("norm.weight"):
        yield torch.ones(shape, dtype=torch_dtype).view(torch.uint8).numpy().tobytes()
        return
    generator = torch.Generator().manual_seed(_tensor_seed(seed, name))
    rows, row_len = shape[0], _numel(shape[1:])
    rows_per_chunk = max(1, _CHUNK_ELEMENTS // max(1, row_len))
    for start in range(0, rows, rows_per_chunk):
        num_rows = min(rows_per_chunk, rows - start)
        chunk = torch.randn((num_rows, *shape[1:]), generator=generator, dtype=torch.float32)
        chunk = (chunk * std).to(torch_dtype)
        yield chunk.contiguous().view(torch.uint8).numpy().tobytes()


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def _write_safetensors(path: Path, shapes: Mapping[str, tuple[int, ...]], dtype: str,
                       metadata: Mapping[str, str], chunks) -> None:
    """Stream tensors into one safetensors file: 8-byte header size, JSON header, raw data.

    Offsets are laid out in ``shapes`` order; the header is padded with spaces to a multiple of 8
    bytes, as the reference writer does, so every tensor stays aligned.
    """
    itemsize = 2 if dtype in ("bfloat16", "float16") else 4
    header: dict[str, Any] = {"__metadata__": dict(metadata)}
    offset = 0
    for name, shape in shapes.items():
        nbytes = _numel(shape) * itemsize
        header[name] = {"dtype": _DTYPES[dtype], "shape": list(shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header_bytes = json.dumps(header, separators=(",", ":")).encode()
    header_bytes += b" " * (-len(header_bytes) % 8)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as handle:
        handle.write(struct.pack("<Q", len(header_bytes)))
        handle.write(header_bytes)
        for name, shape in shapes.items():
            written = 0
            for data in chunks(name, shape):
                handle.write(data)
                written += len(data)
            expected = header[name]["data_offsets"][1] - header[name]["data_offsets"][0]
            assert written == expected, f"{name}: wrote {written} bytes, header says {expected}"
    tmp.replace(path)
