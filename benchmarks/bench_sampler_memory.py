"""Peak memory of the sampler on long multi-turn chats: what the KV caches need, against what the process holds.

An agent's rollouts are long chats (a system prompt with the tools, then turns of tool calls and
results) that reach the sampler in batches of different widths: one batch at the first turn,
another at the fifth. This plays that load on SmolLM2-135M's shape: `--rounds` batches of `--rows`
prompts, each a shared start of `--shared` tokens and a tail of its own drawn between
`--min-tail` and `--max-tail` tokens, `--max-tokens` new tokens each. Every variant runs in a
process of its own (peak RSS is per process) on the same batches:

- "on": the default fast paths (`model.fast = "on"`), glibc told to keep freed blocks;
- "on-glibc-defaults": the same paths with glibc's malloc left at its defaults;
- "off": plain transformers + peft.

The table gives each variant's peak RSS, the RSS after the last batch, and seconds, next to the
largest batch's KV cache: rows x (shared + longest tail + new tokens) x layers x 2 x KV heads x
head size x 4 bytes.

    python benchmarks/bench_sampler_memory.py                       # 6 rounds of 16 rows
    python benchmarks/bench_sampler_memory.py --rounds 2 --max-tail 400 --json runs/mem.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from step_workload import peak_rss_mib  # noqa: E402

VARIANTS = ("on", "on-glibc-defaults", "off")


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def batches(args, vocab: int) -> list[list[list[int]]]:
    """The same prompts for every variant: `rounds` batches of `rows` token lists."""
    rng = random.Random(args.seed)
    shared = [rng.randrange(100, vocab) for _ in range(args.shared)]
    return [
        [
            shared + [rng.randrange(100, vocab) for _ in range(rng.randint(args.min_tail, args.max_tail))]
            for _ in range(args.rows)
        ]
        for _ in range(args.rounds)
    ]


def worker(args) -> None:
    import dataclasses

    import torch

    from grooves.config import LoraConfig
    from grooves.models import resolve_model
    from grooves.policy.fast import fast_paths
    from grooves.policy.sampling import SamplingParams
    from grooves.policy.transformers import TransformersPolicy

    torch.set_num_threads(args.threads)
    if args.variant == "on-glibc-defaults":
        paths = dataclasses.replace(fast_paths("on"), reuse_freed_memory=False)
    else:
        paths = fast_paths(args.variant)
    policy = TransformersPolicy(
        resolve_model(args.model), lora=LoraConfig(rank=8, alpha=16), fast=paths, seed=args.seed
    )
    loaded = rss_mib()
    params = SamplingParams(n=1, max_tokens=args.max_tokens, temperature=1.0)
    start = time.perf_counter()
    tokens = 0
    for prompts in batches(args, len(policy.tokenizer) - 1):
        out = policy.generate(prompts, [params] * len(prompts))
        tokens += sum(len(c[0].token_ids) for c in out)
    seconds = time.perf_counter() - start
    peak = peak_rss_mib()
    print(
        json.dumps(
            {
                "variant": args.variant,
                "loaded_rss_mib": loaded,
                "peak_rss_mib": peak,
                "final_rss_mib": rss_mib(),
                "seconds": seconds,
                "tokens": tokens,
            }
        ),
        flush=True,
    )


def kv_mib(args) -> float:
    from transformers import AutoConfig

    from grooves.models import resolve_model

    c = AutoConfig.from_pretrained(resolve_model(args.model))
    head = c.hidden_size // c.num_attention_heads
    width = args.shared + args.max_tail + args.max_tokens
    return args.rows * width * c.num_hidden_layers * 2 * c.num_key_value_heads * head * 4 / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--shared", type=int, default=800)
    parser.add_argument("--min-tail", type=int, default=100)
    parser.add_argument("--max-tail", type=int, default=1500)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help="comma-separated, of: " + "; ".join(VARIANTS)
    )
    parser.add_argument("--json", default=None)
    parser.add_argument("--variant", default=None, help=argparse.SUPPRESS)  # a worker process
    args = parser.parse_args()
    if args.variant is not None:
        return worker(args)

    from rich.console import Console
    from rich.table import Table

    chosen = [v.strip() for v in args.variants.split(",")]
    unknown = [v for v in chosen if v not in VARIANTS]
    if unknown:
        parser.error(f"--variants: unknown {unknown}; use {', '.join(VARIANTS)}")
    results = []
    for variant in chosen:
        argv = [sys.executable, __file__, *sys.argv[1:], "--variant", variant]
        done = subprocess.run(argv, check=True, capture_output=True, text=True)
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]), flush=True)  # each variant takes minutes: show it as it ends
    kv = kv_mib(args)
    table = Table(
        title=f"sampler memory, {args.model}: {args.rounds} batches of {args.rows} rows, "
        f"{args.shared} shared + {args.min_tail}-{args.max_tail} own prompt tokens, {args.max_tokens} new; "
        f"largest batch's KV cache {kv:.0f} MiB"
    )
    for col in (
        "variant",
        "RSS loaded MiB",
        "peak RSS MiB",
        "peak - loaded",
        "RSS at end MiB",
        "s",
        "tokens",
    ):
        table.add_column(col, justify="left" if col == "variant" else "right")
    for r in results:
        table.add_row(
            r["variant"],
            f"{r['loaded_rss_mib']:.0f}",
            f"{r['peak_rss_mib']:.0f}",
            f"{r['peak_rss_mib'] - r['loaded_rss_mib']:.0f}",
            f"{r['final_rss_mib']:.0f}",
            f"{r['seconds']:.1f}",
            str(r["tokens"]),
        )
    Console(width=160).print(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "command": ["benchmarks/bench_sampler_memory.py", *sys.argv[1:]],
                    "kv_mib": kv,
                    "results": results,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
