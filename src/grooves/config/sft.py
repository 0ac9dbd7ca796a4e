"""The run file of `grooves sft`: the same sections and parsing as an RL run file, with SFT's own.

`[model]`, `[lora]`, `[optim]` (AdamW's settings), `[validation]`, `[logging]` and `[checkpoint]`
are the sections `grooves train` reads, and mean the same there; the top level names the data
and, as in `grooves train`, the `task` whose validation split scores the adapter. Where SFT's
defaults differ (validation only at both ends, a checkpoint every 10 steps: `SFT_DEFAULTS`), a
field the file leaves out takes SFT's. A bad field is one line naming it, exactly as in
`grooves train`, and a moved one says where it went (`retired`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from grooves.config.base import Section, read_run_file, validate
from grooves.config.checkpoint import CheckpointConfig
from grooves.config.logging import LoggingConfig
from grooves.config.model import LoraConfig, ModelConfig
from grooves.config.optim import AdamWConfig
from grooves.config.retired import SFT_RETIRED_FIELDS
from grooves.config.tasks import TaskOptions
from grooves.config.validation import ValidationConfig

SFT_DEFAULTS: dict[str, dict[str, Any]] = {
    "validation": {"every": 0, "max_tokens": 64},
    "checkpoint": {"every": 10},
}
"""`grooves sft`'s defaults where they differ from `grooves train`'s, {section: {field: value}}:
an SFT run is short and cheap to repeat, so it validates only before the first and after the last
step, checkpoints every 10 steps, and (having no `[rollout]`) gives validation turns 64 tokens."""


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
    task: str | None = None
    """A task (as in `grooves train`) whose validation split scores the adapter; unset: no validation."""
    task_options: TaskOptions = {}
    """Passed to the validation task's constructor."""
    model: ModelConfig = ModelConfig()
    lora: LoraConfig = LoraConfig()
    optim: AdamWConfig = AdamWConfig()
    validation: ValidationConfig = ValidationConfig(**SFT_DEFAULTS["validation"])
    logging: LoggingConfig = LoggingConfig()
    checkpoint: CheckpointConfig = CheckpointConfig(**SFT_DEFAULTS["checkpoint"])

    @model_validator(mode="before")
    @classmethod
    def _sft_defaults(cls, data: Any) -> Any:
        """A section the file gives as a table takes SFT's defaults for the fields it leaves out."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for section, defaults in SFT_DEFAULTS.items():
            if isinstance(data.get(section), dict):
                data[section] = {**defaults, **data[section]}
        return data

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
    return validate(SftConfig, data, retired=SFT_RETIRED_FIELDS)


def load_sft_config(path: str | Path | None, overrides: dict | None = None) -> SftConfig:
    """Read an SFT run file (or start from defaults when `path` is None); `overrides` win."""
    return parse_sft_config(read_run_file(path, overrides))
