"""The GPU host helpers (`benchmarks/gpu/`): the suite's dry run hands the driver arguments
it accepts, the offline install is discoverable, the GGUF pieces join back.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gpu.install_llm42 import install


def test_gpu_suite_dry_run_hands_the_driver_arguments_it_accepts(tmp_path):
    """The suite's shell plumbing (LLM42_ARGS variants, BENCH_CONFIGS, PREFILL_GRAPHS, TIMELINE,
    PROFILE_STEPS, ONLINE_RATE lists) checked
    without a GPU: its driver command lines must parse and give one server per variant (one
    for those that differ only in pass scheduling). A step's profiler traces come back in a
    tarball of their own, not in the step's."""
    import tarfile

    from benchmarks import driver

    suite = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "run_gpu_suite.sh"
    env = {**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable, "OUT": str(tmp_path / "out"),
           "RUN_DIR": str(tmp_path / "run"), "JIT_CACHE": str(tmp_path / "none.tar.gz"),
           "BENCH_CONFIGS": "nondet,llm42", "DET_RATIOS": "0.1", "PREFILL_GRAPHS": "1",
           "TIMELINE": "1", "ONLINE_RATE": "16,24", "PROFILE_STEPS": "5",
           "LLM42_ARGS": ";--llm42-max-verify-wait 48;--no-llm42-batched-prefill;"
                         "--llm42-max-passes-per-step 1"}
    profile = tmp_path / "run" / "bench-sharegpt" / "profile_nondet_r0_sharegpt"
    profile.mkdir(parents=True)
    (profile / "nondet_r0-1.5-TP-0.trace.json.gz").write_bytes(b"trace")
    (profile / "profile.md").write_text("# Step profile\n")
    subprocess.run(["bash", str(suite), "bench-sharegpt", "online"], env=env, check=True,
                   capture_output=True, timeout=120)
    with tarfile.open(tmp_path / "out" / "bench-sharegpt.tar.gz") as tar:
        assert "bench-sharegpt/profile_nondet_r0_sharegpt/profile.md" in tar.getnames()
        assert not [n for n in tar.getnames() if n.endswith(".trace.json.gz")]
    with tarfile.open(tmp_path / "out" / "bench-sharegpt-traces.tar.gz") as tar:
        assert tar.getnames() == [
            "bench-sharegpt/profile_nondet_r0_sharegpt/nondet_r0-1.5-TP-0.trace.json.gz"]
    assert not (tmp_path / "out" / "online-traces.tar.gz").exists()
    argvs = [json.loads(line) for line in (tmp_path / "out" / "dry_run.jsonl").read_text()
             .splitlines()]
    drivers = [argv[2:] for argv in argvs if argv[:2] == ["-m", "benchmarks.driver"]]
    assert len(drivers) == 2  # bench-sharegpt, online
    for argv in drivers:
        args = driver.build_parser().parse_args(argv)
        configs = driver.server_configs(args)
        assert "--cuda-graph-backend-prefill=disabled" not in args.server_args
        assert args.timeline
        assert (args.profile_steps, args.profile_running) == (5, 200)
        assert argv[argv.index("--profile-steps") + 1] == "5"
        llm42 = [c for c in configs if c.config == "llm42"]
        # the max-verify-wait and batched-prefill variants differ only in when rows are
        # verified and which batch a prompt prefills in: switched at runtime on the first
        # server (SWITCH_VARIANTS=1); a cap on passes per step keeps a server of its own
        assert [c.label for c in llm42] == ["llm42-w64", "llm42-w64-max-passes-per-step1"]
        assert [v.label for v in llm42[0].switched] == ["llm42-w64-max-verify-wait48",
                                                        "llm42-w64-no-batched-prefill"]
        assert llm42[0].switched[0].meta["benchmark_mode"]["max_verify_wait"] == 48
        assert llm42[0].switched[1].meta["benchmark_mode"]["batched_prefill"] is False
        assert llm42[1].flags[-2:] == ["--llm42-max-passes-per-step", "1"]
    assert [c.label for c in driver.server_configs(driver.build_parser().parse_args(
        drivers[0]))][0] == "nondet"
    online = driver.build_parser().parse_args(drivers[1])  # a load curve: one workload per rate
    assert [w.split("--request-rate ")[1] for w in online.workload] == ["16", "24"]


@pytest.mark.parametrize("switch, starts", [("1", 1), ("0", 4)])
def test_gpu_suite_smollm2_sweep_starts_one_server_for_its_windows(tmp_path, capsys, switch,
                                                                   starts):
    """SWITCH_VARIANTS=1 (the default): the four windows of the SmolLM2 sweep run on one server
    start, switched at runtime, and the estimator prices one start; 0: a start per window.
    WARMUP_REQUESTS reaches every timed run of the sweep (unset: bench_serving's default)."""
    from benchmarks import driver
    from benchmarks.gpu import estimate

    suite = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "run_gpu_suite.sh"
    env = {**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable, "OUT": str(tmp_path / "out"),
           "RUN_DIR": str(tmp_path / "run"), "JIT_CACHE": str(tmp_path / "none.tar.gz"),
           "SMOLLM2_WEIGHTS": "real", "SWEEP_CONFIGS": "llm42", "SWEEP_PROMPTS": "512",
           "SWITCH_VARIANTS": switch, **({"WARMUP_REQUESTS": "64"} if switch == "1" else {})}
    subprocess.run(["bash", str(suite), "smollm2-sweep"], env=env, check=True,
                   capture_output=True, timeout=120)
    plan = tmp_path / "out" / "dry_run.jsonl"
    [argv] = [json.loads(ln)[2:] for ln in plan.read_text().splitlines()
              if json.loads(ln)[:2] == ["-m", "benchmarks.driver"]]
    args = driver.build_parser().parse_args(argv)
    warmup = ["--warmup-requests", "64"] if switch == "1" else []
    assert args.bench_args.split()[6:] == warmup, args.bench_args
    configs = driver.server_configs(args)
    labels = [[c.label, *[v.label for v in c.switched]] for c in configs]
    if switch == "1":
        assert labels == [["llm42-w128", "llm42-w16", "llm42-w32", "llm42-w64"]]
    else:
        assert labels == [["llm42-w16"], ["llm42-w32"], ["llm42-w64"], ["llm42-w128"]]
    (tmp_path / "none").mkdir()
    estimate.main([str(plan), "--results", str(tmp_path / "none"), "--budget-s", "10000"])
    lines = capsys.readouterr().out.splitlines()
    assert sum(" start llm42-w" in ln for ln in lines) == starts, lines
    assert sum(" run llm42-w" in ln and "n=512 ratio 1" in ln for ln in lines) == 4, lines


def test_gpu_suite_proof_serves_an_adapter_and_adds_the_feature_requests(tmp_path):
    """The proof step writes a random adapter for its model, serves it with the LoRA backend to
    prove, and asks the proof for the sampling-API requests, LoRA among them."""
    import shlex

    from benchmarks import determinism_proof

    suite = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "run_gpu_suite.sh"
    env = {**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable, "OUT": str(tmp_path / "out"),
           "RUN_DIR": str(tmp_path / "run"), "JIT_CACHE": str(tmp_path / "none.tar.gz")}
    subprocess.run(["bash", str(suite), "proof"], env=env, check=True, capture_output=True,
                   timeout=120)
    argvs = [json.loads(line) for line in (tmp_path / "out" / "dry_run.jsonl").read_text()
             .splitlines()]
    [lora] = [a for a in argvs if a[:3] == ["-m", "llm42.models", "random-lora"]]
    [proof] = [a[2:] for a in argvs if a[:2] == ["-m", "benchmarks.determinism_proof"]]
    adapter = lora[lora.index("--out") + 1]
    server_args = shlex.split(proof[proof.index("--server-args") + 1])
    assert f"proof={adapter}" in server_args and "--enable-lora" in server_args
    assert server_args[server_args.index("--lora-backend") + 1] == "csgmv"
    features = proof[proof.index("--features") + 1].split(",")
    assert features == ["n2", "penalty", "json", "lora"]
    reqs = determinism_proof.det_requests(4, 42, tuple(features),
                                          proof[proof.index("--lora-name") + 1])
    assert sum(r.lora == "proof" for r in reqs) == 4


def test_install_llm42_writes_a_discoverable_dist_info(tmp_path):
    info = install(tmp_path / "site")
    dists = list(importlib.metadata.distributions(path=[str(tmp_path / "site")]))
    assert [d.metadata["Name"] for d in dists] == ["llm42"]
    eps = [e for e in dists[0].entry_points if e.group == "sglang.srt.plugins"]
    assert [(e.name, e.value) for e in eps] == [("llm42", "llm42.sglang.plugin:register")]
    assert (tmp_path / "site/llm42/sglang/plugin.py").is_file()
    assert list((tmp_path / "site/llm42/patches").glob("sglang-*.json")), "package data missing"
    assert info.name == "llm42-0.1.0.dist-info"


def test_gguf_split_joins_back_under_its_checksum(tmp_path):
    """The GGUF travels to the GPU host in pieces; the host joins them and checks the sha256."""
    import hashlib

    from benchmarks.gpu.prepare_assets import gguf_receive_command, split_file

    src = tmp_path / "model.gguf"
    src.write_bytes(bytes(range(256)) * 41 + b"tail")
    pieces = split_file(src, tmp_path / "repo")
    assert [p.parent.name for p in pieces] == [".gpu-gguf1", ".gpu-gguf2", ".gpu-gguf3"]
    joined = b"".join(p.read_bytes() for p in pieces)
    assert joined == src.read_bytes()
    sums = {(p.parent / "SHA256").read_text() for p in pieces}
    assert sums == {f"{hashlib.sha256(joined).hexdigest()}  model.gguf\n"}
    assert ".gpu-gguf2/*" in gguf_receive_command(2)


def test_gpu_suite_pass_tokens_sweep_and_lm_head_cost(tmp_path):
    """WINDOW=16,32,64 PASS_TOKENS=512: one llm42 start for the three (W, B) of a 512-token pass
    (B switched at runtime with W); the lm-head-cost step hands its module arguments it takes."""
    from benchmarks import driver, lm_head_cost

    suite = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "run_gpu_suite.sh"
    env = {**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable, "OUT": str(tmp_path / "out"),
           "RUN_DIR": str(tmp_path / "run"), "JIT_CACHE": str(tmp_path / "none.tar.gz"),
           "BENCH_CONFIGS": "nondet,llm42", "DET_RATIOS": "0.1,1.0", "WINDOW": "16,32,64",
           "PASS_TOKENS": "512"}
    subprocess.run(["bash", str(suite), "bench-sharegpt", "lm-head-cost"], env=env, check=True,
                   capture_output=True, timeout=120)
    argvs = [json.loads(line) for line in (tmp_path / "out" / "dry_run.jsonl").read_text()
             .splitlines()]
    [bench] = [a[2:] for a in argvs if a[:2] == ["-m", "benchmarks.driver"]]
    configs = driver.server_configs(driver.build_parser().parse_args(bench))
    assert [[c.label, *[v.label for v in c.switched]] for c in configs] == [
        ["nondet"], ["llm42-w64-b8", "llm42-w16-b32", "llm42-w32-b16"]]
    [cost] = [a[2:] for a in argvs if a[:2] == ["-m", "benchmarks.lm_head_cost"]]
    assert lm_head_cost.build_parser().parse_args(cost).preset == "llama-3.1-8b"


def test_gpu_suite_row_invariance_step_is_priced(tmp_path, capsys):
    """The row-invariance step hands benchmarks.row_invariance arguments it takes (its folder,
    a budget inside the call's, ROW_INVARIANCE_ARGS), and the estimator prices it: a flagged
    guess without a recorded run, the recorded run's seconds with one."""
    from benchmarks import row_invariance
    from benchmarks.gpu import estimate

    suite = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "run_gpu_suite.sh"
    env = {**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable, "OUT": str(tmp_path / "out"),
           "RUN_DIR": str(tmp_path / "run"), "JIT_CACHE": str(tmp_path / "none.tar.gz"),
           "SUITE_BUDGET_S": "400", "ROW_INVARIANCE_ARGS": "--attention triton-extend --iters 5"}
    subprocess.run(["bash", str(suite), "row-invariance"], env=env, check=True,
                   capture_output=True, timeout=120)
    plan = tmp_path / "out" / "dry_run.jsonl"
    [argv] = [json.loads(ln)[2:] for ln in plan.read_text().splitlines()
              if json.loads(ln)[:2] == ["-m", "benchmarks.row_invariance"]]
    args = row_invariance.build_parser().parse_args(argv)
    assert args.out_dir == str(tmp_path / "run" / "row-invariance")
    assert 300 < args.budget_s < 400 and args.preset == "llama-3.1-8b"
    assert args.attention == "triton-extend" and args.iters == 5
    results = tmp_path / "results"
    results.mkdir()
    estimate.main([str(plan), "--results", str(results), "--budget-s", "600"])
    [line] = [ln for ln in capsys.readouterr().out.splitlines() if "row-invariance" in ln]
    assert "180 s" in line and "a guess" in line
    summary = {"kind": "summary", "preset": "llama-3.1-8b", "elapsed_s": 100.0,
               "finished": "2026-12-06T00:00:00+00:00"}
    (results / "h100" / "row-invariance").mkdir(parents=True)
    (results / "h100" / "row-invariance" / row_invariance.JSONL).write_text(
        json.dumps(summary) + "\n")
    estimate.main([str(plan), "--results", str(results), "--budget-s", "600"])
    [line] = [ln for ln in capsys.readouterr().out.splitlines() if "row-invariance" in ln]
    assert f"{100 + estimate.ROW_INVARIANCE_START_S:.0f} s" in line
    assert f"h100/row-invariance/{row_invariance.JSONL}" in line


def test_gpu_suite_backend_compare_runs_llm42_once_per_proven_gpu_backend(tmp_path):
    """The measurement behind --enable-llm42's choice without --attention-backend: one llm42
    server on flashinfer, one on triton, each backend the last (winning) flag of its server,
    the same ShareGPT run on both (the 8B shape, or SmolLM2's)."""
    import shlex

    from benchmarks import driver
    from llm42.sglang.backend_gate import GPU_AUTO_BACKENDS

    suite = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "run_gpu_suite.sh"
    env = {**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable, "OUT": str(tmp_path / "out"),
           "RUN_DIR": str(tmp_path / "run"), "JIT_CACHE": str(tmp_path / "none.tar.gz"),
           "BACKEND_PROMPTS": "128"}
    for model in ("8b", "smollm2"):
        subprocess.run(["bash", str(suite), "backend-compare"], env={**env, "BACKEND_MODEL": model},
                       check=True, capture_output=True, timeout=120)
    argvs = [json.loads(line) for line in (tmp_path / "out" / "dry_run.jsonl").read_text()
             .splitlines()]
    eight_b, smollm2 = [a[2:] for a in argvs if a[:2] == ["-m", "benchmarks.driver"]]
    assert "Llama-3.1-8B" in driver.build_parser().parse_args(eight_b).model_path
    assert "random" in smollm2[smollm2.index("--model-path") + 1]
    assert "--context-len 8192" in driver.build_parser().parse_args(smollm2).bench_args
    args = driver.build_parser().parse_args(eight_b)
    configs = driver.server_configs(args)
    assert [c.config for c in configs] == ["llm42", "llm42"], "one server start per backend"
    backends = []
    for cfg in configs:
        flags = shlex.split(args.server_args) + cfg.flags  # as the driver starts the server
        last = max(i for i, flag in enumerate(flags) if flag == "--attention-backend")
        backends.append(flags[last + 1])
        assert cfg.ratios == [0.1]
    assert tuple(sorted(backends)) == tuple(sorted(GPU_AUTO_BACKENDS))
    assert [c.label for c in configs] == [f"llm42-w64-attention-backend{b}" for b in backends]
    [workload] = args.workload
    assert "--dataset-name sharegpt" in workload and "--num-prompts 128" in workload
    assert "--warmup-requests 32" in args.bench_args


@pytest.mark.parametrize("det_allreduce", ["0", "1"])
def test_gpu_suite_tp_proof_and_tp_benchmark(tmp_path, det_allreduce):
    """proof-tp runs the proof (llm42 and its control) on a TP = 2 server, with SGLang's
    deterministic all-reduce settings on request; TP=2 puts every server of a bench step on two
    GPUs, the plain-SGLang-as-users-run-it baseline included."""
    import shlex

    from benchmarks import driver

    suite = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "run_gpu_suite.sh"
    env = {**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable, "OUT": str(tmp_path / "out"),
           "RUN_DIR": str(tmp_path / "run"), "JIT_CACHE": str(tmp_path / "none.tar.gz"),
           "TP_DET_ALLREDUCE": det_allreduce}
    subprocess.run(["bash", str(suite), "proof-tp"], env=env, check=True, capture_output=True,
                   timeout=120)
    subprocess.run(["bash", str(suite), "bench-sharegpt-all"], env={**env, "TP": "2"},
                   check=True, capture_output=True, timeout=120)
    argvs = [json.loads(line) for line in (tmp_path / "out" / "dry_run.jsonl").read_text()
             .splitlines()]
    [proof] = [a[2:] for a in argvs if a[:2] == ["-m", "benchmarks.determinism_proof"]]
    assert proof[proof.index("--mode") + 1] == "both", "llm42 and its control"
    assert "llama-3.2-1b" in proof[proof.index("--model-path") + 1]
    server_args = shlex.split(proof[proof.index("--server-args") + 1])
    last_tp = max(i for i, flag in enumerate(server_args) if flag == "--tp-size")
    assert server_args[last_tp + 1] == "2" and "--enable-llm42" in server_args
    assert ("--disable-custom-all-reduce" in server_args) == (det_allreduce == "1")

    [bench] = [a[2:] for a in argvs if a[:2] == ["-m", "benchmarks.driver"]]
    args = driver.build_parser().parse_args(bench)
    configs = driver.server_configs(args)
    assert {"nondet", "nondet-defaults", "sglang-det", "llm42"} <= {c.config for c in configs}
    for cfg in configs:
        flags = driver.without_like_for_like(shlex.split(args.server_args)) \
            if not cfg.like_for_like else shlex.split(args.server_args)
        assert flags[flags.index("--tp-size") + 1] == "2", cfg.label


def test_gpu_suite_row_invariant_proof_compares_two_servers(tmp_path):
    """proof-row-invariant: two proofs with the row-invariant verifier at W 16 B 32 and W 64 B 4;
    the second reads the first's proof.json as its reference (cross-server bitwise check). The
    first verifies every decode step inline, the second by passes only (inline steps vs passes
    on the GPU); the first without SGLang's radix cache, the second with it (the prefix cache
    follows it: a hit must give a miss's bits)."""
    import shlex

    from benchmarks import determinism_proof

    suite = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "run_gpu_suite.sh"
    env = {**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable, "OUT": str(tmp_path / "out"),
           "RUN_DIR": str(tmp_path / "run"), "JIT_CACHE": str(tmp_path / "none.tar.gz")}
    subprocess.run(["bash", str(suite), "proof-row-invariant"], env=env, check=True,
                   capture_output=True, timeout=120)
    argvs = [json.loads(line) for line in (tmp_path / "out" / "dry_run.jsonl").read_text()
             .splitlines() if '"benchmarks.determinism_proof"' in line]
    assert len(argvs) == 2
    parsed = [determinism_proof.build_parser().parse_args(a[2:]) for a in argvs]
    shapes = []
    for args in parsed:
        server = shlex.split(args.server_args)
        assert server[server.index("--llm42-verifier") + 1] == "row-invariant"
        # proven on triton since the H100 proof: the step runs the verifier as users do
        assert "--llm42-allow-unproven-backend" not in server and "lora" not in args.features
        inline = ("off" if "--no-llm42-inline-verify" in server
                  else float(server[server.index("--llm42-inline-pad-ratio") + 1]))
        shapes.append((server[server.index("--llm42-window-size") + 1],
                       server[server.index("--llm42-verify-batch-size") + 1], inline,
                       "--disable-radix-cache" not in server))
    # every step inline without the prefix cache, then passes only with it
    assert shapes == [("16", "32", 1e9, False), ("64", "4", "off", True)]
    assert parsed[0].reference is None
    assert parsed[1].reference == [str(Path(parsed[0].out_dir) / "proof.json")]


def _dry_run(tmp_path, steps: list[str], **env) -> list[list[str]]:
    """The python argvs (after the interpreter) the suite would run for `steps`."""
    suite = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "run_gpu_suite.sh"
    env = {**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable, "OUT": str(tmp_path / "out"),
           "RUN_DIR": str(tmp_path / "run"), "JIT_CACHE": str(tmp_path / "none.tar.gz"), **env}
    subprocess.run(["bash", str(suite), *steps], env=env, check=True, capture_output=True,
                   timeout=120)
    return [json.loads(line) for line in (tmp_path / "out" / "dry_run.jsonl").read_text()
            .splitlines()]


def test_gpu_suite_spec_proof_compares_every_speculative_server_with_the_earlier_ones(
        tmp_path, capsys):
    """proof-spec (issue 37): on SmolLM2, llm42 without speculation (the reference, no control),
    then NGRAM, STANDALONE (SmolLM2 its own draft) and EAGLE (a random draft written for it),
    one server each with the same llm42 settings and requests (no LoRA: SGLang serves it with
    NGRAM only); each later proof reads every earlier one's proof.json (--reference), and the
    estimator prices the four starts and their trials."""
    import shlex

    from benchmarks import determinism_proof
    from benchmarks.gpu import estimate

    argvs = _dry_run(tmp_path, ["proof-spec"], SMOLLM2_WEIGHTS="real",
                     PROOF_BACKGROUND="0,64", PROOF_REPEATS="1")
    proofs = [determinism_proof.build_parser().parse_args(a[2:]) for a in argvs
              if a[:2] == ["-m", "benchmarks.determinism_proof"]]
    assert [Path(p.out_dir).name for p in proofs] == ["none", "ngram", "standalone", "eagle"]
    model = proofs[0].model_path
    assert model.endswith("smollm2-135m-real")
    servers = [shlex.split(p.server_args) for p in proofs]
    for proof, server in zip(proofs, servers):
        assert proof.model_path == model and proof.features == "n2,penalty,json"
        assert server[server.index("--llm42-window-size") + 1] == "64"  # the defaults
        assert server[:len(servers[0])] == servers[0], "the same settings, speculation added"
    assert [p.mode for p in proofs] == ["llm42", "both", "both", "both"]

    def flag(server, name):
        return server[server.index(name) + 1] if name in server else None

    assert [flag(s, "--speculative-algorithm") for s in servers] == [
        None, "NGRAM", "STANDALONE", "EAGLE"]
    assert [flag(s, "--speculative-num-draft-tokens") for s in servers[1:]] == ["4"] * 3
    assert flag(servers[2], "--speculative-draft-model-path") == model
    [draft] = [a for a in argvs if a[:3] == ["-m", "llm42.models", "random-eagle"]]
    assert draft[draft.index("--base") + 1] == model
    assert flag(servers[3], "--speculative-draft-model-path") == draft[draft.index("--out") + 1]
    for s in servers[2:]:
        assert flag(s, "--speculative-eagle-topk") == "1"
        assert flag(s, "--speculative-num-steps") == "3"
    outputs = [str(Path(p.out_dir) / "proof.json") for p in proofs]
    assert [p.reference for p in proofs] == [None, outputs[:1], outputs[:2], outputs[:3]]

    # a later call on the same machine: only the sub-runs asked for, still compared with the
    # earlier call's proofs found on disk
    for name in ("none", "ngram"):
        Path(outputs[0]).parent.parent.joinpath(name).mkdir(parents=True, exist_ok=True)
    Path(outputs[0]).write_text("{}")
    (tmp_path / "out" / "dry_run.jsonl").unlink()
    later = _dry_run(tmp_path, ["proof-spec"], SMOLLM2_WEIGHTS="real",
                     PROOF_SPEC_RUNS="standalone,eagle")
    later = [determinism_proof.build_parser().parse_args(a[2:]) for a in later
             if a[:2] == ["-m", "benchmarks.determinism_proof"]]
    assert [Path(p.out_dir).name for p in later] == ["standalone", "eagle"]
    assert [p.reference for p in later] == [outputs[:1], [outputs[0], outputs[2]]]

    results = tmp_path / "results"
    results.mkdir()
    plan = tmp_path / "plan.jsonl"
    plan.write_text("".join(json.dumps(a) + "\n" for a in argvs))
    estimate.main([str(plan), "--results", str(results), "--start-s", "50",
                   "--proof-trial-s", "10", "--setup-s", "0", "--budget-s", "1000"])
    lines = capsys.readouterr().out.splitlines()
    assert sum(" start proof " in ln for ln in lines) == 4
    # none: llm42 only; the others llm42 and control; 2 trials each at 10 s (no recorded proof)
    assert lines[-1] == f"total {4 * 50 + 7 * 20} s: fits in --budget-s 1000"


def test_gpu_suite_spec_sharegpt_runs_speculation_on_and_off(tmp_path):
    """spec-sharegpt (issue 37): ShareGPT on SmolLM2 with its real weights, plain SGLang with
    and without the overlap scheduler and with speculation, llm42 with and without speculation,
    at 10 % and 100 % deterministic; the speculative servers get SPEC_ARGS and name the
    algorithm, the benchmark client takes every config."""
    import shlex

    from benchmarks import bench_serving, driver

    argvs = _dry_run(tmp_path, ["spec-sharegpt"], SMOLLM2_WEIGHTS="real")
    [argv] = [a[2:] for a in argvs if a[:2] == ["-m", "benchmarks.driver"]]
    args = driver.build_parser().parse_args(argv)
    assert args.model_path.endswith("smollm2-135m-real") and "--load-format" not in \
        args.server_args
    assert "--context-len 8192" in args.bench_args
    [workload] = args.workload
    assert "--dataset-name sharegpt" in workload and "--num-prompts 1024" in workload
    configs = driver.server_configs(args)
    got = {c.label: (c.config, c.ratios) for c in configs}
    assert got == {"nondet": ("nondet", [0.0]),
                   "nondet-no-overlap": ("nondet-no-overlap", [0.0]),
                   "nondet-spec-ngram": ("nondet-spec", [0.0]),
                   "llm42-w64": ("llm42", [0.1, 1.0]),
                   "llm42-w64-spec-ngram": ("llm42", [0.1, 1.0])}
    spec = ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "4"]
    for cfg in configs:
        flags = shlex.split(args.server_args) + cfg.flags  # as the driver starts the server
        assert (flags[-4:] == spec) == cfg.label.endswith("spec-ngram"), cfg.label
        assert cfg.meta.get("speculative_algorithm") == (
            "NGRAM" if "spec" in cfg.label else None)
    assert configs[1].flags == ["--disable-overlap-schedule"]
    parser = bench_serving.build_parser()
    for cfg in configs:
        assert parser.parse_args(["--config-label", cfg.config]).config_label == cfg.config

    # another algorithm: SPEC_ARGS reaches both speculative servers and their labels
    (tmp_path / "out" / "dry_run.jsonl").unlink()
    eagle = ("--speculative-algorithm EAGLE --speculative-draft-model-path /d "
             "--speculative-eagle-topk 1")
    argvs = _dry_run(tmp_path, ["spec-sharegpt"], SPEC_ARGS=eagle,
                     SPEC_CONFIGS="nondet-spec,llm42-spec")
    [argv] = [a[2:] for a in argvs if a[:2] == ["-m", "benchmarks.driver"]]
    configs = driver.server_configs(driver.build_parser().parse_args(argv))
    assert [(c.label, c.flags[-6:]) for c in configs] == [
        ("nondet-spec-eagle", shlex.split(eagle)), ("llm42-w64-spec-eagle", shlex.split(eagle))]


def test_gpu_suite_runs_the_kv_split_cost_step(tmp_path):
    """kv-split-cost: benchmarks.kv_split_cost into the step's folder, no server."""
    assert ["-m", "benchmarks.kv_split_cost", "--out-dir",
            str(tmp_path / "run" / "kv-split-cost")] in _dry_run(tmp_path, ["kv-split-cost"])
