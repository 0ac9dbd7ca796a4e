"""What `grooves rubric interview` is about: a task in words, a task by name, a run file or a run folder.

The interview's TASK argument is read as, in this order: a run file (`*.toml`), a task name
(built-in, `env:<environment>`, or `package.module:object`), or else a description in words.
`--run RUN` adds a run folder: its `config.toml` names the task and the judge (its `[judge]`
table), and its latest samples are the batch the new rubric scores first. `--batch FILE` names
that batch directly. From these come the interview's context (the task, three scenarios of its
train split, three outputs from the batch) and the next steps' commands (`rubric_next`).

Every problem is a `SourceError` with one line naming the argument and the fix.
"""

from __future__ import annotations

import inspect
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grooves.judge.batch import read_items
from grooves.judge.interview import TaskContext
from grooves.models import DEFAULT_MODEL

SHOWN = 3
"""Scenarios and sample outputs shown to the interviewer, each."""
SHOWN_CHARS = 400
"""Each shown scenario or output is cut to this many characters."""


class SourceError(ValueError):
    """A TASK, --run or --batch that cannot be used; the message names it and says what to do."""


@dataclass
class Source:
    """The task as the interview and its next steps see it."""

    description: str
    task: str | None = None
    """The task's spec (a built-in name, env:..., module:object); None for a description in words."""
    task_options: dict[str, Any] = field(default_factory=dict)
    run_file: Path | None = None
    run_dir: Path | None = None
    batch: Path | None = None
    """Outputs the rubric scores first: --batch, else the run's latest samples; None: none yet."""
    batch_is_groups: bool = False
    """The batch holds a run's trajectory groups (scored in group mode, as training judges them)."""
    base_model: str = DEFAULT_MODEL
    judge: dict[str, Any] = field(default_factory=dict)
    """base_url and model from the run file's [judge] table, where it sets them."""
    scenarios: list[str] = field(default_factory=list)

    def context(self) -> TaskContext:
        samples: list[str] = []
        if self.batch is not None:
            for item in read_items(self.batch)[:SHOWN]:
                samples.append(_cut(f"input: {item.input}\noutput: {item.output}"))
        return TaskContext(self.description, self.scenarios, samples)


def _cut(text: str) -> str:
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + " ..."


def _looks_like_task(arg: str) -> bool:
    """A task spec has no spaces and is a built-in, env:NAME, or module:object."""
    from grooves.tasks import BUILTIN_TASKS

    return not re.search(r"\s", arg) and (":" in arg or arg in BUILTIN_TASKS)


def _latest_samples(run_dir: Path) -> Path | None:
    """The run's latest training samples (samples/step_NNNNNN.jsonl), else its latest validation ones."""
    for prefix in ("step", "validation"):
        files = sorted((run_dir / "samples").glob(f"{prefix}_*.jsonl"))
        if files:
            return files[-1]
    return None


def _describe(spec: str, task: object) -> str:
    """The task's name and the first paragraph of what it says about itself."""
    env = getattr(task, "env", None)
    doc = getattr(getattr(env, "spec", None), "description", None)
    doc = doc or inspect.getdoc(inspect.getmodule(type(task))) or inspect.getdoc(type(task)) or ""
    first = " ".join(doc.strip().split("\n\n")[0].split())
    return f"{spec}: {first}" if first else spec


def _read_run_file(source: Source, path: Path) -> None:
    from grooves.config import ConfigError, load_config
    from grooves.tasks import add_task_folder

    try:
        config = load_config(path)
    except ConfigError as exc:
        raise SourceError(f"{path}: {str(exc).splitlines()[0]}") from None
    add_task_folder(path.parent)
    source.run_file = path
    source.base_model = config.model.base_model
    if config.tasks is None:
        source.task, source.task_options = config.task, dict(config.task_options)
    if config.judge is not None:
        source.judge = {k: v for k in ("base_url", "model") if (v := getattr(config.judge, k))}


def _read_task(source: Source, words: str) -> None:
    """Load the task for its scenarios and its own description (after the person's words, if any)."""
    from grooves.tasks import TaskLoadError, load_task

    assert source.task is not None
    try:
        task = load_task(source.task, source.task_options)
        scenarios = task.scenarios("train")
    except TaskLoadError as exc:
        raise SourceError(
            f"TASK: {exc}; to describe the task in words instead, quote a sentence, e.g. "
            '"Summarize a support ticket in one line"'
        ) from None
    described = _describe(source.task, task)
    source.description = f"{words}\n(The task in code is {described})" if words else described
    source.scenarios = [_cut(json.dumps(s, ensure_ascii=False)) for s in scenarios[:SHOWN]]


def resolve(task: str | None, run: Path | None, batch: Path | None) -> Source:
    """The interview's source from its arguments; `SourceError` says which one cannot be used and why."""
    source = Source(description="")
    words = ""
    if run is not None:
        if not run.is_dir():
            raise SourceError(f"--run {run}: no such run folder")
        source.run_dir = run
        if (run / "config.toml").is_file():
            _read_run_file(source, run / "config.toml")
        source.batch = _latest_samples(run)
        source.batch_is_groups = source.batch is not None
    if task is not None:
        if task.endswith(".toml"):
            if not Path(task).is_file():
                raise SourceError(f"TASK {task}: no such run file")
            _read_run_file(source, Path(task))
        elif _looks_like_task(task):
            source.task, source.task_options = task, {}
        else:
            words = source.description = task
    if source.task is not None:
        _read_task(source, words)
    if not source.description:
        raise SourceError(
            "TASK: say what the task is: a task name (capitals, env:support_desk, module:Task), a run "
            "file, or a sentence in quotes; or give --run with a run folder whose config.toml names it"
        )
    if batch is not None:
        if not batch.is_file():
            raise SourceError(f"--batch {batch}: no such file")
        source.batch, source.batch_is_groups = batch, False
    if source.batch is not None:
        try:
            source.context()
        except ValueError as exc:
            raise SourceError(f"{'--batch' if batch else '--run'}: {exc}") from None
    return source
