"""What a run trains on: a task's options, and the members of a multi-task run (`tasks = [...]`)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AllowInfNan, Field

from grooves.config.base import Section

TaskOptions = dict[str, str | int | Annotated[float, AllowInfNan(True)] | bool]
"""A task's constructor options. inf/nan pass the union here (one error per member type
otherwise) and are refused, on one line, by `check_numbers`."""


class TaskEntry(Section):
    """One member of a multi-task run (see `grooves.tasks.mixture`)."""

    task: str
    """A built-in task name, `env:<environment>`, or `package.module:object` (imported and run: a run
    file is code, so run only run files you trust)."""
    weight: float = Field(1.0, gt=0)
    """Relative share of the training groups; each group's task is drawn with probability weight / sum."""
    options: TaskOptions = {}
    """Passed to this task's constructor."""
    name: str | None = None
    """Name in metrics (`task/<name>/...`); default: the `task` value."""
