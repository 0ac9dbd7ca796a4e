"""Page faults of big freed tensors, with glibc's defaults and with `reuse_freed_memory` (model.fast).

glibc hands an allocation above its mmap threshold back to the kernel when it is freed, so the
next one of that size is mapped again and every page zeroed and faulted in anew. The sampler
allocates and frees the same big tensors every decode step; `policy.fast.allocator` raises the
thresholds so freed blocks are reused. This counts minor page faults over ten rounds of a 48 MB
tensor made and freed, in a fresh interpreter for each form (the setting is process-wide):
glibc's defaults, the `mallopt` call, and the environment form (`ENVIRONMENT`, read at start).

Run: .venv/bin/python benchmarks/bench_allocator.py [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys

SCRIPT = """
import resource
import torch
from grooves.policy.fast.allocator import reuse_freed_memory

def faults(rounds):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(rounds):
        torch.ones(12_000_000)  # 48 MB, freed at once: above the largest mmap threshold glibc picks
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

default = faults(10)
applied = APPLY
faults(10)  # the heap grows to hold the blocks (small allocations splitting freed ones settle within ten rounds)
print(default, faults(10), applied)
"""


def _run(apply: str, env: dict[str, str] | None = None) -> tuple[int, int, str]:
    script = SCRIPT.replace("APPLY", apply)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env)
    default, reused, applied = out.stdout.split()
    return int(default), int(reused), applied


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the counts here")
    args = parser.parse_args()
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        sys.exit("glibc's malloc only")
    from grooves.policy.fast.allocator import ENVIRONMENT

    pages = 10 * 48_000_000 // resource.getpagesize()
    default, mallopt, applied = _run("reuse_freed_memory()")
    _, environment, _ = _run("True", {**os.environ, **ENVIRONMENT})
    rows = {
        "pages_per_10_rounds": pages,
        "glibc_defaults": default,
        "reuse_freed_memory": mallopt,
        "environment_form": environment,
        "applied": applied == "True",
    }
    print(f"minor page faults over 10 rounds of a 48 MB tensor ({pages} pages of them):")
    for name in ("glibc_defaults", "reuse_freed_memory", "environment_form"):
        print(f"  {name:<20}{rows[name]:>10}  ({rows[name] / pages:.0%} of the pages)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
