"""The output head of a decode step, in whichever matmul form is faster for its few rows.

A decode step multiplies 1-8 rows by the output head, the largest weight of a small model
(SmolLM2-135M: [49152, 576], a fifth of its weights). How fast the BLAS runs `x W^T` at so few
rows varies a lot between CPUs, and on some `(W x^T)^T`, the same product as a tall-skinny
matmul, runs faster. So each row count's form is timed once on the head's own weight and the
faster one is kept (`HeadPlan`); a single row (a matrix-vector product) and prefill-sized
batches keep the usual form. The result is the same product; only float rounding may differ, so
a timing taken on a busy machine can make two runs of one seed sample differently: the head is
planned only with `model.fast = "timed"` (CHANGELOG.md, changes 9, 16 and 17). The blocks'
weights have a plan of their own, `decode.MatmulPlan`, timed on whole decode steps.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F

PLANNED_ROWS = range(2, 9)
"""Row counts a decode step runs at, where the form is chosen by timing."""


class HeadPlan:
    """Whether `(W x^T)^T` beats `x W^T` on this machine, per row count, for one weight."""

    def __init__(self, weight: torch.Tensor):
        self.weight = weight
        self._transposed: dict[int, bool] = {}

    def transposed(self, rows: int) -> bool:
        # a CPU BLAS quirk; on a GPU the kernels run asynchronously, so host timers would not measure them
        if rows not in PLANNED_ROWS or self.weight.device.type != "cpu":
            return False
        if rows not in self._transposed:
            self._transposed[rows] = self._time(rows)
        return self._transposed[rows]

    def chosen(self) -> dict[int, bool]:
        """The forms decided so far (timed or fixed), by row count."""
        return dict(self._transposed)

    def fix(self, forms: dict[int, bool]) -> None:
        """Run these row counts in these forms (True: `(W x^T)^T`) instead of timing them."""
        self._transposed.update(forms)

    @torch.no_grad()
    def _time(self, rows: int) -> bool:
        w = self.weight
        x = torch.randn(rows, w.shape[1], dtype=w.dtype, device=w.device)
        best = {False: float("inf"), True: float("inf")}
        for _ in range(3):
            for transposed in (False, True):
                start = time.perf_counter()
                _ = torch.mm(w, x.t()) if transposed else F.linear(x, w)
                best[transposed] = min(best[transposed], time.perf_counter() - start)
        return best[True] < 0.9 * best[False]  # a clear win only: a busy machine's timings are noisy


class PlannedLinear(torch.nn.Module):
    """`y = x W^T + b` (frozen, for sampling) in the form `plan` found faster for x's row count."""

    def __init__(self, linear: torch.nn.Linear, plan: HeadPlan):
        super().__init__()
        self.weight, self.bias, self.plan = linear.weight, linear.bias, plan

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if not self.plan.transposed(rows):
            return F.linear(x, self.weight, self.bias)
        y = torch.mm(self.weight, x.reshape(rows, x.shape[-1]).t()).t()  # [rows, out]
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.weight.shape[0])


class PlannedHead:
    """Swaps a model's output head for a `PlannedLinear` while sampling; the plan persists across calls."""

    def __init__(self) -> None:
        self.plan: HeadPlan | None = None
        """The current head's plan (made at its first sampling batch)."""
        self._slot: tuple[torch.nn.Linear, torch.nn.Module, str] | None = None
        """(head, its parent, attribute): found once per head, not at every sampling batch."""

    @contextlib.contextmanager
    def applied(self, model: torch.nn.Module):
        # a transformers model's method (nn.Module's attribute lookup is typed Tensor | Module)
        head = cast(Callable[[], torch.nn.Module | None], model.get_output_embeddings)()
        if self._slot is None or self._slot[0] is not head:
            self._slot = None
            if type(head) is torch.nn.Linear:
                slot = _slot_of(model, head)
                self._slot = (head, *slot) if slot is not None else None
        if self._slot is None:
            yield  # another head type: left as it is
            return
        linear, parent, attr = self._slot  # linear is head
        if self.plan is None or self.plan.weight is not linear.weight:
            self.plan = HeadPlan(linear.weight)
        setattr(parent, attr, PlannedLinear(linear, self.plan))
        try:
            yield
        finally:
            setattr(parent, attr, head)


def _slot_of(model: torch.nn.Module, module: torch.nn.Module) -> tuple[torch.nn.Module, str] | None:
    for parent in model.modules():
        for attr, child in parent.named_children():
            if child is module:
                return parent, attr
    return None
