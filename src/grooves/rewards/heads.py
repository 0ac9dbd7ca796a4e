"""Regression heads that map frozen features to a score: closed-form ridge, or a small MLP.

Ridge regression is the default: one linear solve, no learning rate, no epochs, and with a few
hundred labelled pairs it is hard to beat on frozen features. The penalty is chosen on a validation
split of the training data, never on the held-out test set. The MLP is there for features where the
score is not linear (the same frozen features, one hidden layer); it is trained full-batch with
Adam and a fixed seed, so it is deterministic.
"""

from __future__ import annotations

import random
from typing import Any, Protocol

import torch

RIDGE_GRID = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)
MLP_L2_GRID = (1e-3, 1e-2, 1e-1)


class Head(Protocol):
    kind: str

    def fit(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Fit on features x [N, D] and targets y [N]."""
        ...

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """[N] predictions for features x [N, D]."""
        ...

    def params(self) -> dict[str, Any]:
        """JSON-serializable settings (saved next to the weights)."""
        ...

    def state(self) -> dict[str, torch.Tensor]:
        """Weights to save with safetensors."""
        ...


def ridge_fit(x: torch.Tensor, y: torch.Tensor, l2: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Ridge regression with an unpenalized bias, in closed form (Hoerl & Kennard 1970).

    With centred Xc = x - mean(x), yc = y - mean(y):
      w = (Xc^T Xc + l2 I)^-1 Xc^T yc          (primal, when D <= N)
        = Xc^T (Xc Xc^T + l2 I)^-1 yc          (dual, the same w, cheaper when D > N)
      b = mean(y) - mean(x) . w
    Solved in float64; returns (w [D], b []) in float32.
    """
    x64, y64 = x.double(), y.double()
    mx, my = x64.mean(0), y64.mean()
    xc, yc = x64 - mx, y64 - my  # [N, D], [N]
    n, d = xc.shape
    if d <= n:
        w = torch.linalg.solve(xc.T @ xc + l2 * torch.eye(d, dtype=torch.float64), xc.T @ yc)
    else:
        w = xc.T @ torch.linalg.solve(xc @ xc.T + l2 * torch.eye(n, dtype=torch.float64), yc)
    b = my - mx @ w
    return w.float(), b.float()


def _split(n: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    idx = list(range(n))
    random.Random(seed).shuffle(idx)
    k = max(1, int(round(n * fraction)))
    return idx[k:], idx[:k]


class RidgeHead:
    """Linear head fit in closed form; `l2=None` picks the penalty from RIDGE_GRID on a validation split."""

    kind = "ridge"

    def __init__(self, l2: float | None = None, seed: int = 0) -> None:
        if l2 is not None and l2 <= 0:
            raise ValueError(f"l2 must be > 0 (or None to choose it), got {l2}")
        self.l2 = l2
        self.seed = seed
        self.w = torch.zeros(0)
        self.b = torch.zeros(())

    def fit(self, x: torch.Tensor, y: torch.Tensor) -> None:
        if self.l2 is None:
            train, val = _split(len(y), 0.2, self.seed)
            errors = {}
            for l2 in RIDGE_GRID:
                w, b = ridge_fit(x[train], y[train], l2)
                errors[l2] = float(((x[val] @ w + b - y[val]) ** 2).mean())
            self.l2 = min(errors, key=lambda k: errors[k])
        self.w, self.b = ridge_fit(x, y, self.l2)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return x.float() @ self.w + self.b

    def params(self) -> dict[str, Any]:
        return {"l2": self.l2, "seed": self.seed}

    def state(self) -> dict[str, torch.Tensor]:
        return {"w": self.w.contiguous(), "b": self.b.reshape(1).contiguous()}

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        self.w, self.b = state["w"], state["b"].reshape(())


class MLPHead:
    """One hidden layer (GELU) on the mean squared error of standardized targets plus an L2 penalty.

    loss = mean((f(x) - y)^2) + l2 * sum of squared weights. The explicit penalty matters: with a few
    hundred examples and thousands of features the net otherwise interpolates the training set
    (AdamW's decoupled decay is far too weak at these learning rates). `l2=None` picks it from
    MLP_L2_GRID on a validation split, as the ridge head does. Features are centred and divided by
    one global scale (their overall RMS), not per feature: a sparse feature seen once in training
    has a tiny std, and dividing by it makes that feature explode on test data.
    """

    kind = "mlp"

    def __init__(
        self, hidden: int = 64, epochs: int = 300, lr: float = 3e-3, l2: float | None = None, seed: int = 0
    ) -> None:
        self.hidden, self.epochs, self.lr, self.l2, self.seed = hidden, epochs, lr, l2, seed
        self.net: torch.nn.Sequential | None = None
        self.mean = torch.zeros(0)
        self.scale = torch.ones(1)
        self.y_mean_std = torch.tensor([0.0, 1.0])

    def _build(self, d: int) -> torch.nn.Sequential:
        torch.manual_seed(self.seed)
        return torch.nn.Sequential(
            torch.nn.Linear(d, self.hidden), torch.nn.GELU(), torch.nn.Linear(self.hidden, 1)
        )

    def _train(self, xs: torch.Tensor, ys: torch.Tensor, l2: float) -> torch.nn.Sequential:
        net = self._build(xs.shape[1])
        opt = torch.optim.Adam(net.parameters(), lr=self.lr)
        weights = [p for name, p in net.named_parameters() if name.endswith("weight")]
        for _ in range(self.epochs):
            opt.zero_grad()
            loss = ((net(xs).squeeze(-1) - ys) ** 2).mean() + l2 * sum((w**2).sum() for w in weights)
            loss.backward()
            opt.step()
        return net.eval()

    def fit(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.mean = x.mean(0)
        self.scale = ((x - self.mean) ** 2).mean().sqrt().clamp_min(1e-8).reshape(1)
        self.y_mean_std = torch.stack([y.mean(), y.std().clamp_min(1e-8)])
        xs = (x - self.mean) / self.scale  # [N, D]
        ys = (y - self.y_mean_std[0]) / self.y_mean_std[1]  # [N]
        if self.l2 is None:
            train, val = _split(len(y), 0.2, self.seed)
            errors = {}
            for l2 in MLP_L2_GRID:
                net = self._train(xs[train], ys[train], l2)
                with torch.no_grad():
                    errors[l2] = float(((net(xs[val]).squeeze(-1) - ys[val]) ** 2).mean())
            self.l2 = min(errors, key=lambda k: errors[k])
        self.net = self._train(xs, ys, self.l2)

    @torch.no_grad()
    def predict(self, x: torch.Tensor) -> torch.Tensor:
        if self.net is None:
            raise RuntimeError("MLPHead.predict before fit or load_state")
        out = self.net((x.float() - self.mean) / self.scale).squeeze(-1)
        return self.y_mean_std[0] + self.y_mean_std[1] * out

    def params(self) -> dict[str, Any]:
        return {"hidden": self.hidden, "epochs": self.epochs, "lr": self.lr, "l2": self.l2, "seed": self.seed}

    def state(self) -> dict[str, torch.Tensor]:
        assert self.net is not None
        out = {f"net.{k}": v.contiguous() for k, v in self.net.state_dict().items()}
        return out | {
            "mean": self.mean.contiguous(),
            "scale": self.scale.contiguous(),
            "y_mean_std": self.y_mean_std.contiguous(),
        }

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        self.mean, self.scale, self.y_mean_std = state["mean"], state["scale"], state["y_mean_std"]
        self.net = self._build(self.mean.shape[0])
        self.net.load_state_dict({k[4:]: v for k, v in state.items() if k.startswith("net.")})
        self.net.eval()


def head_from_saved(kind: str, params: dict[str, Any], state: dict[str, torch.Tensor]) -> RidgeHead | MLPHead:
    """Rebuild a fitted head from `kind`, `params()` and `state()`."""
    head: RidgeHead | MLPHead
    if kind == "ridge":
        head = RidgeHead(l2=params["l2"], seed=int(params["seed"]))
    elif kind == "mlp":
        head = MLPHead(
            hidden=int(params["hidden"]),
            epochs=int(params["epochs"]),
            lr=float(params["lr"]),
            l2=params["l2"],
            seed=int(params["seed"]),
        )
    else:
        raise ValueError(f"unknown head kind {kind!r}; known: ridge, mlp")
    head.load_state(state)
    return head
