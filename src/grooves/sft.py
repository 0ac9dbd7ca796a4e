"""Moved to `grooves.train.sft`; kept for compatibility."""

from grooves.train.sft import (
    ChatError,
    SftConfig,
    SftLoggingConfig,
    SftOptimConfig,
    SftValidationConfig,
    chat_to_sequence,
    load_sequences,
    load_sft_config,
    parse_sft_config,
    read_chats,
    run_sft,
    sft,
    sft_step,
)

__all__ = ["ChatError", "SftConfig", "SftLoggingConfig", "SftOptimConfig", "SftValidationConfig", "chat_to_sequence", "load_sequences", "load_sft_config", "parse_sft_config", "read_chats", "run_sft", "sft", "sft_step"]
