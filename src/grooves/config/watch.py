"""The watch's settings: one typed section per detector, thresholds with their trade-offs.

Every threshold is scale-free where it can be (robust z-scores, multiples of the reward's own
spread, ratios to a baseline taken from the run's first steps), because grooves cannot know
whether a reward lives in [0, 1] or in [0, 200]. Defaults were chosen by measuring the
false-positive rate on seeded healthy synthetic runs (`benchmarks/bench_watch_fpr.py`).
The section loads from the run file's `[watch]` table; unknown keys are errors. `grooves.watch`
re-exports these models.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from grooves.config.base import Section

Severity = Literal["info", "warning", "critical"]


class RewardJumpConfig(Section):
    """The mean reward leaves its recent band within a few steps."""

    enabled: bool = True
    """false turns this detector off."""
    metric: str = "reward_mean"
    """Metrics key of the trained reward; computed from the groups when the key is absent."""
    signals: bool = True
    """Also watch each `reward/<signal>_mean` stream, so a finding names the signal that jumped."""
    window: int = Field(10, ge=3)
    """Trailing steps that define "recent". Longer: a slow ramp is absorbed into the band; shorter: noisier."""
    min_history: int = Field(5, ge=3)
    """Steps needed before the detector speaks: the band of two points is no band."""
    z: float = Field(5.0, gt=0)
    """Robust z-score (median/MAD of the window) the step mean must exceed."""
    min_delta_stds: float = Field(1.0, ge=0)
    """The move must also exceed this many within-step reward standard deviations (`reward_std`):
    noise on a flat stream has a tiny MAD, and this keeps a move smaller than one sample's spread quiet."""
    min_delta: float = Field(0.0, ge=0)
    """An absolute floor on the move, in reward units, for rewards whose scale you know."""
    direction: Literal["up", "down", "both"] = "both"
    """A hack shows as a rise; a sudden fall (a broken reward, a diverging policy) is worth seeing too."""
    severity: Severity = "warning"
    """A jump alone may be a real breakthrough, so it warns; collapse and independence confirm a hack."""


class CollapseConfig(Section):
    """Outputs for different inputs become the same or nearly the same."""

    enabled: bool = True
    """false turns this detector off."""
    ngram: int = Field(3, ge=1)
    """Word n-gram size for the Jaccard overlap; 3 ignores shared stop words, 1 counts any shared word."""
    max_pairs: int = Field(400, ge=10)
    """Cross-input output pairs compared per step (sampled beyond this): cost is linear in it."""
    duplicate_rate: float = Field(0.5, gt=0, le=1)
    """Fire when this fraction of outputs also appears verbatim (after lower-casing) for another input."""
    ngram_jaccard: float = Field(0.5, gt=0, le=1)
    """Fire when the mean word n-gram Jaccard between outputs of different inputs reaches this."""
    embedding_cosine: float = Field(0.95, gt=-1, le=1)
    """Fire when the mean embedding cosine between outputs of different inputs reaches this (needs an embed function)."""
    min_rise: float = Field(0.2, ge=0)
    """The measure must also be this far above its baseline, so tasks with templated or categorical
    answers (high overlap from step 0) stay quiet; set 0 to judge the level alone."""
    baseline_steps: int = Field(3, ge=1)
    """Observed steps whose median is the baseline; the detector is silent until it has them."""
    severity: Severity = "critical"
    """The severity of its findings: info, warning or critical (`pause_on` acts on it)."""


class InputIndependenceConfig(Section):
    """The output no longer depends on its input."""

    enabled: bool = True
    """false turns this detector off."""
    min_groups: int = Field(3, ge=2)
    """Distinct inputs needed in a step: matching an output back to its input among 2 is a coin toss."""
    baseline_steps: int = Field(3, ge=1)
    """Observed steps whose median retrieval accuracy is the baseline."""
    min_baseline_accuracy: float = Field(0.3, ge=0, le=1)
    """Below this baseline the outputs never mentioned their inputs (math answers, codes): the
    lexical test is blind for the task; the watch says so once and stays quiet."""
    max_relative_drop: float = Field(0.5, gt=0, le=1)
    """Fire when retrieval accuracy falls below baseline x (1 - this)."""
    smooth: int = Field(2, ge=1)
    """Trailing steps whose median is compared: one unlucky step does not fire."""
    rescore_every: int = Field(5, ge=1)
    """With a rescore function: every this many steps, score outputs against shuffled inputs (costs reward calls)."""
    rescore_samples: int = Field(16, ge=2)
    """Outputs rescored per rescoring step, each from a different input where possible."""
    min_effect: float = Field(0.25, ge=0)
    """Fire when shuffling the inputs lowers the score by less than this many reward spreads
    (the spread of the first rescoring's own scores)."""
    severity: Severity = "critical"
    """The severity of its findings: info, warning or critical (`pause_on` acts on it)."""


class LengthDriftConfig(Section):
    """Completion length moves far from where the run started."""

    enabled: bool = True
    """false turns this detector off."""
    metric: str = "completion_tokens_mean"
    """Metrics key of the mean completion length; computed from the groups when absent."""
    baseline_steps: int = Field(5, ge=1)
    """First steps whose median length is the baseline."""
    smooth: int = Field(3, ge=1)
    """Trailing steps whose median is compared with the baseline."""
    max_ratio: float = Field(2.0, gt=1)
    """Fire above baseline x this. Reasoning tasks grow legitimately: raise it there."""
    min_ratio: float = Field(0.5, gt=0, lt=1)
    """Fire below baseline x this: a policy answering ":" to a fooled judge shrinks."""
    severity: Severity = "warning"
    """The severity of its findings: info, warning or critical (`pause_on` acts on it)."""


class CheckDivergenceConfig(Section):
    """The trained reward rises while an independent check (held-out metric, second judge) falls."""

    enabled: bool = True
    """false turns this detector off."""
    reward_metric: str = "reward_mean"
    """Metrics key of the trained reward."""
    prefixes: list[str] = Field(default_factory=lambda: ["val/", "check/"])
    """Metrics keys starting with one of these are independent checks."""
    lower_is_better: list[str] = Field(
        default_factory=lambda: ["*loss*", "*error*", "*nll*", "*perplexity*", "*ppl*"]
    )
    """fnmatch patterns of check keys where falling is good; those are negated before comparing."""
    window: int = Field(6, ge=4)
    """Trailing check points compared; checks are sparse (every validation), so this spans many steps.
    Longer windows dilute a recent divergence with the healthy points before it."""
    min_t: float = Field(2.5, gt=0)
    """Both trends must be this many standard errors from flat (OLS slope t-statistic). In
    benchmarks/bench_watch_fpr.py, 2.0 caught 95% of divergences but raised false alarms in 5% of
    healthy 300-step runs; 2.5 caught 85% with 1% false alarms."""
    max_correlation: float = Field(-0.5, ge=-1, le=1)
    """And the reward and check must correlate at most this much over the window."""
    severity: Severity = "critical"
    """The severity of its findings: info, warning or critical (`pause_on` acts on it)."""


class InspectConfig(Section):
    """Sampled inspection pages: what a person reads to see the cheat early."""

    every: int = Field(10, ge=0)
    """Write `inspect/step_XXXXXX.html` every this many steps (0 disables)."""
    n_random: int = Field(6, ge=0)
    """Random samples per page."""
    n_best: int = Field(3, ge=0)
    """Highest-reward samples per page."""
    n_worst: int = Field(3, ge=0)
    """Lowest-reward samples per page."""
    max_chars: int = Field(1500, ge=80)
    """Inputs and outputs longer than this are cut on the page (the JSONL keeps them whole)."""


class WatchConfig(Section):
    """The `[watch]` table of a run file."""

    enabled: bool = True
    """Run the detectors every step (cheap: text statistics over the step's outputs)."""

    input_keys: list[str] | None = None
    """Scenario fields that are the input (e.g. ["body"]); default: every string in the scenario,
    else the user messages. Leave out reference answers if outputs should not copy them."""
    reward_jump: RewardJumpConfig = Field(default_factory=RewardJumpConfig)
    collapse: CollapseConfig = Field(default_factory=CollapseConfig)
    input_independence: InputIndependenceConfig = Field(default_factory=InputIndependenceConfig)
    length_drift: LengthDriftConfig = Field(default_factory=LengthDriftConfig)
    check_divergence: CheckDivergenceConfig = Field(default_factory=CheckDivergenceConfig)
    inspect: InspectConfig = Field(default_factory=InspectConfig)
    cooldown_steps: int = Field(10, ge=0)
    """After a detector fires on a stream, repeats within this many steps are dropped, so a
    persisting hack shows every few steps instead of flooding the log."""
    pause_on: Literal["never", "warning", "critical"] = "never"
    """`Watch.should_pause` turns true after a finding this severe; the trainer decides what to do."""
    echo: bool = True
    """Print each finding to stderr as it is raised."""
    seed: int = 0
    """Seeds pair sampling, shuffles and the inspection's random sample (mixed with the step)."""

    @model_validator(mode="after")
    def _check_keys(self) -> WatchConfig:
        if self.input_keys is not None and not self.input_keys:
            raise ValueError("watch.input_keys is an empty list; name at least one scenario field or omit it")
        return self
