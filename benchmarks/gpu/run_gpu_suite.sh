#!/usr/bin/env bash
# run_gpu_suite.sh - llm42 benchmarks and determinism proof on the air-gapped H200 host.
#
# Usage (from the repository root, on the GPU host; prepare .gpu/ first on a CPU machine with
# `python -m benchmarks.gpu.prepare_assets` and send it along, e.g. device carry [".gpu"]):
#   bash benchmarks/gpu/run_gpu_suite.sh STEP [STEP ...]
#
# Steps (each one independent; `setup` runs implicitly and is idempotent):
#   setup                      install the SGLang bundle + llm42 (offline), write the checkpoints
#   proof                      determinism proof, llama-3.2-1b shape with random-normal weights,
#                              modes llm42 and control on one --enable-llm42 server
#   proof-smollm2              the same proof on SmolLM2-135M-Instruct ($SMOLLM2_WEIGHTS)
#   proof-row-invariant        the proof with --llm42-verifier row-invariant (triton) at W 16
#                              B 32, every decode step of at most R rows inline
#                              (--llm42-inline-pad-ratio 1e9) and prompts' rows inline with their
#                              prefill, then on a second server at W 64 B 4 verifying as
#                              $PROOF_SECOND_VERIFY says (default --no-llm42-inline-verify: passes
#                              verify every prompt and token; "--llm42-inline-pad-ratio 0": inline
#                              on, only full steps inline, so due windows ride in decode steps,
#                              --llm42-fold-passes) whose every trial must also equal the first server's
#                              outputs bitwise (--reference); features
#                              without lora; the prefix cache follows the radix cache: off on
#                              the first server (the default COMMON_ARGS), on on the second
#                              (--disable-radix-cache dropped from its COMMON_ARGS)
#   proof-spec                 the proof on speculative servers (issue 37), SmolLM2
#                              ($SMOLLM2_WEIGHTS; real: acceptance that means something), features
#                              $PROOF_SPEC_FEATURES (SGLang serves LoRA only with NGRAM), one
#                              server per sub-run of $PROOF_SPEC_RUNS, each in proof-spec/RUN/:
#                              none (llm42 without speculation, mode llm42 only: the reference),
#                              ngram (--speculative-algorithm NGRAM --speculative-num-draft-tokens
#                              4), standalone (SmolLM2 its own draft: --speculative-draft-model-path
#                              $MODEL_SMOL --speculative-num-steps 3 --speculative-eagle-topk 1
#                              --speculative-num-draft-tokens 4), eagle (the same with a random
#                              one-layer EAGLE draft written next to the model, `llm42.models
#                              random-eagle`: no trained EAGLE draft of SmolLM2 exists offline,
#                              so its acceptance is ~1 and it proves the EAGLE code path only).
#                              Every llm42 trial of a sub-run must also equal, bitwise, the
#                              outputs of each earlier sub-run in that order whose proof.json is
#                              on this machine (--reference, this call's or an earlier call's).
#                              proof.md gives the accept length. Priced by benchmarks.gpu.estimate
#                              (the H200 SmolLM2-real proof x 3 for 24 requests, 100 s per start,
#                              speculation priced as without: a guess) with PROOF_BACKGROUND=0,64
#                              PROOF_REPEATS=1: PROOF_SPEC_RUNS=none,ngram 362 s (+45 s for
#                              SmolLM2's conversion on a fresh machine), then standalone,eagle
#                              394 s: two calls on one warm machine (all four: 726 s)
#   proof-tp                   the proof at TP = $PROOF_TP (default 2, NCCL; needs that many GPUs),
#                              llama-3.2-1b shape; TP_DET_ALLREDUCE=1 adds SGLang's deterministic
#                              all-reduce settings (NCCL_ALGO=allreduce:tree, no custom all-reduce)
#   bench-WORKLOAD[-CONFIG]    driver run; WORKLOAD: sharegpt | arxiv | random1k (1024 in/256
#                              out) | random4k (4096/1024) | decode256 ($DECODE_PROMPTS prompts
#                              of 128 tokens, 512 out, all at once: a long decode phase at
#                              $DECODE_PROMPTS rows whose ITL p50 is one decode step; det ratio 0
#                              vs 1 on one llm42 server prices an inline step against a plain
#                              one) | mix (all of $WORKLOADS on each
#                              server start); CONFIG: nondet | nondet-defaults |
#                              nondet-no-overlap | sglang-det | llm42 | llm42-skip-compare |
#                              llm42-inject | llm42-no-overlap | llm42-batched-prefill | all
#                              (default: nondet, sglang-det, llm42); Llama-3.1-8B shape, dummy
#                              weights. nondet is plain SGLang like-for-like with llm42 (the
#                              COMMON_ARGS below); nondet-defaults is plain SGLang as a user runs
#                              it: COMMON_ARGS without --sampling-backend, --disable-radix-cache
#                              and --cuda-graph-backend-prefill (SGLang's default sampler, radix
#                              cache on, prefill CUDA graphs on; still triton attention)
#   spec-sharegpt              speculative decoding on vs off (issue 37), ShareGPT on SmolLM2
#                              ($SMOLLM2_WEIGHTS), one server per config of $SPEC_CONFIGS
#                              (default nondet, nondet-no-overlap, nondet-spec, llm42, llm42-spec;
#                              *-spec: $SPEC_ARGS, labels name the algorithm; llm42 turns the
#                              overlap scheduler off there, nondet-no-overlap is plain SGLang
#                              without it) at $SPEC_RATIOS; rows and tables.md carry SGLang's
#                              accept length (spec_accept_length, det_ / normal_ too). Priced
#                              by benchmarks.gpu.estimate (SPEC_PROMPTS=1024, 100 s per start,
#                              the H100 SmolLM2-real rows; speculative runs as without: guesses):
#                              SPEC_CONFIGS=nondet,nondet-no-overlap,nondet-spec 446 s (+45 s
#                              conversion on a fresh machine), then llm42,llm42-spec 441 s: two
#                              calls on one warm machine, speculation on and off in each (all
#                              five: 857 s)
#   smollm2-sweep              llm42 at ratio 1.0, windows $SWEEP_WINDOWS, + nondet, SmolLM2 shape;
#                              with SWITCH_VARIANTS=1 every window runs on one llm42 server start
#                              (started with the largest, the others switched in at runtime)
#   online                     ShareGPT at --request-rate $ONLINE_RATE (comma-separated: a load
#                              curve, every rate on each server): nondet, sglang-det, llm42 at $ONLINE_RATIO
#   backend-compare            what --enable-llm42 should pick without --attention-backend: llm42
#                              at $BACKEND_RATIOS on flashinfer, then on triton (one server
#                              each), ShareGPT; tables.md has each one's throughput
#   kv-split-cost              issue 34: one layer of Triton decode attention, 8B shape, per KV
#                              split policy (SGLang's, the row pass's maximum, a tile of T
#                              tokens); no server, ~30 s (benchmarks/kv_split_cost.py)
#   lm-head-cost               the LM head per decode batch size, 8B shape: SGLang's bf16, fp32
#                              for every row (llm42 before issue 33), fp32 for the deterministic
#                              rows only (now); ~20 s (benchmarks/lm_head_cost.py)
#   row-invariance             issue 34 step 1, no server: whether GEMM rows (8B linears, M =
#                              1..512; cuBLAS, SGLang's batch-invariant Triton matmul, a fixed-tile
#                              Triton GEMM) and attention rows (triton, flashinfer, torch_native)
#                              keep their bits whatever else the batch holds; ~180 s, less with
#                              a warm kernel cache (FlashInfer's JIT runs only with 150 s left)
#   report                     merge every results.jsonl of this run into one table + plots
#   save-jit-cache             pack the kernel caches the servers filled (Triton, ~/.cache) into
#                              $OUT/jit-cache.tar.gz; put it in .gpu-jit/ and carry it to later
#                              calls: a fresh machine then starts its first server in ~30 s
#                              instead of ~100 s (decode graph capture compiles kernels cold)
#
# Every step writes into $RUN_DIR/STEP and is packed into $OUT/STEP.tar.gz when it ends; its
# rows are appended to $OUT/results.jsonl and its table to $OUT/tables.md (the device returns at
# most 8 files: keep to 5 steps per call). Copy earlier calls' results.jsonl files into
# .gpu/results/ and run the `report` step (or `driver --report-only` anywhere) to merge them.
# The whole call has a deadline of $SUITE_BUDGET_S seconds (default 540: the device allows 600
# per call): a driver step starts no server with less than $MIN_CONFIG_S left and no benchmark
# with less than 30 s; what it did not run becomes skipped rows saying so. Split long steps with
# DET_RATIOS (e.g. DET_RATIOS=0.02,0.1 then DET_RATIOS=0.5,1.0) across calls.
#
# Environment (defaults): OUT=./gpu-out RUN_DIR=/tmp/llm42-suite BUNDLE=.gpu/bundle
#   PREFIX=/tmp/sgl PORT=30000 SUITE_BUDGET_S=540 MIN_CONFIG_S=180 STARTUP_TIMEOUT=400
#   DET_RATIOS=0.02,0.1,0.5,1.0 VARIANT_RATIOS=0.1,1.0 WORKLOADS=sharegpt,arxiv,random1k WINDOW=64 VERIFY_BS=8 INJECT_RATE=0.5 (SmolLM2's
#   real weights rolled back 54 % of W = 64 windows on the H200: h200-2026-12-03-smollm2-batched-prefill/)
#   SHAREGPT_PROMPTS=2048 ARXIV_PROMPTS=256 RANDOM1K_PROMPTS=1024 RANDOM4K_PROMPTS=256
#   DECODE_PROMPTS=256
#   PASS_TOKENS (unset: B = VERIFY_BS) N: B = N / W for each window of a comma-separated WINDOW,
#   e.g. WINDOW=16,32,64 PASS_TOKENS=512 (W 16 B 32, W 32 B 16, W 64 B 8 on one server start
#   with SWITCH_VARIANTS=1: B is switched at runtime too)
#   SWEEP_WINDOWS=16,32,64,128 SWEEP_PROMPTS=1024 SWEEP_CONFIGS=nondet,llm42 (llm42: recompute %
#   per window needs no baseline; nondet adds the throughput reference) SWEEP_SAMPLING="" (';'
#   separates sampling settings, each a workload of the sweep on every server start, e.g.
#   ";--temperature 0.7 --top-p 0.9 --sampling-seed 1" = greedy, then seeded top-p)
#   SMOLLM2_WEIGHTS=random|dummy|real (real: the GGUF
#   parts in GGUF_DIR=/tmp/llm42-gguf, see prepare_assets --smollm2-gguf)
#   ONLINE_RATE=24 ONLINE_PROMPTS=1024 ONLINE_RATIO=0.1 MAX_RUNNING=256
#   BACKEND_MODEL=8b|smollm2 BACKEND_PROMPTS=256 BACKEND_RATIOS=0.1 BACKEND_WARMUP=32 (backend-
#   compare: the Llama-3.1-8B shape of the headline, dummy weights, or the SmolLM2 shape with
#   $SMOLLM2_WEIGHTS weights; two server starts: ~150 s with warm kernel caches, ~300 s cold)
#   PROOF_BACKGROUND=0,16,64,256 PROOF_REPEATS=2 PROOF_PROMPTS=4 PROOF_TOKENS=256
#   PROOF_LLM42_ARGS="" (extra llm42 flags of the proof server, e.g. --llm42-batched-prefill)
#   PROOF_MODE=both (llm42: no control run) PROOF_REFERENCE="" (proof.json files, space-separated:
#   every llm42 trial must equal their outputs too)
#   PROOF_SPEC_RUNS=none,ngram,standalone,eagle PROOF_SPEC_FEATURES=n2,penalty,json (proof-spec)
#   SPEC_ARGS="--speculative-algorithm NGRAM --speculative-num-draft-tokens 4" SPEC_RATIOS=0.1,1.0
#   SPEC_PROMPTS=1024 SPEC_CONFIGS=nondet,nondet-no-overlap,nondet-spec,llm42,llm42-spec
#   (spec-sharegpt)
#   PROOF_FEATURES=n2,penalty,json,lora (sampling-API requests added per prompt; lora: a random
#   adapter written next to the model, served with --lora-backend $PROOF_LORA_BACKEND, default
#   csgmv, SGLang's own, proven on the H200 2026-12-05; another LoRA backend needs
#   PROOF_LLM42_ARGS=--llm42-allow-unproven-backend). PROOF_FEATURES="" runs the proof without them
#   LLM42_ARGS="" (extra flags of every llm42 server of the driver steps, e.g.
#   "--llm42-max-verify-wait 64"; they also name the server in the tables; ';' separates
#   variants, one server each: ";--llm42-max-verify-wait 64" = defaults, then wait 64)
#   ARGS_VARIANT_RATIOS="" (ratios of the LLM42_ARGS variants after the first; default DET_RATIOS.
#   Variants differing only in --llm42-max-verify-wait, --[no-]llm42-overlap-verify or
#   --llm42-max-finish-wait share a server
#   with SWITCH_VARIANTS=1, switched at runtime)
#   BENCH_CONFIGS=nondet,sglang-det,llm42 (configs of a bench-WORKLOAD step without -CONFIG)
#   PREFILL_GRAPHS=0 (1: keep SGLang's prefill CUDA graphs for every config)
#   TIMELINE=0 (1: every server, baselines too, records a step timeline, summarized in
#   STEP/timeline_LABEL/)
#   SYNC_DEBUG=0 (1, with TIMELINE=1: every server counts its synchronizing CUDA calls by the line
#   that made them, LLM42_SYNC_DEBUG=1, llm42.sglang.sync_sites: a diagnostic, not a measurement)
#   HOOK_TIMES=0 (1, with TIMELINE=1: every llm42 hook's own host time, per hook and per
#   iteration, LLM42_HOOK_TIMES=1, llm42.sglang.hook_times: a diagnostic, not a measurement)
#   IMPORT_PROFILE=0 (1: setup logs the slowest imports of `import sglang.launch_server`, -X importtime,
#   into OUT/importtime.txt: what a server start spends before its first log line)
#   PROFILE_STEPS=0 (N > 0: every benchmark run of a driver step takes one torch.profiler trace
#   of N forward steps of its server, CPU + GPU with python stacks, once PROFILE_RUNNING=200
#   requests run and none wait, summarized by benchmarks.step_profile in
#   STEP/profile_LABEL_rRATIO_WORKLOAD/profile.md: GPU busy vs idle per step, host syncs and
#   the python functions around them; STEP.tar.gz leaves the *.trace.json.gz out, they come
#   back in $OUT/STEP-traces.tar.gz, one more file, when under 15 MiB in all. 5 is plenty)
#   WARMUP_REQUESTS (unset: bench_serving's one warm-up request per run) N: the run's first N
#   requests, 16 new tokens each and deterministic where the run's are (and one deterministic
#   request past a window on llm42 servers), before each timed run; the first run
#   after a server start or window switch otherwise pays first-use warm-up (the SmolLM2 sweep's
#   W = 128 row: prefill steps 33 ms against 19-21 ms later). 64 is plenty
#   REPEATS=1 (N: every config, workload and ratio of a driver step runs N times in a row on its
#   server, rows numbered by `repeat`, baselines the mean of their runs: a fresh server's first
#   run against its later ones, and the spread between runs)
#   PRESTART=0 (1: each next server of a driver step is launched gated while the current one
#   runs, so its ~50 s of Python imports overlap that run on the host's spare cores and only its
#   GPU work waits for the current server to stop: `benchmarks.driver --prestart-next`,
#   llm42.sglang.start_gate; a results README says the rows ran beside those imports)
#   SWITCH_VARIANTS=1 (llm42-skip-compare / llm42-inject and the other windows of
#   --window-sizes run on the llm42 server of the step, switched by POST /llm42_benchmark_mode:
#   a server start saved per variant and window, ~100 s each; 0: one start each)
#   DRY_RUN=0 (1: install nothing, start nothing; every python command the steps would run is
#   appended to $OUT/dry_run.jsonl as a JSON argv; tests/test_bench_gpu.py checks them; price
#   the call with `python -m benchmarks.gpu.estimate $OUT/dry_run.jsonl --budget-s N` first)
#   JIT_CACHE=.gpu-jit/jit-cache.tar.gz (restored before the first step when present)
#   ROW_INVARIANCE_ARGS="" (extra benchmarks.row_invariance args, e.g. "--quick" or
#   "--attention triton-extend,triton-extend-unified")
#   COMMON_ARGS (server args for every config; see below) EXTRA_SERVER_ARGS=""
#   TP=1 (N > 1: every server of every step runs with --tp-size N, e.g. TP=2 bench-sharegpt)
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${OUT:-$REPO/gpu-out}
RUN_DIR=${RUN_DIR:-/tmp/llm42-suite}
BUNDLE=${BUNDLE:-$REPO/.gpu/bundle}
PREFIX=${PREFIX:-/tmp/sgl}
PYTHON=${PYTHON:-python3}
DRY_RUN=${DRY_RUN:-0}
SUITE_BUDGET_S=${SUITE_BUDGET_S:-540}
MIN_CONFIG_S=${MIN_CONFIG_S:-180}
STARTUP_TIMEOUT=${STARTUP_TIMEOUT:-400}
DET_RATIOS=${DET_RATIOS:-0.02,0.1,0.5,1.0}
VARIANT_RATIOS=${VARIANT_RATIOS:-0.1,1.0}
WORKLOADS=${WORKLOADS:-sharegpt,arxiv,random1k}
WINDOW=${WINDOW:-64}
VERIFY_BS=${VERIFY_BS:-8}
PASS_TOKENS=${PASS_TOKENS:-}
INJECT_RATE=${INJECT_RATE:-0.5}
MAX_RUNNING=${MAX_RUNNING:-256}
SHAREGPT_PROMPTS=${SHAREGPT_PROMPTS:-2048}
ARXIV_PROMPTS=${ARXIV_PROMPTS:-256}
RANDOM1K_PROMPTS=${RANDOM1K_PROMPTS:-1024}
RANDOM4K_PROMPTS=${RANDOM4K_PROMPTS:-256}
DECODE_PROMPTS=${DECODE_PROMPTS:-256}
SWEEP_WINDOWS=${SWEEP_WINDOWS:-16,32,64,128}
SWEEP_PROMPTS=${SWEEP_PROMPTS:-1024}
SWEEP_CONFIGS=${SWEEP_CONFIGS:-nondet,llm42}
SWEEP_SAMPLING=${SWEEP_SAMPLING:-}
SMOLLM2_WEIGHTS=${SMOLLM2_WEIGHTS:-random}
ONLINE_RATE=${ONLINE_RATE:-24}
ONLINE_PROMPTS=${ONLINE_PROMPTS:-1024}
ONLINE_RATIO=${ONLINE_RATIO:-0.1}
BACKEND_MODEL=${BACKEND_MODEL:-8b}
BACKEND_PROMPTS=${BACKEND_PROMPTS:-256}
BACKEND_RATIOS=${BACKEND_RATIOS:-0.1}
BACKEND_WARMUP=${BACKEND_WARMUP:-32}
PROOF_BACKGROUND=${PROOF_BACKGROUND:-0,16,64,256}
PROOF_REPEATS=${PROOF_REPEATS:-2}
PROOF_PROMPTS=${PROOF_PROMPTS:-4}
PROOF_TOKENS=${PROOF_TOKENS:-256}
PROOF_LLM42_ARGS=${PROOF_LLM42_ARGS:-}
PROOF_FEATURES=${PROOF_FEATURES-n2,penalty,json,lora}
PROOF_LORA_BACKEND=${PROOF_LORA_BACKEND:-csgmv}
PROOF_MODE=${PROOF_MODE:-both}
PROOF_REFERENCE=${PROOF_REFERENCE:-}
PROOF_SECOND_VERIFY=${PROOF_SECOND_VERIFY:---no-llm42-inline-verify}
PROOF_SPEC_RUNS=${PROOF_SPEC_RUNS:-none,ngram,standalone,eagle}
PROOF_SPEC_FEATURES=${PROOF_SPEC_FEATURES-n2,penalty,json}
SPEC_ARGS=${SPEC_ARGS:-"--speculative-algorithm NGRAM --speculative-num-draft-tokens 4"}
SPEC_RATIOS=${SPEC_RATIOS:-0.1,1.0}
SPEC_PROMPTS=${SPEC_PROMPTS:-1024}
SPEC_CONFIGS=${SPEC_CONFIGS:-nondet,nondet-no-overlap,nondet-spec,llm42,llm42-spec}
LLM42_ARGS=${LLM42_ARGS:-}
ARGS_VARIANT_RATIOS=${ARGS_VARIANT_RATIOS:-}
EXTRA_SERVER_ARGS=${EXTRA_SERVER_ARGS:-}
# Identical for every configuration but nondet-defaults, which drops the like-for-like flags
# (benchmarks/driver.py LIKE_FOR_LIKE_FLAGS: the pytorch sampler llm42 needs, no radix cache, no
# prefill graphs) and keeps the rest (README of the bundle: triton attention, the one backend that
# works on the host; a cap on running requests so sglang-det does not run out of memory).
# PREFILL_GRAPHS=1 keeps SGLang's prefill CUDA graphs (~75 s more per server start): normal
# prefills and the B x W verification pass (512 tokens, a captured size) then replay graphs.
PREFILL_GRAPHS=${PREFILL_GRAPHS:-0}
TIMELINE=${TIMELINE:-0}
SYNC_DEBUG=${SYNC_DEBUG:-0}
[[ $SYNC_DEBUG == 1 ]] && export LLM42_SYNC_DEBUG=1  # the servers inherit it
HOOK_TIMES=${HOOK_TIMES:-0}
[[ $HOOK_TIMES == 1 ]] && export LLM42_HOOK_TIMES=1
IMPORT_PROFILE=${IMPORT_PROFILE:-0}
PROFILE_STEPS=${PROFILE_STEPS:-0}
PROFILE_RUNNING=${PROFILE_RUNNING:-200}
SWITCH_VARIANTS=${SWITCH_VARIANTS:-1}
PRESTART=${PRESTART:-0}
REPEATS=${REPEATS:-1}
WARMUP_ARG=${WARMUP_REQUESTS:+ --warmup-requests $WARMUP_REQUESTS}
PREFILL_GRAPH_ARG=--cuda-graph-backend-prefill=disabled
[[ $PREFILL_GRAPHS == 1 ]] && PREFILL_GRAPH_ARG=
TP=${TP:-1}
PROOF_TP=${PROOF_TP:-2}
TP_DET_ALLREDUCE=${TP_DET_ALLREDUCE:-0}
TP_ARG=""
(( TP > 1 )) && TP_ARG=" --tp-size $TP"
COMMON_ARGS=${COMMON_ARGS:-"--attention-backend triton --sampling-backend pytorch --disable-radix-cache --max-running-requests $MAX_RUNNING $PREFILL_GRAPH_ARG --cuda-graph-max-bs-decode $MAX_RUNNING$TP_ARG $EXTRA_SERVER_ARGS"}

LLM42_SITE=$PREFIX/llm42-site
MODELS=$RUN_DIR/models
DATA=$RUN_DIR/data
MODEL_8B=${MODEL_8B:-$PREFIX/assets/models/Llama-3.1-8B-Instruct-dummy}
MODEL_1B=${MODEL_1B:-$MODELS/llama-3.2-1b-random}
MODEL_SMOL=$MODELS/smollm2-135m-$SMOLLM2_WEIGHTS
GGUF_DIR=${GGUF_DIR:-/tmp/llm42-gguf}
SHAREGPT=$REPO/.gpu/data/sharegpt_first_turns.json.xz
JIT_CACHE=${JIT_CACHE:-$REPO/.gpu-jit/jit-cache.tar.gz}
JIT_DIRS=(.triton/cache .cache)  # under $HOME; pip and huggingface excluded when packing
ARXIV=$DATA/arxiv_like.jsonl
mkdir -p "$OUT" "$RUN_DIR"
exec > >(tee -a "$OUT/suite.log") 2>&1
T0=$(date +%s)
log() { echo "[suite +$(( $(date +%s) - T0 ))s] $*"; }
remaining() { echo $(( SUITE_BUDGET_S - ($(date +%s) - T0) )); }

setup() {
  [[ -f $RUN_DIR/.setup-done || $DRY_RUN == 1 ]] && return 0
  [[ -f $BUNDLE/install.sh ]] || { log "no $BUNDLE/install.sh: run prepare_assets first"; return 1; }
  if [[ ! -f $PREFIX/env.sh ]]; then
    log "installing the SGLang bundle into $PREFIX"
    PYTHON=$PYTHON bash "$BUNDLE/install.sh" "$BUNDLE" "$PREFIX" || return 1
  fi
  # shellcheck disable=SC1091
  source "$PREFIX/env.sh"
  log "installing llm42 into $LLM42_SITE (copy + dist-info with the sglang.srt.plugins entry point)"
  "$PYTHON" "$REPO/benchmarks/gpu/install_llm42.py" --target "$LLM42_SITE" --root "$REPO" || return 1
  env_python -c "
from importlib.metadata import entry_points
eps = [e for e in entry_points(group='sglang.srt.plugins') if e.name == 'llm42']
assert eps, 'llm42 entry point not visible'
eps[0].load(); import llm42, sglang
print('plugin entry point OK:', eps[0].value, 'llm42 from', llm42.__file__, 'sglang', sglang.__version__)
" || return 1
  if [[ $IMPORT_PROFILE == 1 ]]; then  # where a server start's first ~25 s of imports go
    env_python -X importtime -c "import sglang.launch_server" 2> "$OUT/importtime.txt"
    log "slowest imports (cumulative us, $OUT/importtime.txt):"
    sort -t'|' -k2 -n -r "$OUT/importtime.txt" | head -15
  fi
  mkdir -p "$MODELS" "$DATA"
  touch "$RUN_DIR/.setup-done"
}

env_python() {  # llm42's copy first, the repo (for `benchmarks`) last; never cwd = the repo
  if [[ $DRY_RUN == 1 ]]; then
    "$PYTHON" -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@" >> "$OUT/dry_run.jsonl"
    return 0
  fi
  (cd "$RUN_DIR" && PYTHONPATH="$LLM42_SITE:${PYTHONPATH:-}:$REPO" \
     LLM42_GIT_COMMIT="${LLM42_GIT_COMMIT:-$(cat "$REPO/.gpu/GIT_COMMIT" 2>/dev/null)}" \
     PYTHONUNBUFFERED=1 "$PYTHON" "$@")
}

model_1b() {
  [[ -f $MODEL_1B/model.safetensors || $DRY_RUN == 1 ]] && return 0
  log "writing $MODEL_1B (llama-3.2-1b shape, N(0, 0.02^2) weights, bf16, Llama-3 tokenizer)"
  env_python -m llm42.models random-llama --preset llama-3.2-1b --out "$MODEL_1B" \
    --dtype bfloat16 --seed 0 --tokenizer "$MODEL_8B"
}

model_smollm2() {
  [[ -f $MODEL_SMOL/config.json || $DRY_RUN == 1 ]] && return 0
  case $SMOLLM2_WEIGHTS in
    dummy) mkdir -p "$MODEL_SMOL" && cp "$REPO"/.gpu/smollm2/* "$MODEL_SMOL"/ ;;
    real) smollm2_real ;;
    *) smollm2_random ;;
  esac
}

smollm2_real() {  # the GGUF arrived in parts in $GGUF_DIR (prepare_assets --smollm2-gguf)
  local gguf=$GGUF_DIR/SmolLM2-135M-Instruct.Q4_1.gguf
  log "joining $GGUF_DIR/part* and converting SmolLM2-135M-Instruct (real weights) to $MODEL_SMOL"
  cat "$GGUF_DIR"/part[0-9] > "$gguf" || return 1
  (cd "$GGUF_DIR" && sha256sum -c SHA256) || { log "GGUF checksum mismatch: resend the parts"; return 1; }
  "$PYTHON" -m pip install -q --no-index --no-deps --target "$PREFIX/extra-site" \
    "$REPO"/.gpu/wheels-extra/*.whl || return 1
  PYTHONPATH="$PREFIX/extra-site:${PYTHONPATH:-}" env_python - "$gguf" "$MODEL_SMOL" <<'EOF'
import sys
from pathlib import Path
from llm42.models.smollm2 import convert_gguf
convert_gguf(Path(sys.argv[1]), Path(sys.argv[2]))
print("converted", sys.argv[2])
EOF
}

smollm2_random() {
  log "writing $MODEL_SMOL (SmolLM2-135M shape, random-normal weights)"
  env_python - "$REPO/.gpu/smollm2" "$MODEL_SMOL" <<'EOF'
import json, sys
from llm42.models import write_random_llama
src, out = sys.argv[1], sys.argv[2]
cfg = json.load(open(f"{src}/config.json"))
keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings",
        "rms_norm_eps", "tie_word_embeddings")
over = {k: cfg[k] for k in keys if k in cfg}
over["rope_theta"] = (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta", 1e4))
print(write_random_llama(out, preset="tiny", dtype="bfloat16", tokenizer_dir=src, overrides=over))
EOF
}

arxiv_data() {
  # its progress line goes to stderr: workload_args captures stdout
  [[ -f $ARXIV ]] || env_python -m benchmarks.make_arxiv_like --out "$ARXIV" --num-records 512 --seed 0 >&2
}

restore_jit_cache() {
  [[ -f $JIT_CACHE && ! -f $RUN_DIR/.jit-restored && $DRY_RUN != 1 ]] || return 0
  tar -xzf "$JIT_CACHE" -C "$HOME" && touch "$RUN_DIR/.jit-restored" \
    && log "restored kernel caches from $JIT_CACHE ($(du -sh "$JIT_CACHE" | cut -f1))"
}

save_jit_cache() {
  [[ $DRY_RUN != 1 ]] || { log "dry run: would pack the kernel caches"; return 0; }
  local dirs=() d
  for d in "${JIT_DIRS[@]}"; do [[ -d $HOME/$d ]] && dirs+=("$d"); done
  [[ ${#dirs[@]} -gt 0 ]] || { log "no kernel caches under $HOME"; return 0; }
  (cd "$HOME" && du -sh "${dirs[@]}" .cache/* 2>/dev/null | sed 's/^/jit cache: /')
  tar -czf "$OUT/jit-cache.tar.gz" -C "$HOME" --exclude=.cache/pip --exclude=.cache/huggingface \
    "${dirs[@]}" && log "packed $OUT/jit-cache.tar.gz ($(du -sh "$OUT/jit-cache.tar.gz" | cut -f1))"
}

pack() {  # $1 = step name. The device returns at most 8 files: per call suite.log,
  # results.jsonl and tables.md (appended by every step) and one STEP.tar.gz per step.
  local step=$1 dir=$RUN_DIR/$1
  [[ -d $dir ]] || return 0
  [[ -f $dir/results.jsonl && $step != report ]] && cat "$dir/results.jsonl" >> "$OUT/results.jsonl"
  for f in "$dir"/table.md "$dir"/proof.md "$dir"/*/proof.md; do  # sub-runs' proofs too
    [[ -f $f ]] && { echo "## ${f#"$RUN_DIR"/}"; cat "$f"; echo; } >> "$OUT/tables.md"
  done
  tar -czf "$OUT/$step.tar.gz" --exclude='*.trace.json.gz' -C "$RUN_DIR" "$step" \
    && log "packed $OUT/$step.tar.gz"
  local traces=() f bytes  # PROFILE_STEPS' raw traces: their own tarball, if small enough
  while IFS= read -r -d '' f; do traces+=("${f#"$RUN_DIR"/}"); done \
    < <(find "$dir" -name '*.trace.json.gz' -print0 | sort -z)
  (( ${#traces[@]} )) || return 0
  bytes=$(cd "$RUN_DIR" && du -cb "${traces[@]}" | tail -1 | cut -f1)
  if (( bytes < 15 * 1024 * 1024 )); then
    tar -czf "$OUT/$step-traces.tar.gz" -C "$RUN_DIR" "${traces[@]}" \
      && log "packed $OUT/$step-traces.tar.gz (${#traces[@]} traces, $bytes bytes)"
  else
    log "left out ${#traces[@]} profiler traces ($bytes bytes in all, 15 MiB at most):"
    (cd "$RUN_DIR" && du -h "${traces[@]}" | sed 's/^/  /')
  fi
}

driver() {  # $1 = step name, $2 = model, $3 = configs, $4 = ratios, then driver args
  local step=$1 model=$2 configs=$3 ratios=$4; shift 4
  local fmt="" budget variant variants=() llm42_args=()
  IFS=';' read -ra variants <<< "$LLM42_ARGS;"  # one llm42 server per ';'-separated variant
  for variant in "${variants[@]:-}"; do llm42_args+=("--llm42-args=$variant"); done
  [[ $TIMELINE == 1 ]] && llm42_args+=(--timeline)
  (( PROFILE_STEPS > 0 )) && llm42_args+=(--profile-steps "$PROFILE_STEPS" --profile-running "$PROFILE_RUNNING")
  [[ $SWITCH_VARIANTS == 1 ]] && llm42_args+=(--switch-variants)
  (( REPEATS > 1 )) && llm42_args+=(--repeats "$REPEATS")
  [[ $PRESTART == 1 ]] && llm42_args+=(--prestart-next)
  budget=$(( $(remaining) - 20 ))  # leave time to pack the results
  if (( budget < MIN_CONFIG_S )); then log "step $step: skipped, only ${budget}s left"; return 1; fi
  [[ $model == "$MODEL_8B" || $SMOLLM2_WEIGHTS == dummy && $model == "$MODEL_SMOL" ]] && fmt="--load-format dummy"
  log "step $step: configs $configs ratios $ratios model $model"
  env_python -m benchmarks.driver --model-path "$model" --out-dir "$RUN_DIR/$step" \
    --configs "$configs" --det-ratios "$ratios" --variant-ratios "$VARIANT_RATIOS" \
    ${ARGS_VARIANT_RATIOS:+--args-variant-ratios "$ARGS_VARIANT_RATIOS"} \
    --verify-batch-size "$VERIFY_BS" ${PASS_TOKENS:+--pass-tokens "$PASS_TOKENS"} \
    --inject-mismatch-rate "$INJECT_RATE" --server-args "$COMMON_ARGS $fmt --random-seed 7" --port "${PORT:-30000}" \
    --startup-timeout "$STARTUP_TIMEOUT" --budget-s "$budget" --min-config-s "$MIN_CONFIG_S" \
    "${llm42_args[@]}" "$@"
  local code=$?
  log "step $step: driver exit $code"
  return $code
}

workload_args() {  # $1 = sharegpt | arxiv | random1k | random4k | decode256: one --workload string
  case $1 in
    sharegpt) echo "--dataset-name sharegpt --dataset-path $SHAREGPT --num-prompts $SHAREGPT_PROMPTS" ;;
    arxiv)    arxiv_data; echo "--dataset-name arxiv --dataset-path $ARXIV --num-prompts $ARXIV_PROMPTS" ;;
    random1k) echo "--dataset-name random --random-input-len 1024 --random-output-len 256 --random-range-ratio 1.0 --num-prompts $RANDOM1K_PROMPTS" ;;
    random4k) echo "--dataset-name random --random-input-len 4096 --random-output-len 1024 --random-range-ratio 1.0 --num-prompts $RANDOM4K_PROMPTS" ;;
    decode256) echo "--dataset-name random --random-input-len 128 --random-output-len 512 --random-range-ratio 1.0 --num-prompts $DECODE_PROMPTS" ;;
    *) log "unknown workload $1"; return 1 ;;
  esac
}

bench_step() {  # bench-WORKLOAD[-CONFIG]; WORKLOAD "mix" = every workload of $WORKLOADS on
  # each server start (one start per configuration instead of one per workload and config)
  local rest=${1#bench-} workload config names w
  workload=${rest%%-*}
  config=${rest#"$workload"}; config=${config#-}
  case $config in
    "") config=${BENCH_CONFIGS:-nondet,sglang-det,llm42} ;;
    all) config=nondet,nondet-defaults,sglang-det,llm42,llm42-skip-compare,llm42-inject ;;
  esac
  names=$workload; [[ $workload == mix ]] && names=${WORKLOADS//,/ }
  local wl=()
  for w in $names; do wl+=(--workload "$(workload_args "$w")") || return 1; done
  driver "$1" "$MODEL_8B" "$config" "$DET_RATIOS" --window-sizes "$WINDOW" \
    "${wl[@]}" --bench-args "--seed 1$WARMUP_ARG"
}

proof_step() {  # $1 = model folder, $2 = the function that writes it, $3 = more server args;
  # $step from run_step
  local model=$1 extra=${3:-}
  $2 || return 1
  if (( $(remaining) < 240 )); then log "step $step: skipped, only $(remaining)s left"; return 1; fi
  log "step $step: $model, background $PROOF_BACKGROUND x $PROOF_REPEATS repeats, features '$PROOF_FEATURES'"
  local lora_args="" lora_name=()
  if [[ ,$PROOF_FEATURES, == *,lora,* ]]; then
    local adapter="$model-lora"
    [[ -f $adapter/adapter_model.safetensors ]] || \
      env_python -m llm42.models random-lora --base "$model" --out "$adapter" --seed 1 || return 1
    lora_args="--enable-lora --lora-paths proof=$adapter --max-loras-per-batch 2 --lora-backend $PROOF_LORA_BACKEND"
    lora_name=(--lora-name proof)
  fi
  local ref refs=()
  for ref in $PROOF_REFERENCE; do refs+=(--reference "$ref"); done
  env_python -m benchmarks.determinism_proof --launch --model-path "$model" \
    --server-args "$COMMON_ARGS --enable-llm42 --llm42-window-size $WINDOW --llm42-verify-batch-size $VERIFY_BS --random-seed 7 $lora_args $PROOF_LLM42_ARGS$extra" \
    --mode "$PROOF_MODE" --background "$PROOF_BACKGROUND" --repeats "$PROOF_REPEATS" \
    --num-prompts "$PROOF_PROMPTS" --max-new-tokens "$PROOF_TOKENS" \
    --features "$PROOF_FEATURES" "${lora_name[@]}" "${refs[@]}" \
    --startup-timeout "$STARTUP_TIMEOUT" --out-dir "$RUN_DIR/$step"
  local code=$?
  log "step $step: exit $code (0: llm42 all identical and control diverged)"
  return $code
}

eagle_draft() {  # a random one-layer EAGLE draft of $MODEL_SMOL (no trained one offline)
  model_smollm2 || return 1
  [[ -f $MODEL_SMOL-eagle/model.safetensors ]] || \
    env_python -m llm42.models random-eagle --base "$MODEL_SMOL" --out "$MODEL_SMOL-eagle" --seed 1
}

spec_run_args() {  # $1 = a proof-spec sub-run: its speculative server flags
  local draft=" --speculative-num-steps 3 --speculative-eagle-topk 1"
  draft+=" --speculative-num-draft-tokens 4 --speculative-draft-model-path"
  case $1 in
    none) echo "" ;;
    ngram) echo " --speculative-algorithm NGRAM --speculative-num-draft-tokens 4" ;;
    standalone) echo " --speculative-algorithm STANDALONE$draft $MODEL_SMOL" ;;
    eagle) echo " --speculative-algorithm EAGLE$draft $MODEL_SMOL-eagle" ;;
  esac
}

proof_spec() {  # $step = proof-spec; the sub-runs of $PROOF_SPEC_RUNS in a fixed order, each
  # compared with every earlier one's outputs found on this machine (a dry run: planned ones)
  local top=$step run proof writer mode refs=() status=0
  for run in none ngram standalone eagle; do
    proof=$RUN_DIR/$top/$run/proof.json
    if [[ ,$PROOF_SPEC_RUNS, == *,$run,* ]]; then
      writer=model_smollm2 mode=$PROOF_MODE
      [[ $run == eagle ]] && writer=eagle_draft
      [[ $run == none ]] && mode=llm42  # the reference; its control is proof-smollm2's
      step=$top/$run PROOF_FEATURES=$PROOF_SPEC_FEATURES PROOF_MODE=$mode \
        PROOF_REFERENCE="${refs[*]:-}" proof_step "$MODEL_SMOL" $writer "$(spec_run_args $run)" \
        || status=1
      [[ $DRY_RUN == 1 ]] && { refs+=("$proof"); continue; }
    fi
    [[ -f $proof ]] && refs+=("$proof")
  done
  return $status
}

run_step() {
  local step=$1
  case $step in
    setup) ;;
    proof) proof_step "$MODEL_1B" model_1b ;;
    proof-row-invariant)  # two servers, two (W, B); the second is compared with the first too
      local row="--llm42-verifier row-invariant" top=$step
      step=$top/w16-b32 WINDOW=16 VERIFY_BS=32 PROOF_FEATURES=n2,penalty,json \
        PROOF_LLM42_ARGS="$PROOF_LLM42_ARGS $row --llm42-inline-pad-ratio 1e9" \
        proof_step "$MODEL_1B" model_1b || return 1
      # the radix cache on (the prefix cache follows it): a hit must give a miss's bits
      step=$top/w64-b4 WINDOW=64 VERIFY_BS=4 PROOF_FEATURES=n2,penalty,json \
        COMMON_ARGS="${COMMON_ARGS//--disable-radix-cache/}" \
        PROOF_LLM42_ARGS="$PROOF_LLM42_ARGS $row $PROOF_SECOND_VERIFY" \
        PROOF_REFERENCE="$RUN_DIR/$top/w16-b32/proof.json" proof_step "$MODEL_1B" model_1b ;;
    proof-smollm2) proof_step "$MODEL_SMOL" model_smollm2 ;;
    proof-spec) proof_spec ;;
    proof-tp)  # the proof's server at TP = $PROOF_TP (after a TP=N of COMMON_ARGS: it wins)
      if [[ $TP_DET_ALLREDUCE == 1 ]]; then  # SGLang's deterministic mode at TP > 1, this step only
        (export NCCL_ALGO=allreduce:tree
         proof_step "$MODEL_1B" model_1b " --tp-size $PROOF_TP --disable-custom-all-reduce")
      else
        proof_step "$MODEL_1B" model_1b " --tp-size $PROOF_TP"
      fi ;;
    bench-*) bench_step "$step" ;;
    lm-head-cost) env_python -m benchmarks.lm_head_cost --out-dir "$RUN_DIR/$step" ;;
    kv-split-cost) env_python -m benchmarks.kv_split_cost --out-dir "$RUN_DIR/$step" ;;
    spec-sharegpt)  # speculation on vs off, plain SGLang and llm42, one server per config
      model_smollm2 || return 1
      driver "$step" "$MODEL_SMOL" "$SPEC_CONFIGS" "$SPEC_RATIOS" --window-sizes "$WINDOW" \
        --spec-args "$SPEC_ARGS" \
        --workload "--dataset-name sharegpt --dataset-path $SHAREGPT --num-prompts $SPEC_PROMPTS" \
        --bench-args "--seed 1 --context-len 8192$WARMUP_ARG" ;;
    smollm2-sweep)  # one --workload per ';'-separated $SWEEP_SAMPLING entry, on each start
      model_smollm2 || return 1
      local sampling samplings=() sweeps=()
      IFS=';' read -ra samplings <<< "$SWEEP_SAMPLING"
      for sampling in "${samplings[@]:-}"; do
        sweeps+=(--workload "--dataset-name sharegpt --dataset-path $SHAREGPT $sampling")
      done
      driver "$step" "$MODEL_SMOL" "$SWEEP_CONFIGS" 1.0 --window-sizes "$SWEEP_WINDOWS" \
        "${sweeps[@]}" \
        --bench-args "--seed 1 --num-prompts $SWEEP_PROMPTS --context-len 8192$WARMUP_ARG" ;;
    online)  # one --workload per rate of $ONLINE_RATE: every rate on each server start
      local rate rates=()
      for rate in ${ONLINE_RATE//,/ }; do
        rates+=(--workload "--dataset-name sharegpt --dataset-path $SHAREGPT --request-rate $rate")
      done
      driver "$step" "$MODEL_8B" "${ONLINE_CONFIGS:-nondet,sglang-det,llm42}" "$ONLINE_RATIO" --window-sizes "$WINDOW" \
        "${rates[@]}" --bench-args "--seed 1 --num-prompts $ONLINE_PROMPTS$WARMUP_ARG" ;;
    row-invariance)  # SGLang's Triton matmul, not DeepGEMM (as the verify ceiling ran it)
      local args=()
      read -ra args <<< "${ROW_INVARIANCE_ARGS:-}"
      SGLANG_BATCH_INVARIANT_OPS_ENABLE_MM_DEEPGEMM=0 env_python -m benchmarks.row_invariance \
        --out-dir "$RUN_DIR/$step" --budget-s $(( $(remaining) - 30 )) ${args[@]+"${args[@]}"} ;;
    backend-compare)  # one llm42 server per backend, the variant's flag after COMMON_ARGS' own
      local model=$MODEL_8B context=""
      if [[ $BACKEND_MODEL == smollm2 ]]; then
        model_smollm2 || return 1
        model=$MODEL_SMOL context=" --context-len 8192"
      fi
      LLM42_ARGS="--attention-backend flashinfer;--attention-backend triton" \
        driver "$step" "$model" llm42 "$BACKEND_RATIOS" --window-sizes "$WINDOW" \
        --workload "--dataset-name sharegpt --dataset-path $SHAREGPT --num-prompts $BACKEND_PROMPTS" \
        --bench-args "--seed 1 --warmup-requests $BACKEND_WARMUP$context" ;;
    save-jit-cache) save_jit_cache ;;
    report)
      mkdir -p "$RUN_DIR/report"
      # every results file of this machine and any copied back into .gpu/results/ (earlier calls)
      cat "$RUN_DIR"/*/results.jsonl "$REPO"/.gpu/results/*.jsonl 2>/dev/null \
        | awk 'NF && !seen[$0]++' > "$RUN_DIR/report/results.jsonl"
      env_python -m benchmarks.driver --report-only --out-dir "$RUN_DIR/report" ;;
    *) log "unknown step $step"; return 1 ;;
  esac
}

[[ $# -gt 0 ]] || { awk '/^# Every step/ {exit} NR > 1' "${BASH_SOURCE[0]}"; exit 2; }  # usage, steps
setup || { log "setup failed"; exit 1; }
# shellcheck disable=SC1091
[[ $DRY_RUN == 1 ]] || source "$PREFIX/env.sh"
restore_jit_cache
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
status=0
for step in "$@"; do
  [[ $step == setup ]] && continue
  log "== $step"
  run_step "$step" || status=1
  pack "$step"
done
log "done (exit $status)"
exit $status
