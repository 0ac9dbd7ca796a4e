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
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--adapter", default=None, help="adapter, checkpoint or run folder (default: a random rank-8 LoRA)"
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--requests", type=int, default=16, help="requests per concurrency level")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    args = parser.parse_args()

    from grooves.adapters.export import export_adapter
    from grooves.adapters.registry import resolve_adapter
    from grooves.models import ensure_model
    from grooves.policy.transformers import TransformersPolicy
    from grooves.serve.app import create_app
    from grooves.serve.routing import AdapterTable

    torch.set_num_threads(args.threads)
    base = ensure_model()
    tmp = Path(tempfile.mkdtemp(prefix="bench-serving-"))
    adapter = resolve_adapter(args.adapter) if args.adapter else random_adapter(base, tmp / "adapter")
    merged = export_adapter(adapter, tmp / "export", adapter=False).merged_dir
    policy = TransformersPolicy(str(base), served_name="base")
    table = AdapterTable(policy)
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
