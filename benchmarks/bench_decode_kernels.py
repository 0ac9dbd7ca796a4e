"""One decode step's matmuls with each of the sampler's kernels, interleaved, against the roofline.

A decode step of R rows multiplies [R, in] by every weight of the model once: per block the
fused q/k/v, o, the fused gate/up and down, then the output head (the groups `decode.FusedDecode`
runs), on random weights of the model's shapes. Each kernel makes one such pass per round, the
kernels take turns within a round (first one rotates), and a round's ratio is a kernel's time
over MKL's in that round: on a shared machine only those ratios mean anything. Kernels:

- MKL float32: `F.linear` (what `model.fast = "off"` and before this change the fused decode ran);
- oneDNN float32 packed: `kernels.PackedKernels` (`model.fast = "on"`), the weights packed for
  this row count, and (other row counts) packed for 8 rows, as the sampler packs them;
- int8 weights: `kernels.LowPrecisionKernels("int8")` (weight-only int8, bf16 activations);
- bfloat16 weights: `kernels.LowPrecisionKernels("bfloat16")`.

The roofline of a pass is the float32 weight bytes over the read bandwidth (`bench_floor.read_bandwidth`);
the low-precision kernels read fewer bytes, so they may beat it. Reported: the best pass (what the
machine can do; load only slows it), the median ratio to MKL over the rounds and its spread.

    python benchmarks/bench_decode_kernels.py --rows 1,8,64 --rounds 7 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_floor import Dims, read_bandwidth  # noqa: E402

from grooves.models import ensure_model  # noqa: E402
from grooves.policy.fast.kernels import quantize_rows  # noqa: E402


def group_shapes(dims: Dims) -> list[tuple[int, int]]:
    """(in, out) of each matmul of one decode step: per block qkv, o, gate_up, down; then the head."""
    h, kv, q, i = dims.hidden, dims.kv_heads * dims.head_dim, dims.heads * dims.head_dim, dims.intermediate
    return [(h, q + 2 * kv), (q, h), (h, 2 * i), (i, h)] * dims.layers + [(h, dims.vocab)]


def kernels(weights: list[torch.Tensor], rows: int) -> dict:
    """name -> a function running one pass over all weights on its inputs."""
    packed = [torch.ops.mkldnn._reorder_linear_weight(w, rows) for w in weights]
    packed8 = packed if rows == 8 else [torch.ops.mkldnn._reorder_linear_weight(w, 8) for w in weights]
    int8 = []
    for w in weights:
        q, s = quantize_rows(w)
        int8.append((q, s.to(torch.bfloat16)))
    bf16 = [torch.ops.mkldnn._reorder_linear_weight(w.to(torch.bfloat16), rows) for w in weights]

    def mkl(xs):
        for x, w in zip(xs, weights, strict=True):
            F.linear(x, w)

    def onednn(xs):
        for x, w in zip(xs, packed, strict=True):
            torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")

    def onednn8(xs):
        for x, w in zip(xs, packed8, strict=True):
            torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")

    def w8(xs):
        for x, (q, s) in zip(xs, int8, strict=True):
            torch._weight_int8pack_mm(x.to(torch.bfloat16), q, s).float()

    def b16(xs):
        for x, w in zip(xs, bf16, strict=True):
            torch.ops.mkldnn._linear_pointwise(x.to(torch.bfloat16), w, None, "none", [], "").float()

    return {
        "MKL float32": mkl,
        "oneDNN float32 packed": onednn,
        **({} if rows == 8 else {"oneDNN float32 packed for 8 rows": onednn8}),
        "int8 weights": w8,
        "bfloat16 weights": b16,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="1,8,64")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dims = Dims.from_config(ensure_model())
    gen = torch.Generator().manual_seed(0)
    shapes = group_shapes(dims)
    weights = [torch.randn(b, a, generator=gen) * 0.02 for a, b in shapes]
    weight_bytes = sum(w.numel() for w in weights) * 4
    load_before = os.getloadavg()[0]
    bandwidth = read_bandwidth()
    roof_s = weight_bytes / bandwidth
    report = {
        "command": sys.argv,
        "threads": args.threads,
        "weight_bytes": weight_bytes,
        "read_bandwidth": bandwidth,
        "roofline_pass_s": roof_s,
        "rows": {},
    }
    print(
        f"{weight_bytes / 1e6:.0f} MB of float32 weights per pass, read bandwidth {bandwidth / 1e9:.1f} GB/s: "
        f"roofline {roof_s * 1e3:.1f} ms a pass"
    )
    for rows in [int(r) for r in args.rows.split(",")]:
        fns = kernels(weights, rows)
        xs = [torch.randn(rows, a, generator=gen) for a, _ in shapes]
        names = list(fns)
        for fn in fns.values():
            fn(xs)  # warm-up
        times: dict[str, list[float]] = {n: [] for n in names}
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                start = time.perf_counter()
                fns[name](xs)
                times[name].append(time.perf_counter() - start)
        entry = {}
        print(
            f"rows = {rows}: best pass ms, tokens/s at the best pass, of the roofline; ratio to MKL median [min-max]"
        )
        for name in names:
            ratios = [m / t for m, t in zip(times["MKL float32"], times[name], strict=True)]
            best = min(times[name])
            entry[name] = {
                "times_s": times[name],
                "best_s": best,
                "tokens_per_s_best": rows / best,
                "of_roofline": roof_s / best,
                "speedup_vs_mkl_median": statistics.median(ratios),
                "speedup_vs_mkl_range": [min(ratios), max(ratios)],
            }
            print(
                f"  {name:24s} {best * 1e3:8.1f} ms  {rows / best:8.1f} tok/s  {roof_s / best:5.2f}x roofline  "
                f"{statistics.median(ratios):.2f}x MKL [{min(ratios):.2f}-{max(ratios):.2f}]"
            )
        report["rows"][str(rows)] = entry
        del fns
    report["load_average"] = [load_before, os.getloadavg()[0]]
    print(
        f"1-minute load average: {report['load_average'][0]:.1f} before, {report['load_average'][1]:.1f} after"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
