"""Keep freed big blocks in the process instead of giving them back to the kernel (glibc, CPU).

A GRPO step on a CPU allocates and frees many tensors of tens of MB: the output head's logits
over the vocabulary for a few hundred positions, the log-softmax, its backward and the gradient
of the logits. glibc's malloc serves every block above its mmap threshold (which it never raises
past 32 MiB) with a fresh `mmap` and unmaps it on `free`, so each such tensor faults all its
pages in again, zeroed by the kernel. With mmap off for the heap and trimming raised, freed
blocks are reused instead (CHANGELOG.md, change 11, counts the page faults per step). It is what
preloading jemalloc or tcmalloc does in PyTorch's CPU tuning advice, without another library.

The cost: memory that torch frees stays with the process, so its resident size stays near its
peak between steps instead of dropping. `model.fast = "off"` keeps glibc's defaults.
"""

from __future__ import annotations

import ctypes
import platform

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
"""mallopt parameters, from glibc's malloc.h."""

_TRIM_THRESHOLD = 2**31 - 1
"""Free memory at the top of the heap is given back to the kernel only past this (mallopt takes
an int: 2 GiB, more than a CPU step's temporaries)."""

ENVIRONMENT = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(_TRIM_THRESHOLD)}
"""The same settings as glibc environment variables, for a process that does not call
`reuse_freed_memory` itself (glibc reads them when it starts)."""


def reuse_freed_memory() -> bool:
    """Tell glibc's malloc to serve big blocks from its heap and keep what is freed; process-wide.

    Returns False, changing nothing, where the C library is not glibc (musl, macOS, Windows).
    Threads' own arenas still take blocks larger than their 64 MiB heaps from mmap (glibc falls
    back to it), so no allocation fails for want of heap.
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)
    # each returns 1 on success; a 0 leaves that setting at glibc's default
    trimmed = libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
    unmapped = libc.mallopt(_M_MMAP_MAX, 0)
    return bool(trimmed and unmapped)
