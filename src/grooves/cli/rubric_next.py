"""After the interview: score a sample batch, read its extremes, train on the rubric, look again.

Each step is a `grooves` command line. The interview prints them all, then runs the sampling ones
(`sample_steps`: make a batch if there is none, score it, open the extremes) when the person says
so. It runs them as subprocesses of this Python (`python -m grooves ...`), so what runs is exactly
what was printed and stays runnable by hand. The batch is, in this order, `--batch`, the run's
latest samples, or a fresh one from the base model on the task's train split (`grooves eval
--split train --out`). The training lines run `TRAIN_STEPS` steps with the rubric as the run's
`[judge]`, then sample the trained policy on the same train scenarios, score and inspect again; a
rubric with gates also sets `judge.gate` (`gate_threshold`), so that a closed gate
zeroes the whole reward, not only the judge's share of it. `grooves.config` is imported inside the
functions, so `grooves --help` does not load it.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from grooves.cli.rubric_source import Source
from grooves.judge.endpoint import ENV_API_KEY, JudgeConfig
from grooves.judge.rubric import Rubric

TRAIN_STEPS = 40
"""Steps of the first run on a new rubric: enough to see what the policy learns from the judge."""
BATCH_SCENARIOS = 8
BATCH_SAMPLES = 4


@dataclass(frozen=True)
class Step:
    what: str
    argv: list[str]
    """Starts with "grooves"."""
    into: Path | None = None
    """Where the command's output goes (`> FILE`), for `grooves config show`."""

    def line(self) -> str:
        return shlex.join(self.argv) + (f" > {shlex.quote(str(self.into))}" if self.into else "")


def gate_threshold(rubric: Rubric) -> float | None:
    """Half the lowest total a response can get with every gate open; None for a rubric without gates.

    A closed gate makes the total 0 and an open one adds at least its weight times its lowest
    passing value (the first choice at or above 0.5), so `judge.gate` at half that lowest total
    sets the reward to 0 exactly when a gate closed.

    >>> from grooves.judge.rubric import Criterion
    >>> gate_threshold(Rubric(name="r", version="1", criteria=[
    ...     Criterion(name="a", text="a?", weight=3.0, choices=["no", "partly", "yes"]),
    ...     Criterion(name="safe", text="s?", choices=["no", "yes"], gate=True)]))
    0.125
    """
    gates = [c for c in rubric.criteria if c.gate]
    if not gates:
        return None
    weight = sum(c.weight for c in rubric.criteria)

    def lowest_open(choices: list[str] | None) -> float:
        if choices is None:
            return 0.5
        n = len(choices) - 1
        return min(k / n for k in range(n + 1) if k / n >= 0.5)

    return sum(c.weight * lowest_open(c.choices) for c in gates) / weight / 2


def _set(key: str, value: object) -> list[str]:
    """`--set key=value`, the value quoted as TOML only where `--set` would read it otherwise."""
    from grooves.config import ConfigError, parse_overrides
    from grooves.config.show import toml_value

    plain = str(value)
    try:
        same = parse_overrides([f"{key}={plain}"])[key] == value
    except ConfigError:
        same = False
    return ["--set", f"{key}={plain if same else toml_value(value)}"]


def _stem(rubric_path: Path) -> str:
    return str(rubric_path.with_suffix(""))


def sample_steps(source: Source, rubric_path: Path, judge: JudgeConfig) -> list[Step]:
    """Make a batch if there is none, score it with the rubric, show its extremes; [] without a batch or task."""
    from grooves.config.show import toml_value

    stem = _stem(rubric_path)
    batch, mode, steps = source.batch, "group" if source.batch_is_groups else "absolute", []
    if batch is None and source.task is not None:
        batch, mode = Path(f"{stem}-batch.jsonl"), "group"
        options = [a for k, v in source.task_options.items() for a in ("--option", f"{k}={toml_value(v)}")]
        steps.append(
            Step(
                "sample a batch: the base model on the task's train split",
                ["grooves", "eval", source.base_model, "--task", source.task, *options, "--split", "train"]
                + ["--scenarios", str(BATCH_SCENARIOS), "--samples", str(BATCH_SAMPLES), "--out", str(batch)],
            )
        )
    if batch is None:
        return []
    scores = f"{stem}-scores.jsonl"
    steps.append(
        Step(
            "score it with the new rubric",
            ["grooves", "judge", "score", str(batch), "--rubric", str(rubric_path), "--out", scores]
            + ["--mode", mode, "--base-url", str(judge.base_url), "--model", str(judge.model)],
        )
    )
    steps.append(
        Step(
            "read the highest and lowest scores, mark where you disagree",
            ["grooves", "judge", "inspect", scores, "--k", "5", "--html", f"{stem}-inspect.html"],
        )
    )
    return steps


def train_steps(source: Source, rubric: Rubric, rubric_path: Path, judge: JudgeConfig) -> list[Step]:
    """Train TRAIN_STEPS steps with the rubric as the run's judge, then sample the trained policy on the
    train scenarios the base model's batch used, score and inspect."""
    stem = _stem(rubric_path)
    run_dir = f"runs/{Path(stem).name}-judged"
    sets = _set("steps", TRAIN_STEPS) + _set("output_dir", run_dir) + _set("judge.rubric", str(rubric_path))
    sets += _set("judge.base_url", str(judge.base_url)) + _set("judge.model", str(judge.model))
    gate = gate_threshold(rubric)
    if gate is not None:
        sets += _set("judge.gate", float(f"{gate:.3g}"))
    steps = []
    if source.run_file is not None:
        steps.append(Step("train on it", ["grooves", "train", str(source.run_file), *sets]))
    else:
        task = source.task or "your_package.your_module:YourTask"
        options = [a for k, v in source.task_options.items() for a in _set(f"task_options.{k}", v)]
        run_file = Path(f"{stem}-run.toml")
        steps.append(
            Step(
                "write a run file for the task with this judge"
                + ("" if source.task else " (name your task first)"),
                ["grooves", "config", "show", *_set("task", task), *options, *sets],
                into=run_file,
            )
        )
        steps.append(Step("train on it", ["grooves", "train", str(run_file)]))
    after_batch, after = f"{stem}-after-batch.jsonl", f"{stem}-after-scores.jsonl"
    steps.append(
        Step(
            "sample the trained policy on the batch's scenarios",
            ["grooves", "eval", run_dir, "--split", "train", "--scenarios", str(BATCH_SCENARIOS)]
            + ["--samples", str(BATCH_SAMPLES), "--out", after_batch],
        )
    )
    steps.append(
        Step(
            "score them",
            ["grooves", "judge", "score", after_batch, "--rubric", str(rubric_path), "--out", after]
            + ["--mode", "group", "--base-url", str(judge.base_url), "--model", str(judge.model)],
        )
    )
    steps.append(
        Step(
            "and look again",
            ["grooves", "judge", "inspect", after, "--k", "5", "--html", f"{stem}-after.html"],
        )
    )
    return steps


def run_steps(steps: list[Step], judge: JudgeConfig, *, prompt: bool, echo) -> bool:
    """Run the steps as `python -m grooves ...`; stop when one fails before its output exists. True if all ran."""
    env = dict(os.environ)
    if judge.api_key and judge.api_key != "none":
        env[ENV_API_KEY] = judge.api_key  # never on a printed line
    for step in steps:
        argv = [*step.argv[1:]] + (["--no-prompt"] if step.argv[2] == "inspect" and not prompt else [])
        echo(f"$ {step.line()}")
        code = subprocess.run([sys.executable, "-m", "grooves", *argv], env=env, check=False).returncode
        if code != 0:
            wrote = "--out" in argv and Path(argv[argv.index("--out") + 1]).is_file()
            if not (step.argv[2] == "score" and wrote):  # a partly scored batch can still be inspected
                echo(f"stopped: `{step.line()}` exited {code}")
                return False
    return True
