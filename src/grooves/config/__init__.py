"""The run file: one TOML file describes a run, read into typed, validated sections."""

from grooves.config.run import (
    AlgorithmConfig,
    ConfigError,
    FastMode,
    LoggingConfig,
    LoraConfig,
    ModelConfig,
    OptimConfig,
    RolloutConfig,
    RunConfig,
    TaskEntry,
    TaskOptions,
    ToolFormats,
    ValidationConfig,
    VllmConfig,
    check_against_model,
    check_numbers,
    dump_config,
    load_config,
    parse_config,
    parse_overrides,
)
from grooves.config.watch import WatchConfig

__all__ = [
    "AlgorithmConfig", "ConfigError", "LoggingConfig", "LoraConfig", "FastMode", "ModelConfig", "OptimConfig",
    "RolloutConfig", "RunConfig", "TaskEntry", "TaskOptions", "ToolFormats", "ValidationConfig", "VllmConfig",
    "WatchConfig", "check_against_model", "check_numbers", "dump_config", "load_config", "parse_config",
    "parse_overrides",
]
