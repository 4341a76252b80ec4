"""Models for llm42's tests, demo and benchmarks: the embedded default and random Llamas.

    from llm42.models import default_model_path, write_random_llama
    server_model = default_model_path()                       # SmolLM2-135M-Instruct (cached)
    tiny = write_random_llama("/tmp/tiny", preset="tiny")      # seeded random weights
    lora = write_random_lora("/tmp/lora", base_dir=tiny)       # random adapter for it
    eagle = write_random_eagle_draft("/tmp/eagle", base_dir=tiny)   # random EAGLE draft for it

CLI: ``python -m llm42.models default-path`` and
``python -m llm42.models random-llama --preset tiny --out DIR``.
"""

from llm42.models.random_eagle import write_random_eagle_draft
from llm42.models.random_llama import PRESETS, llama_config, write_random_llama
from llm42.models.random_lora import write_random_lora
from llm42.models.smollm2 import DefaultModelError, cache_dir, default_model_path, gguf_path

__all__ = [
    "PRESETS",
    "DefaultModelError",
    "cache_dir",
    "default_model_path",
    "gguf_path",
    "llama_config",
    "write_random_eagle_draft",
    "write_random_llama",
    "write_random_lora",
]
