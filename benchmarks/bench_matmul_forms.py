"""Sampling speed of the real SmolLM2-135M with each choice of decode matmul forms, side by side.

A decode step's matmuls can run as `x W^T` or as `(W x^T)^T`, the same product through another BLAS
kernel. `on` (`model.fast`'s default) never leaves `x W^T`; `timed` (`model.fast = "timed"`) times
only the output head's two forms, once, on a random input; `timed blocks` (no `model.fast` value:
`FastPaths(timed_head=True, timed_blocks=True)`) also times the blocks' forms on their first real
decode steps, so its trial steps in the slower form are part of what it costs. Each setting gets a policy of its
own (same weights, a rank-8 adapter folded as in training), and the settings take turns on the same
work: the demo's sampling (4 capitals groups of 8, 24 tokens) and the benchmark step's (1 group of
8, 32 tokens).

    OMP_WAIT_POLICY=PASSIVE python benchmarks/bench_matmul_forms.py
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch
from bench_generation import _timed_rounds
from rich.console import Console
from rich.table import Table

from grooves.config import LoraConfig
from grooves.policy.fast import FastPaths
from grooves.policy.sampling import SamplingParams
from grooves.policy.transformers import TransformersPolicy

SETTINGS = {"on": "on", "timed": "timed", "timed blocks": FastPaths(timed_head=True, timed_blocks=True)}
"""Column name -> the policy's `fast`."""
COUNTRIES = (
    "France",
    "Japan",
    "Kenya",
    "Peru",
    "Norway",
    "Egypt",
    "Chile",
    "Vietnam",
    "Germany",
    "Lebanon",
    "Canada",
    "Brazil",
)
WORKLOADS = {"demo: 4 groups x 8, 24 tokens": (4, 24), "benchmark step: 1 group x 8, 32 tokens": (1, 32)}


def sampler(policy: TransformersPolicy, groups: int, max_tokens: int):
    """A call that samples the next `groups` capitals questions (a new set each call) and returns the tokens made."""
    prompts = [
        policy.prompts.render(
            [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": f"What is the capital of {c}?"},
            ],
            None,
        )
        for c in COUNTRIES
    ]
    calls = 0

    def run() -> int:
        nonlocal calls
        start = (calls * groups) % len(prompts)
        calls += 1
        chosen = [prompts[(start + g) % len(prompts)] for g in range(groups)]
        params = [SamplingParams(n=8, max_tokens=max_tokens, temperature=1.0)] * groups
        return sum(len(c.token_ids) for per in policy.generate(chosen, params) for c in per)

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--runs", type=int, default=8)
    args = ap.parse_args()
    torch.set_num_threads(os.cpu_count())

    lora = LoraConfig(rank=8, alpha=16.0)
    policies = {s: TransformersPolicy(args.model, lora=lora, fast=fast) for s, fast in SETTINGS.items()}
    table = Table(
        title=f"{args.model}, LoRA r8 folded, {os.cpu_count()} threads, OMP_WAIT_POLICY="
        f"{os.environ.get('OMP_WAIT_POLICY', 'unset')}, median of {args.runs} alternating runs"
    )
    table.add_column("workload")
    for setting in SETTINGS:
        table.add_column(f"{setting} tok/s", justify="right")
    table.add_column("timed / on", justify="right")
    for name, (groups, max_tokens) in WORKLOADS.items():
        results = _timed_rounds({s: sampler(p, groups, max_tokens) for s, p in policies.items()}, args.runs)
        rate = {s: statistics.median(tokens / sec for sec, tokens in runs) for s, runs in results.items()}
        table.add_row(name, *(f"{rate[s]:.1f}" for s in SETTINGS), f"{rate['timed'] / rate['on']:.2f}x")
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
