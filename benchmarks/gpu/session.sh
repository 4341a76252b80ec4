#!/usr/bin/env bash
# One H200 session step by step: install the offline SGLang bundle and llm42, then run the named
# steps, logs and results under $OUT. The bundle is copied into the git-ignored .gpu/ beforehand
# (cp -r ../shared/gpu-offline/{bundle,install.sh} .gpu/) and travels with `carry: [".gpu"]`.
#   bash benchmarks/gpu/session.sh install proof bench-random
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
PREFIX=${PREFIX:-/tmp/sgl}
COMMON="--attention-backend triton --sampling-backend pytorch --disable-radix-cache --cuda-graph-max-bs-decode 256 --cuda-graph-backend-prefill=disabled --max-running-requests 256"
DUMMY8B="$PREFIX/assets/models/Llama-3.1-8B-Instruct-dummy"
export PYTHONUNBUFFERED=1

install() {
  [[ -f "$PREFIX/env.sh" ]] || bash .gpu/install.sh .gpu/bundle "$PREFIX" > "$OUT/install.log" 2>&1
  # llm42 from this checkout; SGLang finds the plugin through this entry point
  local info="$PREFIX/l42/llm42-0.1.0.dist-info"
  mkdir -p "$info"
  printf 'Metadata-Version: 2.1\nName: llm42\nVersion: 0.1.0\n' > "$info/METADATA"
  printf '[sglang.srt.plugins]\nllm42 = llm42.sglang.plugin:register\n' > "$info/entry_points.txt"
}

env_on() {
  # shellcheck disable=SC1091
  source "$PREFIX/env.sh"
  export PYTHONPATH="$PWD:$PREFIX/l42:$PYTHONPATH"
}

proof() {
  local ckpt=/tmp/ckpt/llama-3.2-1b-random
  [[ -d $ckpt ]] || python3 -m llm42.models random-llama --preset llama-3.2-1b --out $ckpt \
      --seed 0 --std 0.02 --dtype bfloat16 --tokenizer "$DUMMY8B" > "$OUT/ckpt.log" 2>&1
  python3 -m benchmarks.determinism_proof --launch --model-path $ckpt --mode both \
    --server-args "$COMMON --enable-llm42 --llm42-window-size 64 --llm42-verify-batch-size 8 --mem-fraction-static 0.6" \
    --num-prompts 4 --max-new-tokens 96 --background 0,16,64,256 --repeats 5 \
    --out-dir "$OUT/proof" > "$OUT/proof.log" 2>&1
  echo "proof exit $?" >> "$OUT/proof.log"
}

bench() {  # $1 = name, rest = driver args
  local name=$1; shift
  python3 -m benchmarks.driver --model-path "$DUMMY8B" --out-dir "$OUT/$name" \
    --server-args "$COMMON --load-format dummy" "$@" > "$OUT/$name.log" 2>&1
  echo "driver exit $?" >> "$OUT/$name.log"
}

for step in "$@"; do
  case $step in
    install) install ;;
    proof) env_on; proof ;;
    bench-random) env_on; bench random --configs nondet,sglang-det,llm42 \
        --det-ratios 0.02,0.1,0.5,1.0 --budget-s "${BUDGET_S:-520}" \
        --workload "--dataset-name random --random-input-len 1024 --random-output-len 256 --random-range-ratio 1.0 --num-prompts 256" ;;
    bench-sharegpt) env_on; bench sharegpt --configs nondet,sglang-det,llm42,llm42-skip-compare \
        --det-ratios 0.1,1.0 --budget-s "${BUDGET_S:-520}" \
        --workload "--dataset-name sharegpt --dataset-path .gpu/sharegpt_3000.json --num-prompts 1024" ;;
    *) echo "unknown step $step" ;;
  esac
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
