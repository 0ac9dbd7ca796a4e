"""Moved to `grooves.train.runlog`; kept for compatibility."""

from grooves.train.runlog import (
    LOCK_FILE,
    RUN_OUTPUTS,
    RunFolderError,
    RunLog,
    check_run_dir,
    clear_run_outputs,
    lock_run_dir,
)

__all__ = [
    "LOCK_FILE",
    "RUN_OUTPUTS",
    "RunFolderError",
    "RunLog",
    "check_run_dir",
    "clear_run_outputs",
    "lock_run_dir",
]
