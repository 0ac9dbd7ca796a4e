"""examples/strict_list: the all-or-nothing format reward and its run file."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from grooves.config import load_config

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))

from strict_list.task import CATEGORIES, StrictListTask, score_answer  # noqa: E402


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("apple, pear, plum", (1.0, "ok")),
        ("  apple, pear, plum\n", (1.0, "ok")),  # surrounding whitespace is not the format
        ("apple, pear, plum.", (0.0, "format")),
        ("Apple, pear, plum", (0.0, "format")),
        ("apple,pear,plum", (0.0, "format")),
        ("apple, pear", (0.0, "format")),
        ("apple, pear, plum, fig", (0.0, "format")),
        ("Here are three fruits: apple, pear, plum", (0.0, "format")),
        ("1. apple, pear, plum", (0.0, "format")),
        ("apple, pear, pear", (0.0, "repeated")),
        ("apple, pear, carrot", (0.0, "not in category")),
    ],
)
def test_score_is_all_or_nothing(answer, expected):
    assert score_answer(answer, "fruits") == expected


def test_two_word_members_count():
    assert score_answer("mercury, venus, earth", "planets") == (1.0, "ok")
    assert score_answer("days of the week, monday, friday", "days of the week")[1] == "format"


def test_splits_are_disjoint_and_cover_every_category():
    task = StrictListTask()
    train = {s["category"] for s in task.scenarios("train")}
    val = {s["category"] for s in task.scenarios("validation")}
    assert not train & val
    assert train | val == set(CATEGORIES)
    assert len(val) == 8 and len(train) == 16
    with pytest.raises(ValueError, match="unknown"):
        task.scenarios("test")


def test_run_file_loads_on_defaults():
    config = load_config(ROOT / "examples" / "strict_list" / "run.toml")
    assert config.task == "strict_list.task:make_task"
    assert config.optim.lr == 2e-4  # the default this task checks
