"""The run file of `grooves sft`: the same sections and parsing as an RL run file, with SFT's own.

`[model]` and `[lora]` are the RL run file's sections (the policy is built the same way), `[optim]`
extends the same AdamW settings with SFT's default learning rate, and the top level names the
data; `[validation]` and `[logging]` say what SFT validates and writes. A bad field is one line
naming it, exactly as in `grooves train`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from grooves.config.base import Section, read_run_file, validate
from grooves.config.model import RETIRED_FIELDS, LoraConfig, ModelConfig
from grooves.config.optim import AdamWConfig
from grooves.config.tasks import TaskOptions


class SftOptimConfig(AdamWConfig):
    lr: float = Field(2e-4, gt=0)
    """AdamW learning rate. On capitals, 16 steps at 2e-4 reached 0.778 held-out success and 1e-4
    0.704 (benchmarks/results/README.md); the corpus_search demonstrations
    were trained at 5e-4 (examples/agents/corpus_search_sft.toml)."""


class SftValidationConfig(Section):
    task: str | None = None
    """A task (as in `grooves train`) whose validation split scores the adapter; unset: no validation."""
    task_options: TaskOptions = {}
    """Passed to the validation task's constructor."""
    every: int = Field(0, ge=0)
    """Validate every K steps (0 = only before the first and after the last step)."""
    scenarios: int = Field(32, ge=1)
    """Validation scenarios scored (the first of the task's validation split)."""
    temperature: float = Field(0.7, ge=0, le=2)
    """Sampling temperature of validation rollouts."""
    max_tokens: int = Field(64, ge=1)
    """Per-turn completion budget of validation rollouts."""


class SftLoggingConfig(Section):
    checkpoint_every: int = Field(10, ge=1)
    """Steps between checkpoints (and always after the last)."""
    keep_checkpoints: int = Field(3, ge=1)
    """Checkpoints kept on disk; older ones are deleted as new ones are written, except the best (below)."""
    keep_best_by: str = "val/success_rate"
    """As in `grooves train`: the best checkpoint by this validation metric is kept too ("" = none)."""
    keep_best_mode: Literal["max", "min"] = "max"
    """Whether a higher (`max`) or lower (`min`) `keep_best_by` is better."""
    progress: bool = True
    """Progress bars on the terminal; without them (false, for logs and CI) one line per step, and a
    heartbeat line every minute during a validation."""


class SftConfig(Section):
    name: str = "sft"
    """The run's name: the adapter's name in the registry."""
    output_dir: str = "runs/sft"
    """Run folder: config, metrics.jsonl, checkpoints."""
    seed: int = 0
    """Seeds the data order, the LoRA initialization and validation sampling."""
    data: str
    """JSONL file of chats: {"messages": [...], "tools": [...]} per line."""
    batch_size: int = Field(8, ge=1)
    """Chats per optimizer step."""
    epochs: float = Field(1.0, gt=0)
    """Passes over the data; ignored when `steps` is set."""
    steps: int | None = Field(None, ge=1)
    """Optimizer steps; default ceil(epochs x chats / batch_size)."""
    model: ModelConfig = ModelConfig()
    lora: LoraConfig = LoraConfig()
    optim: SftOptimConfig = SftOptimConfig()
    validation: SftValidationConfig = SftValidationConfig()
    logging: SftLoggingConfig = SftLoggingConfig()

    @model_validator(mode="after")
    def _consistent(self):
        if self.steps is not None and self.optim.warmup_steps >= self.steps:
            raise ValueError(
                f"optim.warmup_steps ({self.optim.warmup_steps}) must be below steps ({self.steps}): "
                "the run would end before the learning rate reaches optim.lr"
            )
        return self


class SftStageConfig(Section):
    """`[sft]` in an RL run file: supervised training on demonstrations before RL, in one run.

    `grooves train` first trains an adapter on `data` (as `grooves sft` would, with the run's
    `[model]` and `[lora]`) into `<output_dir>/sft`, then starts RL from it (`model.init_adapter`).
    A resumed run whose RL has begun skips the stage; one stopped during SFT continues it."""

    data: str
    """JSONL of chats (`grooves env demos NAME --out FILE`); none may be a validation scenario of the task."""
    batch_size: int = Field(8, ge=1)
    """Chats per optimizer step."""
    epochs: float = Field(1.0, gt=0)
    """Passes over the data; ignored when `steps` is set."""
    steps: int | None = Field(None, ge=1)
    """Optimizer steps; default ceil(epochs x chats / batch_size)."""
    lr: float = Field(2e-4, gt=0)
    """AdamW learning rate of the SFT stage (RL's is `optim.lr`); the default is `grooves sft`'s."""
    checkpoint_every: int = Field(10, ge=1)
    """SFT steps between checkpoints (a stopped stage continues from the last one with --resume)."""


def parse_sft_config(data: dict) -> SftConfig:
    """A parsed SFT run file as an `SftConfig`; `ConfigError` names each bad field."""
    return validate(SftConfig, data, retired=RETIRED_FIELDS)


def load_sft_config(path: str | Path | None, overrides: dict | None = None) -> SftConfig:
    """Read an SFT run file (or start from defaults when `path` is None); `overrides` win."""
    return parse_sft_config(read_run_file(path, overrides))
