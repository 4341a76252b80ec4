"""Seeded random EAGLE draft checkpoints for a random Llama (``--speculative-algorithm EAGLE``).

    from llm42.models import write_random_eagle_draft
    draft = write_random_eagle_draft("/tmp/eagle", base_dir=tiny, seed=1)   # one decoder layer

An EAGLE draft (SGLang's ``LlamaForCausalLMEagle``) is ``fc`` (the token embedding concatenated
with the target's hidden state, ``2h -> h``, with bias) followed by Llama decoder layers whose first
has no input norm, and no final norm. Its embedding and LM head come from the target at load time
(the EAGLE worker shares them), so the checkpoint holds neither. Names carry no ``model.`` prefix,
as in published EAGLE checkpoints. Random weights draft poorly (acceptance near 1): the checkpoint
exercises the EAGLE code path, not speculation's speed-up. Same arguments, byte-identical files.
"""

from __future__ import annotations

import json
from pathlib import Path

from llm42.models.random_llama import (
    _copy_tokenizer,
    _special_token_ids,
    tensor_shapes,
    write_random_tensors,
)

EAGLE_ARCHITECTURE = "LlamaForCausalLMEagle"


def write_random_eagle_draft(
    out_dir: str | Path,
    *,
    base_dir: str | Path,
    seed: int = 0,
    num_layers: int = 1,
    std: float = 0.05,
    dtype: str | None = None,
) -> str:
    """Write an EAGLE draft for the Llama in ``base_dir`` (its ``config.json`` gives the shapes,
    its tokenizer files are copied; ``dtype`` defaults to the target's) and return its folder."""
    base = Path(base_dir)
    target = json.loads((base / "config.json").read_text())
    # transformers 5 writes `dtype` (the converted SmolLM2), older versions `torch_dtype`
    dtype = dtype or target.get("torch_dtype") or target.get("dtype") or "float32"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _copy_tokenizer(base, out)
    # Untied: SGLang swaps in the target's embedding and head one after the other, which fails
    # on one shared tensor.
    config = {
        **target,
        "architectures": [EAGLE_ARCHITECTURE],
        "num_hidden_layers": num_layers,
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
        **({"dtype": dtype} if "dtype" in target else {}),
        **_special_token_ids(out),
    }
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    hidden = config["hidden_size"]
    shapes = {"fc.weight": (hidden, 2 * hidden), "fc.bias": (hidden,)}
    for name, shape in tensor_shapes(config).items():
        if name.startswith("model.layers.") and name != "model.layers.0.input_layernorm.weight":
            shapes[name.removeprefix("model.")] = shape
    metadata = {"format": "pt", "llm42_eagle_seed": str(seed), "llm42_std": repr(std)}
    write_random_tensors(
        out / "model.safetensors", shapes, seed=seed, std=std, dtype=dtype, metadata=metadata
    )
    return str(out)
