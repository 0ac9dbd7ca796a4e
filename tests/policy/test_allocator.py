import platform
import resource
import subprocess
import sys

import pytest

# The setting is process-wide, so it is measured in a fresh interpreter, before and after.
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
applied = reuse_freed_memory()
faults(10)  # the heap grows to hold the blocks (small allocations splitting freed ones settle within ten rounds)
print(default, faults(10), applied)
"""


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc only"
)
def test_freed_big_blocks_are_reused_instead_of_faulted_in_again():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True).stdout
    default, reused, applied = out.split()
    assert applied == "True"
    pages = 10 * 48_000_000 // resource.getpagesize()
    assert int(default) > 0.9 * pages  # every block mapped afresh, every page zeroed again
    # small allocations between the big ones can split a freed block, so the heap may grow once
    # more (a tenth of the pages); without reuse it is every page of every block
    assert int(reused) < 0.15 * pages


def test_other_c_libraries_are_left_alone(monkeypatch):
    from grooves.policy.fast import allocator

    monkeypatch.setattr(allocator.platform, "libc_ver", lambda: ("", ""))
    assert allocator.reuse_freed_memory() is False


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc only"
)
def test_the_environment_form_has_the_same_effect():
    import os

    from grooves.policy.fast.allocator import ENVIRONMENT

    script = SCRIPT.replace(
        "applied = reuse_freed_memory()", "applied = True"
    )  # glibc read the settings at start
    env = {**os.environ, **ENVIRONMENT}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env
    ).stdout
    _, reused, _ = out.split()  # the first rounds grow the heap, as often as the splits happen to need
    pages = 10 * 48_000_000 // resource.getpagesize()
    assert int(reused) < 0.15 * pages  # the bound of the mallopt test above
