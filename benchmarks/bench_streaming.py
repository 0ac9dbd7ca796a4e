"""What streaming costs: one request of n samples through the server, streamed and not, side by side.

The real SmolLM2-135M behind the in-process `openai` client (the server's whole code path, no
socket), n = 8 samples of one prompt, up to 64 new tokens each, temperature 1. Both variants send
the same seeded request, so they sample the same tokens: the difference is the streaming path
(a callback per token on the sampler thread, incremental detokenization, tool-call and chunk
building, one server-sent event per delta, the client's parsing of each chunk). They take turns,
one warm-up each, then the median of `--runs`; tokens/s and the process's CPU time per token
(less moved by other jobs on a shared machine than wall time). The order alternates from run to
run, so a load that rises or falls during the benchmark does not favour one side, and each run's
pair gives a ratio: `paired_*` are the medians of those, which a change of load between runs
moves less than the ratio of the two medians.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/bench_streaming.py --json docs/results/streaming_overhead.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path

import torch

from grooves.policy.transformers import TransformersPolicy
from grooves.serve.app import inprocess_client

PROMPT = (
    "Write a long, detailed story about a dragon who learns to bake bread in a small village. "
    "Describe every step, every smell and every person the dragon meets."
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    policy = TransformersPolicy(args.model)
    client = inprocess_client(policy)
    loop = asyncio.new_event_loop()
    request = {
        "model": policy.served_name,
        "messages": [{"role": "user", "content": PROMPT}],
        "n": args.n,
        "max_tokens": args.max_tokens,
        "temperature": 1.0,
        "seed": 1,
    }

    async def plain() -> tuple[int, list[list[int]]]:
        resp = await client.chat.completions.create(**request)
        return resp.usage.completion_tokens, [c.token_ids for c in resp.choices]

    async def streamed() -> tuple[int, list[list[int]]]:
        stream = await client.chat.completions.create(
            **request, stream=True, stream_options={"include_usage": True}
        )
        tokens, ids = 0, {}
        async for chunk in stream:
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
            for c in chunk.choices:
                if c.finish_reason is not None:
                    ids[c.index] = c.token_ids
        return tokens, [ids[i] for i in sorted(ids)]

    methods = {"not streamed": plain, "streamed": streamed}
    runs: dict[str, list[tuple[float, float, int]]] = {name: [] for name in methods}
    outputs = {}
    for name, fn in methods.items():  # warm-up
        outputs[name] = loop.run_until_complete(fn())[1]
    assert outputs["streamed"] == outputs["not streamed"], "the two variants must sample the same tokens"
    load = [os.getloadavg()[0]]
    for run in range(args.runs):
        for name, fn in sorted(methods.items(), reverse=run % 2 == 1):
            start, cpu = time.perf_counter(), time.process_time()
            tokens, _ = loop.run_until_complete(fn())
            runs[name].append((time.perf_counter() - start, time.process_time() - cpu, tokens))
            print(name, runs[name][-1])
    load.append(os.getloadavg()[0])
    rows = []
    for name, samples in runs.items():
        tps = statistics.median(t / s for s, _, t in samples)
        cpu_ms = statistics.median(1000 * c / t for _, c, t in samples)
        rows.append(
            {
                "method": name,
                "tokens_per_s": tps,
                "cpu_ms_per_token": cpu_ms,
                "runs": [{"seconds": s, "cpu_seconds": c, "tokens": t} for s, c, t in samples],
            }
        )
    base = rows[0]
    for r in rows:
        r["tokens_per_s_vs_not_streamed"] = r["tokens_per_s"] / base["tokens_per_s"]
        r["cpu_vs_not_streamed"] = r["cpu_ms_per_token"] / base["cpu_ms_per_token"]
        pairs = list(zip(runs["not streamed"], runs[r["method"]], strict=True))
        # same tokens on both sides of a pair, so the ratios of seconds are the ratios of tokens/s
        r["paired_tokens_per_s_vs_not_streamed"] = statistics.median(b[0] / x[0] for b, x in pairs)
        r["paired_cpu_vs_not_streamed"] = statistics.median(x[1] / b[1] for b, x in pairs)
        print(
            f"{r['method']:14s} {r['tokens_per_s']:7.1f} tok/s ({r['tokens_per_s_vs_not_streamed']:.3f}x, "
            f"paired {r['paired_tokens_per_s_vs_not_streamed']:.3f}x)  "
            f"cpu {r['cpu_ms_per_token']:6.2f} ms/token ({r['cpu_vs_not_streamed']:.3f}x, "
            f"paired {r['paired_cpu_vs_not_streamed']:.3f}x)"
        )
    report = {
        "model": args.model,
        "n": args.n,
        "max_tokens": args.max_tokens,
        "runs": args.runs,
        "torch_threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "load_average_before_after": load,
        "results": rows,
    }
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
