"""Generation throughput of the real SmolLM2-135M: grooves' sampler next to transformers' generate.

One prompt, n completions (a GRPO group), up to `--max-tokens` new tokens each, plain temperature
sampling (no top-k, no top-p) in float32 on CPU. The prompt asks for a long answer so that rows
run to the token limit; throughput counts the tokens actually generated (up to and including an
end-of-turn token), divided by wall time. Each method gets one warm-up run, then the median of
`--runs` timed runs.

On a shared machine the load changes by the minute, so the methods take turns (round r of every
method before round r+1) instead of running back to back, and each run's time is printed.

OpenMP's wait policy matters a lot on a loaded machine: by default libgomp's idle threads spin,
and when a process's OpenMP threads number no more than its cores (one pool of 2 threads on 2
cores) they spin long enough that every barrier waits on a descheduled thread. We measured the
server's sampler thread at 45-98 s for a call (n=8, 24 tokens) that took 6 s on another thread
of the same process; with `OMP_WAIT_POLICY=PASSIVE` the same call took 6.0-7.5 s. Set it in the environment (it is
read when torch loads) and it shows in the table title.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/bench_generation.py   # n=8, 64 new tokens, threads = cores

`--n 1,8,64 --kernels` instead compares the sampler's decode kernels at each group size (the
default oneDNN on packed weights, MKL, and the int8 / bfloat16 samplers) against the roofline:
n rows decode one token each per pass over the weights, so no float32 sampler can exceed
n x read bandwidth / weight bytes tokens/s (bandwidth measured as in `bench_floor.py`).
`--json` writes every run's numbers and the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import time

import torch
from rich.console import Console
from rich.table import Table

from grooves.config import LoraConfig
from grooves.policy.fast import FastPaths
from grooves.policy.sampling import SamplingParams
from grooves.policy.transformers import TransformersPolicy
from grooves.serve.app import inprocess_client

PROMPT = (
    "Write a long, detailed story about a dragon who learns to bake bread in a small village. "
    "Describe every step, every smell and every person the dragon meets."
)


def _timed_rounds(fns: dict, runs: int) -> dict[str, list[tuple[float, int]]]:
    """(seconds, tokens) of each timed run per method: one warm-up each, then `runs` interleaved rounds."""
    for fn in fns.values():
        fn()
    samples: dict[str, list[tuple[float, int]]] = {name: [] for name in fns}
    for _ in range(runs):
        for name, fn in fns.items():
            start = time.perf_counter()
            tokens = fn()
            samples[name].append((time.perf_counter() - start, tokens))
    return samples


def bench_sampler(policy, prompt_ids, n, max_tokens, temperature):
    params = SamplingParams(n=n, max_tokens=max_tokens, temperature=temperature)
    return lambda: sum(len(c.token_ids) for c in policy.generate([prompt_ids], [params])[0])


def bench_sampler_hf_decode(policy, prompt_ids, n, max_tokens, temperature):
    """The same sampler with every decode step through transformers' forward (the fast paths but the fused decode)."""
    run = bench_sampler(policy, prompt_ids, n, max_tokens, temperature)
    fast = policy.sampler.fast

    def unfused() -> int:
        paths = fast.paths
        fast.paths = dataclasses.replace(paths, fused_decode=False)
        try:
            return run()
        finally:
            fast.paths = paths

    return unfused


def bench_server(policy, n, max_tokens, temperature):
    client = inprocess_client(policy)
    loop = asyncio.new_event_loop()
    messages = [{"role": "user", "content": PROMPT}]

    def run() -> int:
        coro = client.chat.completions.create(
            model=policy.served_name, messages=messages, n=n, max_tokens=max_tokens, temperature=temperature
        )
        return loop.run_until_complete(coro).usage.completion_tokens

    return run


def bench_generate(policy, prompt_ids, n, max_tokens, temperature):
    model, eos = policy.model, policy.tokenizer.eos_token_id
    ids = torch.tensor([prompt_ids])  # [1, P]

    def run() -> int:
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=temperature,
                top_k=0,
                top_p=1.0,
                max_new_tokens=max_tokens,
                num_return_sequences=n,
                pad_token_id=eos,
            )
        new = out[:, ids.shape[1] :]  # [n, <=max_tokens]
        made = 0
        for row in new.tolist():
            made += row.index(eos) + 1 if eos in row else len(row)  # the padding after eos is not generated
        return made

    return run


def _kernel_methods(args, lora, prompt_ids, n) -> dict:
    """The sampler with each decode kernel, one policy each (the same seed, the same adapter)."""
    policies = {
        "oneDNN packed float32 (default)": {},
        "MKL float32": {"fast": FastPaths(packed_decode=False)},
        "int8 weights": {"sampler_precision": "int8"},
        "bfloat16 weights": {"sampler_precision": "bfloat16"},
    }
    methods = {}
    for name, kwargs in policies.items():
        torch.manual_seed(0)
        policy = _POLICIES.setdefault(name, TransformersPolicy(args.model, lora=lora, **kwargs))
        methods[name] = bench_sampler(policy, prompt_ids, n, args.max_tokens, args.temperature)
    return methods


_POLICIES: dict[str, TransformersPolicy] = {}


def _roofline_tokens_per_s(model: str, rows: int) -> tuple[float, dict]:
    """n rows x read bandwidth / float32 weight bytes: the most tokens/s a float32 decode can reach."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_floor import Dims, read_bandwidth

    from grooves.models import resolve_model

    dims = Dims.from_config(resolve_model(model))
    bandwidth, weight_bytes = read_bandwidth(), dims.matmul_params * 4
    return rows * bandwidth / weight_bytes, {"read_bandwidth": bandwidth, "weight_bytes": weight_bytes}


def kernels_main(args, lora) -> None:
    policy = _POLICIES.setdefault(
        "oneDNN packed float32 (default)",
        (torch.manual_seed(0), TransformersPolicy(args.model, lora=lora))[1],
    )
    prompt_ids = policy.prompts.render([{"role": "user", "content": PROMPT}], None)
    report = {"command": sys_argv(), "runs": args.runs, "max_tokens": args.max_tokens, "sizes": {}}
    console = Console(width=140)
    for n in [int(x) for x in args.n.split(",")]:
        methods = _kernel_methods(args, lora, prompt_ids, n)
        load_before = os.getloadavg()[0]
        results = _timed_rounds(methods, args.runs)
        load_after = os.getloadavg()[0]
        roof, memory = _roofline_tokens_per_s(args.model, n)
        table = Table(
            title=f"n={n}, max {args.max_tokens} new tokens, LoRA rank {args.lora_rank or 'none'}, {args.threads} threads, "
            f"median of {args.runs} interleaved rounds; roofline {roof:.1f} tokens/s "
            f"({memory['read_bandwidth'] / 1e9:.1f} GB/s over {memory['weight_bytes'] / 1e6:.0f} MB)"
        )
        for col in (
            "decode kernels",
            "tokens",
            "tokens/s",
            "vs MKL",
            "of the float32 roofline",
            "each run s",
        ):
            table.add_column(col, justify="left" if col in ("decode kernels", "each run s") else "right")
        rates = {name: statistics.median(t / s for s, t in runs) for name, runs in results.items()}
        for name, runs in results.items():
            tokens = int(statistics.median(t for _, t in runs))
            each = " ".join(f"{s:.2f}" for s, _ in runs)
            ratio = rates[name] / rates["MKL float32"]
            table.add_row(
                name, str(tokens), f"{rates[name]:.1f}", f"{ratio:.2f}x", f"{rates[name] / roof:.2f}", each
            )
        console.print(table)
        print(
            f"1-minute load average: {load_before:.1f} before, {load_after:.1f} after ({os.cpu_count()} cores)"
        )
        report["sizes"][str(n)] = {
            "roofline_tokens_per_s": roof,
            **memory,
            "tokens_per_s": rates,
            "runs": {name: [{"seconds": s, "tokens": t} for s, t in runs] for name, runs in results.items()},
            "load_average": [load_before, load_after],
        }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


def sys_argv() -> list[str]:
    import sys

    return sys.argv


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--n", default="8", help="completions per prompt; with --kernels a list: 1,8,64")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument(
        "--lora-rank",
        type=int,
        default=0,
        help="sample with a LoRA adapter of this rank on all linear layers, folded as in training (0: the base model)",
    )
    ap.add_argument("--kernels", action="store_true", help="compare the decode kernels against the roofline")
    ap.add_argument("--json", default=None, help="with --kernels: also write the numbers here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    lora = LoraConfig(rank=args.lora_rank, alpha=2.0 * args.lora_rank) if args.lora_rank > 0 else None
    if args.kernels:
        return kernels_main(args, lora)
    args.n = int(args.n)
    policy = TransformersPolicy(args.model, lora=lora)
    prompt_ids = policy.prompts.render([{"role": "user", "content": PROMPT}], None)
    rows = {
        "grooves sample": bench_sampler(policy, prompt_ids, args.n, args.max_tokens, args.temperature),
        "grooves sample, transformers decode": bench_sampler_hf_decode(
            policy, prompt_ids, args.n, args.max_tokens, args.temperature
        ),
        "grooves server (openai client)": bench_server(policy, args.n, args.max_tokens, args.temperature),
        "transformers generate": bench_generate(
            policy, prompt_ids, args.n, args.max_tokens, args.temperature
        ),
    }
    load_before = os.getloadavg()[0]
    results = _timed_rounds(rows, args.runs)
    load_after = os.getloadavg()[0]
    medians = {
        name: (statistics.median(s for s, _ in runs), int(statistics.median(t for _, t in runs)))
        for name, runs in results.items()
    }
    base = medians["transformers generate"][1] / medians["transformers generate"][0]

    table = Table(
        title=f"{args.model}: n={args.n}, max {args.max_tokens} new tokens, prompt {len(prompt_ids)} tokens, "
        f"LoRA rank {args.lora_rank or 'none'}, {args.threads} threads, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}, "
        f"median of {args.runs}"
    )
    for col in ("method", "tokens", "median s", "tokens/s", "vs generate", "each run s"):
        table.add_column(col, justify="left" if col in ("method", "each run s") else "right")
    for name, (sec, tok) in medians.items():
        each = " ".join(
            f"{s:.2f}" for s, _ in results[name]
        )  # spread shows how much the shared machine interfered
        table.add_row(name, str(tok), f"{sec:.2f}", f"{tok / sec:.1f}", f"{tok / sec / base:.2f}x", each)
    Console(width=140).print(table)
    print(f"1-minute load average: {load_before:.1f} before, {load_after:.1f} after ({os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
