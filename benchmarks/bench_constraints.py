"""What constrained decoding costs in tokens/s on the real SmolLM2-135M: the sampler with and without a grammar.

n completions of one prompt (a GRPO group), up to `--max-tokens` new tokens each, temperature 1,
float32 on CPU, through `TransformersPolicy.generate` (the sampler the server uses). Each row of
the table is one constraint: none, `json_object`, a `json_schema` with five typed fields, and a
forced call of a declared tool (`tool_choice` "required", compared with the same prompt and tools
under "auto": the tool list makes the prompt longer, which costs on its own). Throughput counts the tokens actually
generated (a grammar that is complete ends its rows early) divided by wall time; the methods take
turns, one warm-up each, then the median of `--runs`. The grammar's share is also timed directly:
the seconds spent in the grammar hooks (mask and advance) per generated token.

Constrained completions end sooner (a closed JSON object allows only end-of-turn), and the CPU
decodes fewer rows at a lower tokens/s, so plain tokens/s mixes the grammar's cost with the
completions' lengths. `--ignore-eos` keeps every row running to `--max-tokens`: equal work, so
the ratio is the grammar's own cost. On a machine shared with other jobs the wall-clock ratio
moves by 20% from run to run; the process's CPU time per token (`cpu_ms_per_token`, all its
threads) is printed beside it and moves much less.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/bench_constraints.py --json docs/results/constraints_tokens_per_s.json
    OMP_WAIT_POLICY=PASSIVE python benchmarks/bench_constraints.py --ignore-eos --json docs/results/constraints_equal_length.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from grooves.policy import constraints
from grooves.policy.sampling import SamplingParams
from grooves.policy.transformers import TransformersPolicy

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "population": {"type": "integer"},
        "capital": {"type": "boolean"},
        "area_km2": {"type": "number"},
        "languages": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["city", "population", "capital", "area_km2", "languages"],
    "additionalProperties": False,
}
CASES = {
    "none": ({}, None),
    "json_object": ({"response_format": {"type": "json_object"}}, None),
    "json_schema": (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "city", "schema": SCHEMA, "strict": True},
            }
        },
        None,
    ),
    "tools, tool_choice=auto": ({"tool_choice": "auto"}, [WEATHER]),
    "tools, tool_choice=required": ({"tool_choice": "required"}, [WEATHER]),
}
BASELINE = {
    "json_object": "none",
    "json_schema": "none",
    "tools, tool_choice=required": "tools, tool_choice=auto",
}
"""Each constrained case is compared with the unconstrained one of the same prompt (tools make it longer)."""
QUESTION = "Describe Paris: its population, whether it is a capital, its area and its languages. What is the weather there?"


class _Timed:
    """Wraps GrammarMask to add up the seconds spent in it."""

    seconds = 0.0

    def __init__(self, inner):
        self.inner = inner

    def apply(self, logits):
        start = time.perf_counter()
        self.inner.apply(logits)
        _Timed.seconds += time.perf_counter() - start

    def advance(self, token):
        start = time.perf_counter()
        self.inner.advance(token)
        _Timed.seconds += time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--ignore-eos",
        action="store_true",
        help="every row runs to --max-tokens (a finished grammar allows only end-of-turn tokens): equal work per method",
    )
    args = ap.parse_args()

    policy = TransformersPolicy(args.model)
    runs: dict[str, list[tuple[float, int, float, float]]] = {name: [] for name in CASES}
    prepared = {}
    for name, (request, tools) in CASES.items():
        prompt = policy.prompts.render([{"role": "user", "content": QUESTION}], tools)
        constraint = policy.prompts.constraint_for(tools=tools, **request)
        factory = (lambda c=constraint: _Timed(c())) if constraint is not None else None
        prepared[name] = (prompt, factory)
    if args.ignore_eos:  # after the grammars were compiled with the real end-of-turn ids
        policy.sampler.eos_token_ids = set()

    def once(name: str) -> tuple[float, int, float, float]:
        prompt, factory = prepared[name]
        params = SamplingParams(n=args.n, max_tokens=args.max_tokens, temperature=1.0, constraint=factory)
        _Timed.seconds = 0.0
        start, cpu = time.perf_counter(), time.process_time()
        completions = policy.generate([prompt], [params])[0]
        tokens = sum(len(c.token_ids) for c in completions)
        return time.perf_counter() - start, tokens, _Timed.seconds, time.process_time() - cpu

    for name in CASES:  # warm-up
        once(name)
    for _ in range(args.runs):
        for name in CASES:
            runs[name].append(once(name))
            print(name, runs[name][-1])
    tps = {name: statistics.median(t / s for s, t, _, _ in samples) for name, samples in runs.items()}
    cpu = {name: statistics.median(1000 * c / t for _, t, _, c in samples) for name, samples in runs.items()}
    rows = []
    for name, samples in runs.items():
        base = BASELINE.get(name, name)
        grammar_ms = statistics.median(1000 * g / t for _, t, g, _ in samples)
        rows.append(
            {
                "constraint": name,
                "tokens_per_s": tps[name],
                "baseline": base,
                "vs_baseline": tps[name] / tps[base],
                "cpu_ms_per_token": cpu[name],
                "cpu_vs_baseline": cpu[name] / cpu[base],
                "grammar_ms_per_token": grammar_ms,
                "runs": [
                    {"seconds": s, "tokens": t, "grammar_seconds": g, "cpu_seconds": c}
                    for s, t, g, c in samples
                ],
            }
        )
        print(
            f"{name:28s} {tps[name]:7.1f} tok/s  {tps[name] / tps[base]:5.2f}x of {base!r}  "
            f"cpu {cpu[name]:6.2f} ms/token ({cpu[name] / cpu[base]:4.2f}x)  grammar {grammar_ms:.3f} ms/token"
        )
    report = {
        "model": args.model,
        "n": args.n,
        "max_tokens": args.max_tokens,
        "runs": args.runs,
        "ignore_eos": args.ignore_eos,
        "torch_threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "load_average": os.getloadavg(),
        "llguidance": _version("llguidance"),
        "results": rows,
        "json_format": constraints.JSON_FORMAT,
    }
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    main()
