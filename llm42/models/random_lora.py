"""Seeded random LoRA adapters (PEFT layout) for a random Llama: tests and GPU proofs of LoRA.

    from llm42.models import write_random_lora
    adapter = write_random_lora("/tmp/lora-a", base_dir=tiny, seed=1)

PEFT initializes B to zeros, which makes an adapter a no-op; here both A and B are random, so an
adapter changes the model's output and a row served with the wrong adapter (or none) shows.
Same arguments, byte-identical files (the random Llama's per-tensor seeding).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from llm42.models.random_llama import write_random_tensors

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_ATTN = {"q_proj", "k_proj", "v_proj", "o_proj"}


def write_random_lora(out_dir: str | Path, *, base_dir: str | Path, seed: int = 0,
                      rank: int = 8, alpha: int = 16, std: float = 0.05,
                      targets: Sequence[str] = DEFAULT_TARGETS, dtype: str = "float32") -> str:
    """Write ``adapter_config.json`` + ``adapter_model.safetensors`` for the Llama in
    ``base_dir`` (its ``config.json`` gives the shapes) and return the adapter's folder."""
    config = json.loads((Path(base_dir) / "config.json").read_text())
    unknown = set(targets) - set(DEFAULT_TARGETS)
    if unknown:
        raise ValueError(f"unknown LoRA targets {sorted(unknown)}: expected {DEFAULT_TARGETS}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha,
        "lora_dropout": 0.0, "bias": "none", "target_modules": sorted(targets),
        "base_model_name_or_path": str(base_dir), "fan_in_fan_out": False,
    }, indent=2, sort_keys=True) + "\n")
    shapes = {}
    for layer in range(config["num_hidden_layers"]):
        for target in sorted(targets):
            d_in, d_out = _dims(config, target)
            name = f"base_model.model.model.layers.{layer}.{_module(target)}.{target}"
            shapes[f"{name}.lora_A.weight"] = (rank, d_in)
            shapes[f"{name}.lora_B.weight"] = (d_out, rank)
    metadata = {"format": "pt", "llm42_seed": str(seed), "llm42_std": repr(std)}
    write_random_tensors(out / "adapter_model.safetensors", shapes, seed=seed, std=std,
                         dtype=dtype, metadata=metadata)
    return str(out)


def _module(target: str) -> str:
    return "self_attn" if target in _ATTN else "mlp"


def _dims(config, target: str) -> tuple[int, int]:
    """(in, out) features of a Llama linear layer."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    q_dim = config["num_attention_heads"] * head_dim
    kv_dim = config["num_key_value_heads"] * head_dim
    return {"q_proj": (hidden, q_dim), "k_proj": (hidden, kv_dim), "v_proj": (hidden, kv_dim),
            "o_proj": (q_dim, hidden), "gate_proj": (hidden, inter), "up_proj": (hidden, inter),
            "down_proj": (inter, hidden)}[target]
