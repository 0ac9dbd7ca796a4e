"""The run log after a kill: a line cut short is dropped, and a resume drops the steps after its checkpoint."""

from __future__ import annotations

import json

import pytest

from grooves.runlog import RunLog


def test_a_line_cut_short_by_a_kill_is_dropped_and_resume_truncates_after_the_checkpoint(tmp_path):
    log = RunLog(tmp_path)
    for step in range(4):
        log.log({"step": step, "reward_mean": step / 10, "val/x": float("nan")})
    with log.metrics_path.open("a") as f:
        f.write('{"step": 4, "reward_me')  # the process died mid-write
    rows = log.rows()
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert rows[2]["val/x"] is None  # non-finite numbers are written as null, valid JSON
    log.truncate_after(2)
    assert [json.loads(line)["step"] for line in log.metrics_path.read_text().splitlines()] == [0, 1, 2]
    log.log({"step": 3, "reward_mean": 0.5})
    assert [r["step"] for r in log.rows()] == [0, 1, 2, 3]


def test_a_corrupt_line_before_the_end_is_an_error_naming_the_file_and_line(tmp_path):
    log = RunLog(tmp_path)
    log.metrics_path.write_text('{"step": 0}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2 is not JSON"):
        log.rows()
