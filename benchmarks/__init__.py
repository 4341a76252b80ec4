"""Benchmarks for llm42: serving client, multi-config driver, determinism proof, GPU suite.

    python -m benchmarks.bench_serving --backend sglang --port 30000 --dataset-name random
    python -m benchmarks.driver --model-path M --workload sharegpt --out-dir out/
"""
