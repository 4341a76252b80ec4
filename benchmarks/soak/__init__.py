"""Load soak: thousands of mixed requests with aborts; checks 5xx, leaks and determinism.

    python -m benchmarks.soak --url http://127.0.0.1:30000 --out-dir soak/
    python -m benchmarks.soak --launch --out-dir benchmarks/results/cpu-soak/   # `make soak`

`--launch` starts the server here (default `--server-args`: W=8, B=4, fault injection 0.2,
`--random-seed 7`, context 1024; `--enable-llm42` is always added) and stops it at the end.

A seeded plan of `--num-requests` requests over `/generate`, `/v1/completions` and
`/v1/chat/completions`, streaming and not. `--det-fraction` of them are deterministic, each drawn
from a small pool of distinct (prompt, endpoint, greedy or t=0.8 seeded, max tokens) specs; every
spec first gets a reference, taken alone on the server (sequentially, nothing else running).
The other requests are normal requests of mixed prompt and output lengths. `--abort-fraction` of
all requests get aborted: by `POST /abort_request` with their `rid` (after a few stream chunks,
or after a random delay when not streaming) or, for streams, by closing the connection.
Everything runs at `--concurrency` requests in flight.

Checks (exit code 1 when any fails, 0 otherwise):
  * no HTTP status >= 500 (also SSE error events with such a code, and /abort_request answers),
    no 4xx (every planned request is valid), no transport errors, no stream cut short;
  * every completed deterministic request is identical to its reference: native `output_ids`
    and `output_token_logprobs` (floats by their bits), OpenAI text, logprobs and
    `completion_tokens`; finish reasons equal;
  * an aborted deterministic request's partial output (where visible) is a prefix of its
    reference;
  * after the load drains: the server is idle, `/health` is 200 (SGLang's strict idle leak check
    kills the scheduler on any leaked KV slot or request row, so healthy + idle means no leak),
    the launched server process is alive, KV tokens in use (`/v1/loads` num_used_tokens, radix
    cache excluded) are 0, and llm42 counted no `inconsistent_tokens`;
  * `--recheck` specs taken alone again after the soak still equal their references.

Writes into `--out-dir`: `soak.jsonl` (one summary row), `soak.md` (figures table),
`commands.txt` (this command, the server command, git commit, CPU model) and, with
`--per-request-log`, `soak_requests.jsonl` (one row per request). With `--launch` and no
`--model-path` the server runs the tiny random Llama of the tests (bf16, hidden 256, seed 0).

Modules: `plan` (the seeded requests), `client` (sending them, aborts included), `responses`
(one output per response), `compare` (bitwise against the references), `check` (verdicts and
leak checks), `run` (the whole soak), `report` (JSONL row, Markdown), `cli` (this command).
"""
