"""The `[judge]` section: an LLM judge scores each group of rollouts next to the task's reward."""

from __future__ import annotations

from pydantic import Field

from grooves.config.base import Section


class RunJudgeConfig(Section):
    """A group judge (RULER-style: all rollouts of a scenario in one request, scored against each
    other under a rubric) whose score is mixed with the task's own reward:

        reward = (1 - weight) x task reward + weight x judge score    (0 if judge score < gate)

    The task's reward is the environment's grader (or the task's rollout reward), or the code
    reward named by `reward`. Validation is scored the same way. A judge that fails for a group
    drops that group (logged as judge_failures); judge_* metrics are written every step."""

    base_url: str | None = None
    """The judge's OpenAI-compatible endpoint, e.g. http://127.0.0.1:8001/v1 (unset: env GROOVES_JUDGE_BASE_URL).
    Its API key comes from env GROOVES_JUDGE_API_KEY, never from the run file."""
    model: str | None = None
    """The judge model's name at that endpoint (unset: env GROOVES_JUDGE_MODEL)."""
    rubric: str | None = None
    """A rubric TOML file (see docs/judges.md); unset: grooves' default helpfulness rubric."""
    weight: float = Field(0.5, ge=0, le=1)
    """The judge's share of the reward; the task's reward gets 1 - weight. 0 with `gate`: a pure gate."""
    reward: str | None = None
    """`package.module:function`, a code reward `fn(trajectory, scenario) -> float` used instead of the task's reward."""
    gate: float | None = Field(None, ge=0, le=1)
    """If set, a judge score below this sets the reward to 0, whatever the task's reward."""
    judge_twice: bool = False
    """Judge each group again in reversed order and average: twice the requests, less position bias."""
    concurrency: int = Field(8, ge=1)
    """Judge requests in flight at once; match the judge server's slots."""
    timeout_s: float = Field(60.0, gt=0)
    """Per-request timeout; a group prompt of 8 multi-turn transcripts is long."""
    max_retries: int = Field(3, ge=0)
    """Retries on transient errors (5xx, 429, timeout) before the group is dropped."""
    max_tokens: int = Field(1024, ge=16)
    """The judge's reply budget: room for a reason per rollout plus the JSON."""
    cache: bool = True
    """Keep verdicts in the judge cache ($GROOVES_HOME/judge-cache.sqlite): a resumed run is not judged twice."""
