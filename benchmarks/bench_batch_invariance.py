"""How much a row's sampled logprobs move with the batch it is decoded in (real SmolLM2-135M, float32).

Runs of one seed part after some steps although every request is seeded: the server batches
requests by arrival, and a row decoded next to a different set of rows goes through BLAS kernels
at another row count, which round differently. This measures it with the policy's own sampler and
fixed seeds, so only the batch changes:

- four capitals groups of 8 sampled in one batch, then each group alone;
- one group alone, then next to one other group whose prompt has the same length (no padding
  differs, only the row count: 8 against 16);
- the same batch twice (the control: it must be identical).

    OMP_WAIT_POLICY=PASSIVE python benchmarks/bench_batch_invariance.py
"""

from __future__ import annotations

import argparse
import os

import torch
from rich.console import Console
from rich.table import Table

from grooves.config import LoraConfig
from grooves.policy.sampling import SamplingParams
from grooves.policy.transformers import TransformersPolicy

COUNTRIES = ("France", "Japan", "Kenya", "Peru")


def compare(a: list, b: list) -> tuple[int, int, float]:
    """(rows, rows with other tokens, largest logprob gap among rows with the same tokens)."""
    rows = [(x, y) for per_a, per_b in zip(a, b, strict=True) for x, y in zip(per_a, per_b, strict=True)]
    same = [(x, y) for x, y in rows if x.token_ids == y.token_ids]
    gap = max((abs(u - v) for x, y in same for u, v in zip(x.logprobs, y.logprobs, strict=True)), default=0.0)
    return len(rows), len(rows) - len(same), gap


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    args = ap.parse_args()
    torch.set_num_threads(os.cpu_count())

    policy = TransformersPolicy(args.model, lora=LoraConfig(rank=8, alpha=16.0))
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
    params = [SamplingParams(n=8, max_tokens=24, temperature=1.0, seed=100 + i) for i in range(len(prompts))]
    together = policy.generate(prompts, params)
    alone = [policy.generate([p], [q])[0] for p, q in zip(prompts, params, strict=True)]
    pair = next(i for i in range(1, len(prompts)) if len(prompts[i]) == len(prompts[0]))
    beside = policy.generate([prompts[0], prompts[pair]], [params[0], params[pair]])[:1]
    again = policy.generate(prompts, params)

    table = Table(title=f"{args.model}, LoRA r8 folded, float32, {os.cpu_count()} threads, 24 tokens per row")
    for col in ("comparison", "rows", "rows with other tokens", "max |logprob gap|, same tokens"):
        table.add_column(col, justify="left" if col == "comparison" else "right")
    for name, (a, b) in {
        "4 groups in one batch vs each alone": (together, alone),
        "1 group alone vs beside a same-length one (8 vs 16 rows)": (alone[:1], beside),
        "the same 4-group batch twice": (together, again),
    }.items():
        rows, other, gap = compare(a, b)
        table.add_row(name, str(rows), str(other), f"{gap:.2e}")
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
