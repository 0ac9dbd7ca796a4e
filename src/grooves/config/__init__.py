"""Run files: one TOML file describes a run, read into typed, validated sections.

`load_config` reads `grooves train`'s run file (`RunConfig`), `load_sft_config` `grooves sft`'s
(`SftConfig`); both go through `base` (one `Section` base, one parser, one error format). Each
section has a module of its own; a new section (or a new kind of run) is a new module here.
This package is the lowest layer of grooves: every other layer reads its section from it.
"""

from grooves.config.algorithm import AlgorithmConfig
from grooves.config.base import ConfigError, Section, check_numbers, parse_overrides
from grooves.config.check import check_against_model, resolve_init_adapter
from grooves.config.checkpoint import CheckpointConfig
from grooves.config.judge import RunJudgeConfig
from grooves.config.logging import LoggingConfig, RunLoggingConfig
from grooves.config.model import FastMode, LoraConfig, ModelConfig, SamplerPrecision, ToolFormats, VllmConfig
from grooves.config.optim import AdamWConfig, OptimConfig
from grooves.config.rollout import RayConfig, RolloutConfig
from grooves.config.run import RunConfig, dump_config, load_config, parse_config
from grooves.config.sft import SftConfig, SftStageConfig, load_sft_config, parse_sft_config
from grooves.config.tasks import TaskEntry, TaskOptions
from grooves.config.validation import ValidationConfig
from grooves.config.watch import WatchConfig

__all__ = [
    "AdamWConfig",
    "AlgorithmConfig",
    "CheckpointConfig",
    "ConfigError",
    "FastMode",
    "LoggingConfig",
    "LoraConfig",
    "ModelConfig",
    "OptimConfig",
    "RayConfig",
    "RolloutConfig",
    "RunConfig",
    "RunLoggingConfig",
    "RunJudgeConfig",
    "SamplerPrecision",
    "Section",
    "SftConfig",
    "SftStageConfig",
    "TaskEntry",
    "TaskOptions",
    "ToolFormats",
    "ValidationConfig",
    "VllmConfig",
    "WatchConfig",
    "check_against_model",
    "check_numbers",
    "dump_config",
    "load_config",
    "load_sft_config",
    "parse_config",
    "resolve_init_adapter",
    "parse_overrides",
    "parse_sft_config",
]
