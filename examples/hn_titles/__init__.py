"""The Hacker News titles task: reward hacking reproduced, seen by the watch, and gated away.

    corpus.py    stories {id, body, title, score}: a seeded generator with a known cheat, and a JSONL loader
    support.py   the code check "every claim of the title is in the story"
    reward.py    the title reward model (hashed title n-grams + support features, ridge head)
    task.py      the task: few-shot prompt, rollout, reward model score, optional gate

The demonstration's scripts beside them (`prepare.py`, `run_demo.py`, `figures.py`) run it end to end
(docs/hn_demo.md); they put `examples/` on the import path, so a run file names the task
`task = "hn_titles:HNTitlesTask"`. This is example code: the task is not part of the library.
"""

from hn_titles.corpus import (
    SENSATIONAL,
    Story,
    expected_log_points,
    generate_stories,
    read_stories,
    sensational_phrases,
    split_stories,
    write_stories,
)
from hn_titles.reward import TitleRewardModel, TitleStoryEncoder, train_title_reward_model
from hn_titles.support import check_support, claims, supported_fraction
from hn_titles.task import HNTitlesTask, clean_title, title_support

__all__ = [
    "HNTitlesTask",
    "SENSATIONAL",
    "Story",
    "TitleRewardModel",
    "TitleStoryEncoder",
    "check_support",
    "claims",
    "clean_title",
    "expected_log_points",
    "generate_stories",
    "read_stories",
    "sensational_phrases",
    "split_stories",
    "supported_fraction",
    "title_support",
    "train_title_reward_model",
    "write_stories",
]
