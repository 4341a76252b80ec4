"""llm42.compat: the pure-torch sgl_kernel stand-in, the torchvision stub, the .pth switch."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from llm42.compat import pth
from llm42.compat import sgl_kernel as stand_in

COMPAT_DIR = Path(pth.COMPAT_DIR)


# -- sgl_kernel stand-in ------------------------------------------------------------------------
def reference_assign(req_pool_indices, req_to_token, start, end, out_cache_loc):
    """Vectorized reference: flat (row, column) targets for every new location, then one scatter."""
    lengths = (end - start).clamp(min=0)
    rows = torch.repeat_interleave(req_pool_indices.long(), lengths)
    first = torch.repeat_interleave(start.long(), lengths)
    seg_start = torch.repeat_interleave(torch.cumsum(lengths, 0) - lengths, lengths)
    cols = first + torch.arange(int(lengths.sum())) - seg_start
    expected = req_to_token.clone()
    expected[rows, cols] = out_cache_loc[: int(lengths.sum())].to(expected.dtype)
    return expected


@pytest.mark.parametrize("seed", range(25))
def test_assign_req_to_token_pool_matches_reference(seed):
    gen = torch.Generator().manual_seed(seed)
    num_reqs, pool_len = 12, 40
    batch_size = int(torch.randint(1, num_reqs + 1, (1,), generator=gen))
    req_pool_indices = torch.randperm(num_reqs, generator=gen)[:batch_size].to(torch.int64)
    start = torch.randint(0, pool_len, (batch_size,), generator=gen)
    end = torch.minimum(start + torch.randint(0, 9, (batch_size,), generator=gen),
                        torch.tensor(pool_len))
    num_locs = int((end - start).sum())
    out_cache_loc = torch.randint(1, 10_000, (num_locs + 3,), generator=gen)  # spare tail unused
    req_to_token = torch.randint(-5, 0, (num_reqs, pool_len), generator=gen, dtype=torch.int32)

    expected = reference_assign(req_pool_indices, req_to_token, start, end, out_cache_loc)
    stand_in.assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start, end,
                                          out_cache_loc, pool_len)
    assert torch.equal(req_to_token, expected), f"seed {seed}: rows differ from the reference"


def test_assign_req_to_token_pool_rejects_short_out_cache_loc():
    table = torch.zeros((2, 8), dtype=torch.int32)
    with pytest.raises(ValueError, match="need 5 cache locations"):
        stand_in.assign_req_to_token_pool_cpu(torch.tensor([0]), table, torch.tensor([0]),
                                              torch.tensor([5]), torch.arange(3), 8)


def test_copy_all_layer_kv_cache_reads_all_sources_before_writing():
    gen = torch.Generator().manual_seed(0)
    buffers = [torch.randn((16, 2, 4), generator=gen, dtype=dtype)
               for dtype in (torch.float32, torch.bfloat16, torch.float16)]
    before = [b.clone() for b in buffers]
    # Overlapping in-place move: 3 -> 5 while 5 -> 7 (the old row 5 must land in 7).
    tgt = torch.tensor([5, 7, 0, 15])
    src = torch.tensor([3, 5, 9, 1])
    data_ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.uint64)
    strides = torch.tensor([b[0].numel() * b.element_size() for b in buffers])
    stand_in.copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt, src)
    for buf, old in zip(buffers, before, strict=True):
        expected = old.clone()
        expected[tgt] = old[src]
        assert torch.equal(buf, expected), f"{buf.dtype}: rows not moved as a gather-then-scatter"


@pytest.mark.parametrize("name", ["rmsnorm_cpu", "rotate_input_ids_cpu", "top_k_renorm_prob"])
def test_unimplemented_function_raises_when_called(name):
    stub = getattr(stand_in, name)  # `from sgl_kernel import name` must still succeed
    with pytest.raises(NotImplementedError, match=rf"sgl_kernel\.{name} is not implemented"):
        stub(torch.zeros(1))


def test_private_names_and_torch_ops_stay_absent():
    with pytest.raises(AttributeError):
        stand_in.__version__  # noqa: B018
    # SGLang's AMX probe: must stay false so layers take their forward_native paths.
    assert not hasattr(torch.ops.sgl_kernel, "convert_weight_packed")


# -- the .pth switch, in fresh interpreters -----------------------------------------------------
def run_isolated(site_dir: Path, code: str) -> dict:
    """Run ``code`` in ``python -S`` with only ``site_dir`` added (the way site adds site-packages).

    -S keeps this venv's own llm42_compat.pth out, so the test sees only the one it wrote.
    """
    script = f"import site, sys\nsite.addsitedir({str(site_dir)!r})\n" + textwrap.dedent(code)
    proc = subprocess.run([sys.executable, "-S", "-c", script], check=False, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, f"subprocess failed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_pth_appends_compat_after_site_packages_so_real_packages_win(tmp_path):
    site_dir = tmp_path / "site-packages"
    fake_real = site_dir / "sgl_kernel"
    fake_real.mkdir(parents=True)
    (fake_real / "__init__.py").write_text("REAL = True\n")
    # Written directly: install_pth would (rightly) refuse next to a real sgl_kernel.
    (site_dir / pth.PTH_NAME).write_text(pth.pth_text())

    result = run_isolated(site_dir, f"""
        import json, sgl_kernel
        entries = [p.rstrip("/") for p in sys.path]
        print(json.dumps({{"file": sgl_kernel.__file__,
                          "real": getattr(sgl_kernel, "REAL", False),
                          "site": entries.index({str(site_dir)!r}),
                          "compat": entries.index({str(COMPAT_DIR)!r})}}))
    """)
    assert result["real"], f"the fake real package lost to the stand-in: {result['file']}"
    assert result["compat"] > result["site"], "compat folder must come after site-packages"


def test_pth_makes_stand_ins_importable_and_hides_torchvision_from_probes(tmp_path):
    site_dir = tmp_path / "site-packages"
    site_dir.mkdir()
    result_info = pth.install_pth(site_dir)
    assert result_info.action == "written", result_info.message

    result = run_isolated(site_dir, """
        import importlib.util, json
        probe_before = importlib.util.find_spec("torchvision")
        import sgl_kernel
        import torchvision.transforms as T
        from torchvision.transforms.functional import InterpolationMode
        import torchvision.transforms.v2.functional as tvF
        try:
            T.Compose([T.ToTensor()])
            error = None
        except ImportError as exc:
            error = str(exc)
        print(json.dumps({"probe_before": probe_before is not None,
                          "stand_in": getattr(sgl_kernel, "IS_LLM42_STAND_IN", False),
                          "interp": repr(InterpolationMode.BICUBIC), "error": error}))
    """)
    assert result["stand_in"], "sgl_kernel did not resolve to llm42's stand-in"
    assert not result["probe_before"], "find_spec('torchvision') must not see the placeholder"
    assert "placeholder" in result["interp"]
    assert result["error"] and "llm42's CPU placeholder" in result["error"]


def test_transformers_treats_torchvision_as_unavailable():
    code = f"""
import sys
if {str(COMPAT_DIR)!r} not in sys.path:
    sys.path.append({str(COMPAT_DIR)!r})
    import llm42_compat_probe_guard
import transformers
from transformers.utils import is_torchvision_available
import torchvision.transforms  # the placeholder still imports
print(is_torchvision_available())
"""
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "False", proc.stdout


def test_placeholder_torchvision_raises_only_on_use():
    from llm42.compat import torchvision as placeholder

    resize = placeholder.transforms.functional.resize  # attribute chains are fine
    with pytest.raises(ImportError, match="llm42's CPU placeholder"):
        resize(None, [1, 1])
    with pytest.raises(ImportError, match="cannot subclass"):

        class Sub(placeholder.transforms.Compose):
            pass
    assert placeholder.__version__ == "0.0.0"


def test_install_pth_is_a_noop_next_to_a_real_sgl_kernel(tmp_path, monkeypatch):
    real_dir = tmp_path / "real"
    (real_dir / "sgl_kernel").mkdir(parents=True)
    (real_dir / "sgl_kernel" / "__init__.py").write_text("")
    site_dir = tmp_path / "site-packages"
    site_dir.mkdir()
    (site_dir / pth.PTH_NAME).write_text("stale\n")
    monkeypatch.syspath_prepend(str(real_dir))

    result = pth.install_pth(site_dir)
    assert result.action == "skipped", result.message
    assert "real sgl_kernel found" in result.message
    assert not (site_dir / pth.PTH_NAME).exists(), "a stale .pth next to a real package is removed"


def test_install_pth_twice_is_unchanged(tmp_path):
    assert pth.install_pth(tmp_path).action == "written"
    assert pth.install_pth(tmp_path).action == "unchanged"
    assert (tmp_path / pth.PTH_NAME).read_text() == pth.pth_text()


def test_compat_package_import_has_no_side_effects():
    code = ("import sys; before = set(sys.modules); import llm42.compat; "
            "print(sorted(m for m in set(sys.modules) - before "
            "if m.split('.')[0] in ('sgl_kernel', 'torchvision', 'torch')))")
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", f"importing llm42.compat imported {proc.stdout}"


# -- xgrammar bitmask on CPU (replace_on_cpu hooks in patches/) ------------------------------
def test_grammar_bitmask_stand_ins_allocate_unpinned_and_mask_on_cpu():
    from llm42.compat import grammar_bitmask

    mask = grammar_bitmask.allocate_token_bitmask(vocab_size=70, batch_size=2)
    assert mask.shape == (2, 3) and mask.dtype == torch.int32 and (mask == -1).all()
    assert not mask.is_pinned()
    mask[0, 1] = 0  # row 0: tokens [32, 64) disallowed
    logits = torch.zeros(2, 70)
    grammar_bitmask.apply_vocab_mask(None, logits, mask)
    assert torch.isneginf(logits[0, 32:64]).all(), "disallowed tokens must become -inf"
    assert torch.isfinite(logits[0, :32]).all() and torch.isfinite(logits[0, 64:]).all()
    assert torch.isfinite(logits[1]).all()



# -- pinned memory without an accelerator -------------------------------------------------------
def test_unpinned_memory_makes_pinning_a_noop_without_an_accelerator():
    """SGLang's LoRA pins host buffers, which CPU-only torch refuses; after `install()` the same
    calls give ordinary CPU tensors (run in a subprocess: it patches torch)."""
    code = textwrap.dedent("""
        import torch
        try:
            torch.tensor([1, 2], pin_memory=True)
            raise SystemExit("pinned memory works here: nothing to test")
        except RuntimeError:
            pass
        from llm42.compat import unpinned_memory
        assert unpinned_memory.install() and unpinned_memory.install()
        t = torch.tensor([1, 2], dtype=torch.int32, pin_memory=True)
        e = torch.empty((3,), dtype=torch.int64, pin_memory=True)
        assert t.tolist() == [1, 2] and t.dtype == torch.int32 and e.shape == (3,)
        assert t.pin_memory() is t and not t.is_pinned()
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    if "nothing to test" in out.stderr:
        pytest.skip("this host has a pinned-memory allocator")
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
