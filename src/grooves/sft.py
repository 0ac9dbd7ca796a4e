"""Moved to `grooves.train.sft` (training) and `grooves.config.sft` (its run file); kept for compatibility."""

from grooves.config.sft import (
    SftConfig,
    SftLoggingConfig,
    SftOptimConfig,
    SftValidationConfig,
    load_sft_config,
    parse_sft_config,
)
from grooves.train.sft import ChatError, chat_to_sequence, load_sequences, read_chats, run_sft, sft, sft_step

__all__ = [
    "ChatError",
    "SftConfig",
    "SftLoggingConfig",
    "SftOptimConfig",
    "SftValidationConfig",
    "chat_to_sequence",
    "load_sequences",
    "load_sft_config",
    "parse_sft_config",
    "read_chats",
    "run_sft",
    "sft",
    "sft_step",
]
