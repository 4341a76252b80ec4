"""CLI for llm42's models.

    python -m llm42.models default-path
    python -m llm42.models random-llama --preset tiny --out DIR [--seed 0 --std 0.02
        --dtype float32 --tokenizer DIR]
    python -m llm42.models random-lora --base DIR --out DIR [--seed 0 --rank 8 --dtype bfloat16]
    python -m llm42.models random-eagle --base DIR --out DIR [--seed 0 --layers 1]
"""

from __future__ import annotations

import argparse
import sys

from llm42.models.random_llama import PRESETS, write_random_llama
from llm42.models.random_eagle import write_random_eagle_draft
from llm42.models.random_lora import write_random_lora
from llm42.models.smollm2 import DefaultModelError, default_model_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llm42.models", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    default = sub.add_parser("default-path", help="print the converted default model's folder "
                                                  "(converts it on first use)")
    default.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    rand = sub.add_parser("random-llama", help="write a seeded random-weight Llama checkpoint")
    rand.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    rand.add_argument("--out", required=True, help="output folder")
    rand.add_argument("--seed", type=int, default=0)
    rand.add_argument("--std", type=float, default=0.02)
    rand.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    rand.add_argument("--tokenizer", default=None,
                      help="folder to copy tokenizer files from (default: the default model's)")
    lora = sub.add_parser("random-lora", help="write a seeded random LoRA adapter for a Llama")
    lora.add_argument("--base", required=True, help="the Llama's folder (its config.json)")
    lora.add_argument("--out", required=True, help="output folder")
    lora.add_argument("--seed", type=int, default=0)
    lora.add_argument("--rank", type=int, default=8)
    lora.add_argument("--std", type=float, default=0.02)
    lora.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16", "float16"))
    eagle = sub.add_parser("random-eagle", help="write a seeded random EAGLE draft for a Llama "
                                                "(--speculative-algorithm EAGLE)")
    eagle.add_argument("--base", required=True, help="the Llama's folder (its config.json)")
    eagle.add_argument("--out", required=True, help="output folder")
    eagle.add_argument("--seed", type=int, default=0)
    eagle.add_argument("--layers", type=int, default=1)
    eagle.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"),
                       help="default: the base's")
    args = parser.parse_args(argv)

    try:
        if args.command == "default-path":
            print(default_model_path(dtype=args.dtype))
        elif args.command == "random-eagle":
            print(write_random_eagle_draft(args.out, base_dir=args.base, seed=args.seed,
                                           num_layers=args.layers, dtype=args.dtype))
        elif args.command == "random-lora":
            print(write_random_lora(args.out, base_dir=args.base, seed=args.seed, rank=args.rank,
                                    std=args.std, dtype=args.dtype))
        else:
            print(write_random_llama(args.out, preset=args.preset, seed=args.seed, std=args.std,
                                     dtype=args.dtype, tokenizer_dir=args.tokenizer))
    except DefaultModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
