"""The floor of one GRPO step: its matmul FLOPs over this machine's measured float32 matmul rate.

Counting (N = weights a token passes through: every linear layer of every block plus the output
head, 134.5M for SmolLM2-135M; the embedding lookup costs no FLOPs):

- forward, per token:  2 N  (one multiply-add per weight) + 4 L C H for attention over C
  context tokens (QK^T and AV, L layers, H = heads x head_dim), + 2 r (in + out) per LoRA layer;
- LoRA backward, per token: 2 N + the LoRA terms. The frozen weights need no weight gradient, but
  the activation gradient still flows through every one of them (dX = dY W^T, 2 N); full
  fine-tuning would add another 2 N of weight gradients, hence the usual "6 N" -- for LoRA it is 4 N;
- generation: the group's prompt is prefilled once (P tokens), then the batch decodes one token
  per step until its longest completion ends (max_i C_i - 1 steps after the first token, which
  the prefill predicts). On a CPU a decode step reads every weight once whatever the number of
  live rows, so each step is charged G rows (the batch's width);
- training: one forward + backward over the prompt once and every completion token
  (P + sum_i C_i tokens), which is what a shared-prefix forward computes.

Not counted: log-softmax over the vocabulary, norms, activations, the optimizer update of the
LoRA weights: all O(tokens x hidden) or smaller. The matmul rate is measured, not taken from a data
sheet: `torch.matmul` in float32 on every thread, over one forward's worth of the model's own
weight shapes (distinct tensors, so weights stream from memory as in the real model), at the two
batch widths a step uses: G rows (decode) and P + sum C rows (prefill and training). The rate is the
best of `repeats` timings: a floor is what the machine can do, and other work on it only ever
slows a timing down. On a GPU (`device="cuda"`, bf16) the same count runs there.

    python benchmarks/bench_floor.py --prompt-tokens 24 --completion 32 --group-size 8
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class Dims:
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @classmethod
    def from_config(cls, model_dir: str | Path) -> Dims:
        c = json.loads((Path(model_dir) / "config.json").read_text())
        head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
        return cls(
            c["num_hidden_layers"],
            c["hidden_size"],
            c["intermediate_size"],
            c["num_attention_heads"],
            c.get("num_key_value_heads", c["num_attention_heads"]),
            head_dim,
            c["vocab_size"],
        )

    def linear_shapes(self) -> list[tuple[int, int]]:
        """(in, out) of each linear layer of one block: q, k, v, o, gate, up, down."""
        h, kv, q = self.hidden, self.kv_heads * self.head_dim, self.heads * self.head_dim
        i = self.intermediate
        return [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]

    @property
    def matmul_params(self) -> int:
        """N: weights each token multiplies through (blocks + output head)."""
        return self.layers * sum(a * b for a, b in self.linear_shapes()) + self.hidden * self.vocab


def forward_flops(dims: Dims, tokens: int, context: float, lora_rank: int) -> float:
    """2 N per token + attention (4 L C H per token at mean context C) + LoRA (2 r (in+out) per layer)."""
    lora = dims.layers * sum(2 * lora_rank * (a + b) for a, b in dims.linear_shapes())
    attention = 4 * dims.layers * context * dims.heads * dims.head_dim
    return tokens * (2 * dims.matmul_params + attention + lora)


def step_flops(dims: Dims, prompt: int, lengths: list[int], lora_rank: int = 8) -> dict[str, float]:
    """FLOPs of one GRPO step for a group whose completions have `lengths` tokens (see the module doc)."""
    group, longest, total = len(lengths), max(lengths), sum(lengths)
    prefill = forward_flops(dims, prompt, prompt / 2, lora_rank)
    decode_steps = max(longest - 1, 0)
    decode = forward_flops(dims, group * decode_steps, prompt + longest / 2, lora_rank)
    train_tokens = prompt + total
    train_forward = forward_flops(dims, train_tokens, prompt + longest / 2, lora_rank)
    return {
        "prefill": prefill,
        "decode": decode,
        "decode_steps": float(decode_steps),
        "generation": prefill + decode,
        "training": 2
        * train_forward,  # forward + backward: the backward costs what the forward does (see doc)
        "train_tokens": float(train_tokens),
    }


def matmul_rate(
    dims: Dims, rows: int, repeats: int = 7, device: str = "cpu", dtype: str = "float32"
) -> float:
    """FLOP/s of torch.matmul over one forward's weight shapes at batch width `rows` (best of repeats)."""
    gen = torch.Generator().manual_seed(0)
    kind = getattr(torch, dtype)
    shapes = [s for _ in range(dims.layers) for s in dims.linear_shapes()] + [(dims.hidden, dims.vocab)]
    weights = [(torch.randn(a, b, generator=gen) * 0.02).to(device, kind) for a, b in shapes]
    inputs = {a: torch.randn(rows, a, generator=gen).to(device, kind) for a in {a for a, _ in shapes}}
    flops = sum(2 * rows * a * b for a, b in shapes)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for w in weights[:8]:  # warm up the kernels
        torch.matmul(inputs[w.shape[0]], w)
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        for w in weights:
            torch.matmul(inputs[w.shape[0]], w)
        sync()
        times.append(time.perf_counter() - start)
    return flops / min(times)


def floor_seconds(
    dims: Dims,
    prompt: int,
    lengths: list[int],
    lora_rank: int = 8,
    repeats: int = 7,
    device: str = "cpu",
    dtype: str = "float32",
) -> dict[str, float]:
    """Floor seconds of generation and training, and the two measured rates (FLOP/s)."""
    f = step_flops(dims, prompt, lengths, lora_rank)
    decode_rate = matmul_rate(dims, len(lengths), repeats, device, dtype)
    wide_rate = matmul_rate(dims, int(f["train_tokens"]), repeats, device, dtype)
    generation = f["prefill"] / wide_rate + f["decode"] / decode_rate
    training = f["training"] / wide_rate
    return {
        "generation_s": generation,
        "training_s": training,
        "step_s": generation + training,
        "decode_rate": decode_rate,
        "wide_rate": wide_rate,
        **{f"flops_{k}": v for k, v in f.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="model directory (default: the embedded SmolLM2-135M)")
    ap.add_argument("--prompt-tokens", type=int, default=24)
    ap.add_argument("--completion", type=int, default=32, help="tokens per completion")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--lora-rank", type=int, default=8)
    ap.add_argument(
        "--lengths", default=None, help="comma-separated completion lengths (overrides --completion)"
    )
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--json", default=None, help="also write the numbers here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.model is None:
        from grooves.models import ensure_model

        args.model = str(ensure_model())
    dims = Dims.from_config(args.model)
    lengths = (
        [int(x) for x in args.lengths.split(",")] if args.lengths else [args.completion] * args.group_size
    )
    out = floor_seconds(
        dims, args.prompt_tokens, lengths, args.lora_rank, device=args.device, dtype=args.dtype
    )
    if args.json:
        Path(args.json).write_text(json.dumps(out))
    print(f"N (matmul weights per token) = {dims.matmul_params / 1e6:.1f}M")
    print(
        f"matmul rate: {out['decode_rate'] / 1e9:.1f} GFLOP/s at {len(lengths)} rows, "
        f"{out['wide_rate'] / 1e9:.1f} GFLOP/s at {int(out['flops_train_tokens'])} rows ({args.threads} threads, {args.device})"
    )
    print(f"generation: {out['flops_generation'] / 1e9:.1f} GFLOP -> {out['generation_s']:.3f} s")
    print(f"training:   {out['flops_training'] / 1e9:.1f} GFLOP -> {out['training_s']:.3f} s")
    print(f"floor:      {out['step_s']:.3f} s/step")


if __name__ == "__main__":
    main()
