"""The run file of `grooves train`: one TOML file describes a training run.

Every field has a docstring saying what it trades off; each section lives in a module of this
package (`model`, `rollout`, `algorithm`, `optim`, `validation`, `logging`, `checkpoint`, `tasks`,
`watch`, `judge`, `sft`) and `RunConfig` puts them together; `retired` says where a moved field went. Unknown fields, wrong types and impossible values fail at load
time with one line naming the field, the value and what is allowed (`base.validate`); the
trainer only ever reads the resolved config, which is written to the run directory and saved with
every checkpoint. At the start of a run, `check.check_against_model` checks the fields that
depend on the model, from its config.json before its weights load.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator, model_validator

from grooves.config.algorithm import AlgorithmConfig
from grooves.config.base import Section, dump, read_run_file, validate
from grooves.config.checkpoint import CheckpointConfig
from grooves.config.judge import RunJudgeConfig
from grooves.config.logging import RunLoggingConfig
from grooves.config.model import LoraConfig, ModelConfig, VllmConfig
from grooves.config.optim import OptimConfig
from grooves.config.retired import RETIRED_FIELDS
from grooves.config.rollout import RayConfig, RolloutConfig
from grooves.config.sft import SftStageConfig
from grooves.config.tasks import TaskEntry, TaskOptions
from grooves.config.validation import ValidationConfig
from grooves.config.watch import WatchConfig


class RunConfig(Section):
    name: str = "run"
    """The run's name: the served model name and the adapter's name in the registry."""
    output_dir: str = "runs/run"
    """Run folder: config, metrics.jsonl, reward curve, samples, checkpoints, report."""
    seed: int = Field(0, ge=0, le=2**32 - 1)
    """Seeds Python, numpy and torch; numpy's seeds are 0 .. 2**32 - 1."""
    steps: int = Field(20, ge=1)
    """Optimizer steps; each samples `groups_per_step` groups of `group_size` rollouts."""
    task: str = "capitals"
    """A built-in task name, or `package.module:object` for your own Task. That module is imported and
    the object called with `task_options`: a run file is code, so run only run files you trust."""
    task_options: TaskOptions = {}
    """Passed to the task's constructor (e.g. a data file)."""
    tasks: list[TaskEntry] | None = None
    """Several tasks interleaved by weight instead of `task`, e.g.
    [{task = "capitals", weight = 0.7}, {task = "env:support_desk", weight = 0.3}]: guards
    against forgetting, at the cost of fewer groups per task per step. Logs task/<name>/... metrics."""
    model: ModelConfig = ModelConfig()
    lora: LoraConfig = LoraConfig()
    rollout: RolloutConfig = RolloutConfig()
    vllm: VllmConfig = VllmConfig()
    ray: RayConfig = RayConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    optim: OptimConfig = OptimConfig()
    validation: ValidationConfig = ValidationConfig()
    logging: RunLoggingConfig = RunLoggingConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    watch: WatchConfig = WatchConfig()
    """Reward-hacking detectors and inspection pages (see grooves.watch)."""
    sft: SftStageConfig | None = None
    """A supervised stage on demonstrations run before RL (see `SftStageConfig`); unset: none."""
    judge: RunJudgeConfig | None = None
    """An LLM judge scoring each group next to the task's reward (see `RunJudgeConfig`); unset: none."""

    @field_validator("output_dir")
    @classmethod
    def _output_dir(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("is empty; name the run folder, e.g. runs/my_run")
        return value

    @model_validator(mode="after")
    def _consistent(self):
        if self.algorithm.loss != "gspo" and self.algorithm.eps_high < self.algorithm.eps_low / 2:
            raise ValueError("algorithm.eps_high is far below eps_low; clip-higher wants eps_high >= eps_low")
        if self.optim.warmup_steps >= self.steps:
            raise ValueError(
                f"optim.warmup_steps ({self.optim.warmup_steps}) must be below steps ({self.steps}): "
                "the run would end before the learning rate reaches optim.lr"
            )
        if self.tasks is not None:
            if not self.tasks:
                raise ValueError("tasks is empty; list at least one {task = ..., weight = ...} or use `task`")
            if self.task != RunConfig.model_fields["task"].default or self.task_options:
                raise ValueError(
                    "set either `task` (with task_options) or `tasks` (with per-task options), not both"
                )
            names = [t.name or t.task for t in self.tasks]
            if len(set(names)) != len(names):
                raise ValueError(f"tasks: names must be unique, got {names}; give a repeated task a `name`")
        return self


def parse_config(data: dict) -> RunConfig:
    """A parsed run file as a `RunConfig`; `ConfigError` names each bad field."""
    return validate(RunConfig, data, retired=RETIRED_FIELDS)


def load_config(path: str | Path, overrides: dict | None = None) -> RunConfig:
    """Read a run file; `overrides` (nested dict) win over the file."""
    return parse_config(read_run_file(path, overrides))


def dump_config(config: RunConfig) -> str:
    """The resolved config as TOML (all fields, defaults included)."""
    return dump(config)
