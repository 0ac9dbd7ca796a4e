"""Experiment trackers: `[logging] report_to = ["tensorboard", "wandb", "mlflow", "trackio"]`.

Each tracker is written through its own library, so its own viewer reads it: per logged step
the step's metrics (the row metrics.jsonl gets), once the resolved config, and with every samples
file a table of the samples (prompt, completion, reward, success). Where each one writes:

    tensorboard  RUN_DIR/tensorboard/        event files (`tensorboard --logdir RUN_DIR/tensorboard`)
    wandb        RUN_DIR/wandb/              an offline run: no account needed; `wandb sync` uploads it
    mlflow       RUN_DIR/mlruns/             MLflow's file store; MLFLOW_TRACKING_URI, if set, wins
    trackio      Trackio's local database    $TRACKIO_DIR (default ~/.cache/huggingface/trackio)

The libraries are optional extras (`pip install 'grooves[trackers]'`, or one of them) and are
imported only here, when named. A tracker that cannot start (not installed, a bad setting, its
library raising) is named on one line and the run goes on with the others; so is one that fails
later, which is then dropped. metrics.jsonl stays the run's record: trackers only mirror it.

A resumed run continues the same tracker runs (their ids are kept in RUN_DIR/trackers.json).
TensorBoard drops the events of steps after the checkpoint (`purge_step`); in W&B, MLflow and
Trackio a step logged before the kill and trained again after the resume appears twice.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import sys
import tomllib
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from grooves.config.logging import LoggingConfig
from grooves.core.trajectory import TrajectoryGroup

TRACKERS = ("tensorboard", "wandb", "mlflow", "trackio")
IDS_FILE = "trackers.json"
"""The tracker runs' ids (W&B, MLflow), so a resumed run continues them."""
COLUMNS = ("prompt", "completion", "reward", "success", "error")


class Tracker(Protocol):
    name: str

    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def table(self, step: int, key: str, rows: list[list[Any]]) -> None:
        """`rows` of `COLUMNS`, under `key` (e.g. samples/step, samples/validation)."""
        ...

    def close(self) -> None: ...


class Trackers:
    """The run's trackers as one: each call goes to every tracker still running; one that raises
    is named on one line and dropped, and the others go on."""

    def __init__(self, trackers: Sequence[Tracker] = (), say=None):
        self.trackers = list(trackers)
        self._say = say or _say

    def log(self, row: dict[str, Any]) -> None:
        step = int(row.get("step", 0))
        metrics = {
            k: float(v)
            for k, v in row.items()
            if k != "step" and isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        }
        self._each("log", step, metrics)

    def samples(self, step: int, groups: Sequence[TrajectoryGroup], name: str) -> None:
        if self.trackers:
            self._each("table", step, f"samples/{name}", sample_rows(groups))

    def close(self) -> None:
        self._each("close")
        self.trackers = []

    def _each(self, method: str, *args) -> None:
        for tracker in list(self.trackers):
            try:
                getattr(tracker, method)(*args)
            except Exception as exc:  # a tracker is a mirror: its failure must not end the run
                self.trackers.remove(tracker)
                self._say(
                    f"logging.report_to: {tracker.name} failed ({_one_line(exc)}); the run goes on without it"
                )


def sample_rows(groups: Sequence[TrajectoryGroup]) -> list[list[Any]]:
    """One row per rollout: the first user message, the last assistant message, reward, success
    (None when the task did not set it) and the error of a failed rollout ("" otherwise)."""
    rows = []
    for group in groups:
        for t in group.trajectories:
            prompt = next((m.get("content") or "" for m in t.messages if m.get("role") == "user"), "")
            success = t.metrics.get("success")
            rows.append([str(prompt), t.completion, float(t.reward), success, t.error or ""])
    return rows


def start_trackers(
    logging: LoggingConfig, name: str, run_dir: Path, config_toml: str, *, resumed_at: int = 0, say=None
) -> Trackers:
    """Start the trackers `logging.report_to` names, each given the resolved config; `resumed_at`
    is the checkpoint's step on a resumed run (0 for a fresh one)."""
    say = say or _say
    ids_path = run_dir / IDS_FILE
    ids = json.loads(ids_path.read_text()) if resumed_at and ids_path.exists() else {}
    config = tomllib.loads(config_toml)
    started: list[Tracker] = []
    for tracker in logging.report_to:
        try:
            started.append(
                _START[tracker](
                    project=logging.project,
                    name=name,
                    run_dir=run_dir,
                    config=config,
                    config_toml=config_toml,
                    resumed_at=resumed_at,
                    run_id=ids.get(tracker),
                )
            )
        except ImportError as exc:
            say(
                f"logging.report_to: {tracker} is not installed ({_one_line(exc)}); "
                f"pip install 'grooves[{tracker}]'; the run goes on without it"
            )
        except Exception as exc:  # its library refused to start: the run goes on with the others
            say(f"logging.report_to: {tracker} did not start ({_one_line(exc)}); the run goes on without it")
    ids.update({t.name: run_id for t in started if (run_id := getattr(t, "run_id", None))})
    if ids:
        ids_path.write_text(json.dumps(ids, indent=1))
    return Trackers(started, say)


# ---- the four trackers -----------------------------------------------------------------------
class TensorBoardTracker:
    """torch's `SummaryWriter`: scalars, the config and sample tables as text (markdown)."""

    name = "tensorboard"

    def __init__(self, *, run_dir: Path, config_toml: str, resumed_at: int, **_):
        from torch.utils.tensorboard import SummaryWriter

        # on resume: events of steps after the checkpoint are dropped, so none appears twice
        self.writer = SummaryWriter(
            log_dir=str(run_dir / "tensorboard"), purge_step=resumed_at + 1 if resumed_at else None
        )
        self.writer.add_text("config", _indented(config_toml), global_step=resumed_at)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def table(self, step: int, key: str, rows: list[list[Any]]) -> None:
        self.writer.add_text(key, _markdown_table(rows), global_step=step)

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """A W&B run in offline mode under RUN_DIR/wandb (no account, no network); tables as `wandb.Table`."""

    name = "wandb"

    def __init__(self, *, project: str, name: str, run_dir: Path, config: dict, run_id: str | None, **_):
        import wandb

        self.wandb = wandb
        with contextlib.redirect_stderr(io.StringIO()):  # its banner and integration tips
            self.run = wandb.init(
                mode="offline",
                project=project,
                name=name,
                dir=str(run_dir),
                config=config,
                id=run_id,
                resume="allow" if run_id else None,
                settings=wandb.Settings(console="off", silent=True, x_disable_stats=True),
            )
        self.run_id = self.run.id

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def table(self, step: int, key: str, rows: list[list[Any]]) -> None:
        self.run.log({key: self.wandb.Table(columns=list(COLUMNS), data=rows)}, step=step)

    def close(self) -> None:
        with contextlib.redirect_stderr(io.StringIO()):  # its summary and the `wandb sync` hint
            self.run.finish()


class MlflowTracker:
    """An MLflow run through `MlflowClient`: metrics, the config as params (dotted names) and as
    config.toml, tables with `log_table` (samples/<name>_NNNNNN.json)."""

    name = "mlflow"

    def __init__(
        self,
        *,
        project: str,
        name: str,
        run_dir: Path,
        config: dict,
        config_toml: str,
        run_id: str | None,
        **_,
    ):
        from mlflow import MlflowClient
        from mlflow.entities import Param

        uri = os.environ.get("MLFLOW_TRACKING_URI") or (run_dir / "mlruns").resolve().as_uri()
        if uri.startswith("file:"):
            # MLflow 3 keeps the file store behind an opt-in: it is the one that needs no server or database
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri, registry_uri=uri)  # no model registry of its own
        if run_id is None:
            experiment = self.client.get_experiment_by_name(project)
            experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(project)
            run_id = self.client.create_run(experiment_id, run_name=name).info.run_id
            params = [Param(k, str(v)[:6000]) for k, v in _flatten(config).items()]
            for i in range(0, len(params), 100):  # the store takes at most 100 params per batch
                self.client.log_batch(run_id, params=params[i : i + 100])
            self.client.log_text(run_id, config_toml, "config.toml")
        else:
            self.client.update_run(run_id, status="RUNNING")
        self.run_id = run_id

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = _millis()
        batch = [Metric(_mlflow_key(k), v, now, step) for k, v in metrics.items()]
        for i in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[i : i + 1000])

    def table(self, step: int, key: str, rows: list[list[Any]]) -> None:
        data = {c: [r[i] for r in rows] for i, c in enumerate(COLUMNS)}
        with warnings.catch_warnings():  # MLflow 3.17 asks pandas 3 for object columns the old way
            warnings.filterwarnings("ignore", message="For backward compatibility, 'str' dtypes")
            self.client.log_table(self.run_id, data=data, artifact_file=f"{key}_{step:06d}.json")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class TrackioTracker:
    """A local Trackio run (its SQLite database under $TRACKIO_DIR); tables as `trackio.Table`."""

    name = "trackio"

    def __init__(self, *, project: str, name: str, config: dict, resumed_at: int, **_):
        import trackio

        self.trackio = trackio
        with contextlib.redirect_stdout(io.StringIO()):  # its start-up banner
            self.run = trackio.init(
                project=project,
                name=name,
                config=config,
                resume="allow" if resumed_at else "never",
                embed=False,
            )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def table(self, step: int, key: str, rows: list[list[Any]]) -> None:
        self.run.log({key: self.trackio.Table(columns=list(COLUMNS), data=rows)}, step=step)

    def close(self) -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            self.run.finish()


_START = {
    "tensorboard": TensorBoardTracker,
    "wandb": WandbTracker,
    "mlflow": MlflowTracker,
    "trackio": TrackioTracker,
}


# ---- helpers ------------------------------------------------------------------------------------
def _flatten(data: dict, prefix: str = "") -> dict[str, Any]:
    """Nested tables as dotted keys: {"optim": {"lr": 1e-4}} -> {"optim.lr": 1e-4}."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _mlflow_key(key: str) -> str:
    """MLflow's metric names allow letters, digits, `_ - . / :` and spaces; anything else becomes `_`."""
    return re.sub(r"[^\w\-./: ]", "_", key)


def _markdown_table(rows: list[list[Any]]) -> str:
    def cell(value: Any) -> str:
        text = "" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _indented(text: str) -> str:
    """Text TensorBoard shows verbatim: markdown's indented code block."""
    return "\n".join("    " + line for line in text.splitlines())


def _millis() -> int:
    import time

    return int(time.time() * 1000)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
