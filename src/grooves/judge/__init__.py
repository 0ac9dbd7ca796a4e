"""LLM judges: rubric files, an OpenAI-compatible judge client, group and absolute judging, calibration.

    client = JudgeClient(JudgeConfig(base_url="http://127.0.0.1:8000/v1", model="judge"))
    judge = GroupJudge(client, load_rubric("rubric.toml"), judge_twice=True)
    judgment = await judge.judge_group(group)       # scores in group.ok order, reasons, position bias

The calibration loop (`grooves judge score | inspect | compare`) lives in `calibration.py` and
`cli.py`; see docs/judges.md.
"""

from grooves.judge.absolute import AbsoluteJudge
from grooves.judge.endpoint import JudgeClient, JudgeConfig, TokenUsage
from grooves.judge.errors import InvalidJudgment, JudgeError
from grooves.judge.group import GroupJudge
from grooves.judge.rubric import DEFAULT_RUBRIC, Criterion, Rubric, RubricError, load_rubric
from grooves.judge.score import GroupJudgment, Judge, Score

__all__ = [
    "AbsoluteJudge",
    "Criterion",
    "DEFAULT_RUBRIC",
    "GroupJudge",
    "GroupJudgment",
    "InvalidJudgment",
    "Judge",
    "JudgeClient",
    "JudgeConfig",
    "JudgeError",
    "Rubric",
    "RubricError",
    "Score",
    "TokenUsage",
    "load_rubric",
]
