"""Run-file fields that were replaced or moved, and where each went.

A run file that still sets one is refused with one line naming the field and its new place
(`base.format_errors`), instead of pydantic's "unknown field". `RETIRED_FIELDS` applies to both
kinds of run file; `SFT_RETIRED_FIELDS` adds the fields only `grooves sft` had.
"""

from __future__ import annotations


def _moved(new: str) -> str:
    """'moved to checkpoint.every: set it as `every` in the [checkpoint] table'"""
    table, _, field = new.rpartition(".")
    return f"moved to {new}: set it as `{field}` in the [{table}] table"


RETIRED_FIELDS = {
    # replaced by `model.fast`
    "model.merge_lora_for_sampling": 'replaced by model.fast ("on" folds the adapter for sampling, "off" samples through peft\'s layers); see docs/speed.md',
    "model.fused_decode": 'replaced by model.fast ("on" decodes with the fused forward, "off" with transformers\' forward); see docs/speed.md',
    "model.matmul_forms": 'replaced by model.fast ("timed" times the output head as timed_head did; "on" is fixed); see docs/speed.md',
    "model.reuse_freed_memory": 'replaced by model.fast ("on" keeps freed blocks for reuse, "off" keeps glibc\'s defaults); see docs/speed.md',
    # checkpoint policy: its own section
    "logging.checkpoint_every": _moved("checkpoint.every"),
    "logging.keep_checkpoints": _moved("checkpoint.keep"),
    "logging.keep_best_by": _moved("checkpoint.keep_best_by"),
    "logging.keep_best_mode": _moved("checkpoint.keep_best_mode"),
    # the Ray runner's deployment: its own section
    "rollout.ray_address": _moved("ray.address"),
    "rollout.ray_workers": _moved("ray.workers"),
    "rollout.server_host": _moved("ray.server_host"),
}
"""Fields of either run file that were replaced or moved: {dotted field: where it went}."""

SFT_RETIRED_FIELDS = {
    **RETIRED_FIELDS,
    "validation.task": "moved to the top level: task = ... (the task whose validation split scores the adapter)",
    "validation.task_options": "moved to the top level: task_options = {...}",
}
"""`grooves sft`'s run file: the fields above, and its validation task, now named at the top level
as in `grooves train`."""
