"""The reward-hacking watch: detectors that read a run step by step and say when it cheats.

What hacking looks like, and which detector sees it:

- the mean reward leaves its recent band within a few steps -> `reward_jump`;
- outputs for different inputs become one string (every story gets the same title) -> `collapse`;
- the output no longer depends on its input -> `input_independence` (lexical, and optionally by
  rescoring outputs against shuffled inputs);
- completions grow or shrink far from where they started -> `length_drift`;
- the trained reward rises while an independent check falls -> `check_divergence`.

The watch is an observer: `Watch.observe(step, metrics, groups)` returns `Finding`s and never
touches training; `Watch.should_pause` is advice. Detectors are small classes over pure
functions (`stats`, `text`), each configured by a section of `WatchConfig`.

The run directory
-----------------
The trainer writes, and the watch and `grooves report` read::

    RUN_DIR/
      config.toml              the resolved run config (shown verbatim in the report)
      metrics.jsonl            one JSON object per step (keys below)
      samples/step_000010.jsonl  that step's TrajectoryGroups, one per line (grooves.core.trajectory)
      findings.jsonl           the watch's findings, one per line (Finding)
      watch.jsonl              the watch's statistics per step: {"step": ..., "watch/...": ...}
      inspect/step_000010.html the watch's sampled inspection pages
      checkpoints/             not read here

Keys of a `metrics.jsonl` row the watch reads (each optional; a missing one is recomputed from
the step's groups where it can be, else that check is skipped):

    step                     int, required by the report
    reward_mean, reward_std  the trained reward over the step's successful rollouts
    reward/<signal>_mean     each reward signal (judge, reward model, gate), and
    reward/<signal>_std      its spread; watched for jumps one by one
    completion_tokens_mean   mean sampled tokens per completion (length drift)
    val/<metric>, check/<metric>
                             independent checks (held-out accuracy, a second judge); sparse,
                             present on the steps they were measured; keys matching
                             *loss*, *error*, *nll*, *ppl*, *perplexity* are lower-is-better

Everything else (loss, kl, clip_fraction, grad_norm, entropy, timings) is plotted by the
report but not judged. Text detectors read `TrajectoryGroup.scenario` (the input: the
`input_keys` fields, else all its strings, else the user messages) and each trajectory's
`completion`; a group is one input, so duplicates are only counted *across* groups.
"""

from grooves.config.watch import (
    CheckDivergenceConfig,
    CollapseConfig,
    InputIndependenceConfig,
    InspectConfig,
    LengthDriftConfig,
    RewardJumpConfig,
    WatchConfig,
)
from grooves.watch.core import Watch, default_detectors
from grooves.watch.finding import Finding, read_findings, write_findings
from grooves.watch.interfaces import Detector, EmbedFn, Observation, RescoreFn
from grooves.watch.metric_detectors import CheckDivergence, LengthDrift, RewardJump
from grooves.watch.text_detectors import Collapse, InputIndependence
from grooves.watch.view import StepView, scenario_text

__all__ = [
    "CheckDivergence",
    "CheckDivergenceConfig",
    "Collapse",
    "CollapseConfig",
    "Detector",
    "EmbedFn",
    "Finding",
    "InputIndependence",
    "InputIndependenceConfig",
    "InspectConfig",
    "LengthDrift",
    "LengthDriftConfig",
    "Observation",
    "RescoreFn",
    "RewardJump",
    "RewardJumpConfig",
    "StepView",
    "Watch",
    "WatchConfig",
    "default_detectors",
    "read_findings",
    "scenario_text",
    "write_findings",
]
