"""The floor of one GRPO step: its matmul FLOPs over this machine's measured float32 matmul rate,
and the physical limit (the roofline): weight bytes over the memory's read bandwidth for decoding,
FLOPs over the peak large-matmul rate for the rest.

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

That floor charges decode steps at the rate of the small-row matmul kernel itself, so a slow
kernel defines its own floor. The roofline does not (`roofline_seconds`):

- generation: every decode step reads every weight once (N weights, plus the tied output head's,
  at 4 bytes in float32), so it cannot take less than weight bytes / read bandwidth, the
  bandwidth measured as a `torch.sum` over a 256 MB tensor; plus the prefill's FLOPs at the peak
  rate;
- training: its FLOPs at the peak large-matmul rate: the best of MKL (`torch.matmul`) and oneDNN
  (prepacked weights) over the model's shapes at the training width (and at 512 rows).

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


def read_bandwidth(repeats: int = 7, megabytes: int = 256) -> float:
    """Bytes/s a `torch.sum` reads from a float32 tensor of `megabytes` (best of `repeats`):
    larger than the caches, so what the memory delivers to one reduction on every thread."""
    x = torch.ones(megabytes * 2**20 // 4)
    x.sum()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - start)
    return x.numel() * 4 / best


def packed_matmul_rate(dims: Dims, rows: int, repeats: int = 7) -> float:
    """FLOP/s of oneDNN's float32 linear on prepacked weights (`policy/fast/kernels.PackedKernels`'
    ops) over one forward's weight shapes at `rows` rows (best of repeats); 0 without oneDNN."""
    from grooves.policy.fast.kernels import onednn_available

    if not onednn_available():
        return 0.0
    gen = torch.Generator().manual_seed(0)
    shapes = [s for _ in range(dims.layers) for s in dims.linear_shapes()] + [(dims.hidden, dims.vocab)]
    packed = [
        torch.ops.mkldnn._reorder_linear_weight(torch.randn(b, a, generator=gen) * 0.02, rows)
        for a, b in shapes
    ]
    inputs = {a: torch.randn(rows, a, generator=gen) for a in {a for a, _ in shapes}}
    flops = sum(2 * rows * a * b for a, b in shapes)

    def run() -> None:
        for (a, _), w in zip(shapes, packed, strict=True):
            torch.ops.mkldnn._linear_pointwise(inputs[a], w, None, "none", [], "")

    run()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return flops / best


def roofline_seconds(
    dims: Dims,
    prompt: int,
    lengths: list[int],
    lora_rank: int = 8,
    repeats: int = 7,
    bytes_per_weight: int = 4,
) -> dict[str, float]:
    """The physical limit of one step on this CPU: decode steps x weight bytes / read bandwidth, and
    the prefill's and training's FLOPs at the peak large-matmul rate (see the module doc)."""
    f = step_flops(dims, prompt, lengths, lora_rank)
    wide = int(f["train_tokens"])
    peak = max(  # the faster of MKL and oneDNN, at the training width and at 512 rows
        *(matmul_rate(dims, rows, repeats) for rows in (wide, 512)),
        *(packed_matmul_rate(dims, rows, repeats) for rows in (wide, 512)),
    )
    bandwidth = read_bandwidth(repeats)
    weight_bytes = float(dims.matmul_params * bytes_per_weight)
    decode = f["decode_steps"] * weight_bytes / bandwidth
    generation = f["prefill"] / peak + decode
    training = f["training"] / peak
    return {
        "roofline_generation_s": generation,
        "roofline_decode_s": decode,
        "roofline_training_s": training,
        "roofline_step_s": generation + training,
        "read_bandwidth": bandwidth,
        "peak_rate": peak,
        "weight_bytes": weight_bytes,
    }


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
    ap.add_argument("--no-roofline", action="store_true", help="only the FLOPs / same-width matmul floor")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.model is None:
        from grooves.models import ensure_model

        args.model = str(ensure_model())
    dims = Dims.from_config(args.model)
    lengths = (
        [int(x) for x in args.lengths.split(",")] if args.lengths else [args.completion] * args.group_size
    )
    load = os.getloadavg()[0]
    out = floor_seconds(
        dims, args.prompt_tokens, lengths, args.lora_rank, device=args.device, dtype=args.dtype
    )
    roofline = args.device == "cpu" and args.dtype == "float32" and not args.no_roofline
    if roofline:
        out.update(roofline_seconds(dims, args.prompt_tokens, lengths, args.lora_rank))
    out["load_average"] = [load, os.getloadavg()[0]]
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
    if roofline:
        steps = int(out["flops_decode_steps"])
        print(
            f"roofline: read bandwidth {out['read_bandwidth'] / 1e9:.1f} GB/s, {out['weight_bytes'] / 1e6:.0f} MB of "
            f"weights per decode step ({out['weight_bytes'] / out['read_bandwidth'] * 1e3:.1f} ms), peak matmul rate "
            f"{out['peak_rate'] / 1e9:.1f} GFLOP/s"
        )
        print(
            f"roofline: generation {out['roofline_generation_s']:.3f} s ({steps} decode steps "
            f"{out['roofline_decode_s']:.3f} s + prefill), training {out['roofline_training_s']:.3f} s, "
            f"step {out['roofline_step_s']:.3f} s"
        )
    print(f"1-minute load average: {out['load_average'][0]:.1f} before, {out['load_average'][1]:.1f} after")


if __name__ == "__main__":
    main()
