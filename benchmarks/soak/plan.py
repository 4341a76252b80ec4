"""The soak's plan: which requests, on which endpoint, streamed or not, aborted how; seeded.

    plan = build_plan(SoakConfig(num_requests=150, seed=11))
    plan.specs        # distinct deterministic requests, each compared with its solo reference

Deterministic requests are copies of a few specs (only `stream` and `rid` vary between copies);
the others are normal requests of mixed prompt and output lengths, some sharing a prefix with a
deterministic prompt.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

ENDPOINTS = ("generate", "completions", "chat")
DET_PROMPTS = [
    "The quick brown fox jumps over the lazy dog because",
    "In a distant galaxy, the ancient robots",
    "def fibonacci(n):",
    "Once upon a time there was a small village where",
    "The capital of France is",
    "List three reasons why the sky is blue:",
    "Explain how a server batches the decoding steps of many users at once.",
    "Translate into French: the weather is beautiful today.",
]
WORDS = ("the of and to in is that for it as was with be by on not this are or from at which "
         "but have an they you were one all we can has been if more when will would who so no "
         "time system model token server batch kernel memory value result engine request "
         "output input layer cache graph python compute matrix vector").split()


@dataclass(frozen=True)
class SoakConfig:
    num_requests: int = 2000
    det_fraction: float = 0.3
    abort_fraction: float = 0.05
    concurrency: int = 64
    seed: int = 0
    min_new_tokens: int = 2
    max_new_tokens: int = 12
    pool_size: int = 12  # distinct deterministic specs (each gets a solo reference)
    max_prompt_words: int = 40
    recheck: int = 4  # specs taken alone again after the soak
    request_timeout: float = 900.0
    drain_timeout: float = 300.0
    idle_settle_s: float = 1.0  # idle scheduler iterations (each runs the leak check)
    run_tag: str = "soak"
    progress: bool = True


@dataclass(frozen=True)
class DetSpec:
    spec_id: int
    prompt: str
    endpoint: str
    temperature: float
    seed: int | None
    max_new_tokens: int

    @property
    def label(self) -> str:
        mode = "greedy" if self.temperature == 0 else f"t{self.temperature:g}-s{self.seed}"
        return f"d{self.spec_id}-{self.endpoint}-{mode}-n{self.max_new_tokens}"


@dataclass(frozen=True)
class PlannedRequest:
    index: int
    rid: str
    endpoint: str
    stream: bool
    spec_id: int | None  # deterministic spec, None for a normal request
    abort: str | None  # None, "rid" (POST /abort_request) or "disconnect" (streams only)
    abort_after_chunks: int  # streams: abort once this many data chunks arrived
    abort_delay_s: float  # non-streaming rid aborts: abort after this delay
    body: dict
    max_new_tokens: int

    @property
    def det(self) -> bool:
        return self.spec_id is not None


@dataclass
class Plan:
    specs: list[DetSpec]
    requests: list[PlannedRequest]


def det_body(spec: DetSpec, *, stream: bool, rid: str) -> dict:
    """The one request a spec stands for (only `stream`, `stream_options` and `rid` vary)."""
    if spec.endpoint == "generate":
        sp = {"max_new_tokens": spec.max_new_tokens, "temperature": spec.temperature,
              "is_deterministic": True}
        if spec.seed is not None:
            sp["sampling_seed"] = spec.seed
        return {"text": spec.prompt, "sampling_params": sp, "return_logprob": True,
                "stream": stream, "rid": rid}
    body = {"model": "default", "max_tokens": spec.max_new_tokens,
            "temperature": spec.temperature, "is_deterministic": True, "stream": stream,
            "rid": rid}
    if spec.seed is not None:
        body["seed"] = spec.seed
    if spec.endpoint == "completions":
        body.update(prompt=spec.prompt, logprobs=1)
    else:
        body.update(messages=[{"role": "user", "content": spec.prompt}], logprobs=True,
                    top_logprobs=1)
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def _normal_body(rng: random.Random, endpoint: str, stream: bool, rid: str, max_new: int,
                 max_words: int) -> dict:
    if rng.random() < 0.3:  # a deterministic prompt: normal requests may share its prefix
        prompt = rng.choice(DET_PROMPTS)
        if rng.random() < 0.5:
            prompt += " " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 20)))
    else:
        prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, max_words)))
    temperature = rng.choice((0.0, 0.7, 1.0))
    flag = rng.random() < 0.25  # sends is_deterministic: false explicitly
    logprobs = rng.random() < 0.3
    ignore_eos = rng.random() < 0.5
    if endpoint == "generate":
        sp = {"max_new_tokens": max_new, "temperature": temperature, "ignore_eos": ignore_eos}
        if temperature > 0 and rng.random() < 0.5:
            sp["top_p"] = 0.9
        if flag:
            sp["is_deterministic"] = False
        body = {"text": prompt, "sampling_params": sp, "stream": stream, "rid": rid}
        if logprobs:
            body["return_logprob"] = True
        return body
    body = {"model": "default", "max_tokens": max_new, "temperature": temperature,
            "ignore_eos": ignore_eos, "stream": stream, "rid": rid}
    if flag:
        body["is_deterministic"] = False
    if endpoint == "completions":
        body["prompt"] = prompt
        if logprobs:
            body["logprobs"] = 1
    else:
        body["messages"] = [{"role": "user", "content": prompt}]
        if logprobs:
            body.update(logprobs=True, top_logprobs=1)
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def build_plan(cfg: SoakConfig) -> Plan:
    """Seeded: the same config gives the same plan (rids carry `cfg.run_tag`)."""
    if cfg.num_requests < 1 or not 0 <= cfg.det_fraction <= 1 or not 0 <= cfg.abort_fraction <= 1:
        raise ValueError("need num_requests >= 1 and fractions in [0, 1]")
    if not 1 <= cfg.min_new_tokens <= cfg.max_new_tokens:
        raise ValueError("need 1 <= min_new_tokens <= max_new_tokens")
    rng = random.Random(cfg.seed)
    n = cfg.num_requests
    n_det = round(n * cfg.det_fraction)
    pool = max(1, min(cfg.pool_size, n_det)) if n_det else 0
    specs = []
    for i in range(pool):  # cycles endpoints and sampling modes: every combination appears
        greedy = (i // len(ENDPOINTS)) % 2 == 0
        specs.append(DetSpec(
            spec_id=i, prompt=DET_PROMPTS[i % len(DET_PROMPTS)],
            endpoint=ENDPOINTS[i % len(ENDPOINTS)], temperature=0.0 if greedy else 0.8,
            seed=None if greedy else 1000 + i,
            max_new_tokens=rng.randint(cfg.min_new_tokens, cfg.max_new_tokens)))
    det_indices = set(rng.sample(range(n), n_det))
    abort_indices = set(rng.sample(range(n), round(n * cfg.abort_fraction)))
    spec_of = [i % pool for i in range(n_det)] if pool else []
    rng.shuffle(spec_of)  # every spec used, in a random order
    requests, k = [], 0
    for i in range(n):
        rid = f"{cfg.run_tag}-{i:06d}"  # fixed width: SGLang aborts every rid a rid prefixes
        stream = rng.random() < 0.5
        abort = None
        if i in abort_indices:
            abort = rng.choice(("rid", "disconnect")) if stream else "rid"
        after_chunks = rng.randint(1, 3)
        delay = round(rng.uniform(0.05, 3.0), 3)
        if i in det_indices:
            spec = specs[spec_of[k]]
            k += 1
            requests.append(PlannedRequest(
                i, rid, spec.endpoint, stream, spec.spec_id, abort, after_chunks, delay,
                det_body(spec, stream=stream, rid=rid), spec.max_new_tokens))
        else:
            endpoint = rng.choice(ENDPOINTS)
            max_new = rng.randint(cfg.min_new_tokens, cfg.max_new_tokens)
            body = _normal_body(rng, endpoint, stream, rid, max_new, cfg.max_prompt_words)
            requests.append(PlannedRequest(i, rid, endpoint, stream, None, abort, after_chunks,
                                           delay, body, max_new))
    return Plan(specs, requests)
