"""The run log after a kill: a line cut short is dropped, and a resume drops the steps after its checkpoint."""

from __future__ import annotations

import json

import pytest

from grooves.training.runlog import RunLog


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


def test_the_reward_curve_is_redrawn_only_when_its_share_of_the_time_allows(tmp_path):
    from grooves.training import runlog

    log = RunLog(tmp_path)
    log.log({"step": 1, "reward_mean": 0.5, "reward_std": 0.1})
    curve = tmp_path / "reward_curve.png"
    log.plot_if_due()  # the first redraw is always due
    assert curve.is_file()
    curve.unlink()
    # the next is due once 1 / PLOT_SHARE times the last redraw's duration has passed: not at once
    log.plot_if_due()
    assert not curve.exists()
    assert log._plot_seconds > 0 and runlog.PLOT_SHARE == 0.1
    log._plotted_at -= log._plot_seconds / runlog.PLOT_SHARE  # that much time has passed
    log.plot_if_due()
    assert curve.is_file()
    curve.unlink()
    log.plot()  # the end of a run draws it whatever the time
    assert curve.is_file()


def test_a_corrupt_line_before_the_end_is_an_error_naming_the_file_and_line(tmp_path):
    log = RunLog(tmp_path)
    log.metrics_path.write_text('{"step": 0}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2 is not JSON"):
        log.rows()


def test_a_locked_run_folder_is_refused_and_a_killed_holder_leaves_no_lock(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    from grooves.training.runlog import RunFolderError, lock_run_dir

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from pathlib import Path\nfrom grooves.training.runlog import lock_run_dir\n"
            f"with lock_run_dir(Path({str(tmp_path)!r})):\n    print('locked', flush=True)\n    input()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert holder.stdout.readline() == "locked\n"
        with pytest.raises(RunFolderError) as info:
            with lock_run_dir(tmp_path):
                pass
        assert str(info.value) == (
            f"{tmp_path} is in use by another trainer (process {holder.pid}); wait for it to end or set another output_dir"
        )
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with lock_run_dir(tmp_path):  # the kernel dropped the dead process's lock; the file is still there
        assert (tmp_path / ".lock").read_text() == f"{os.getpid()}\n"
    with lock_run_dir(tmp_path):  # and this process released its own
        pass


def test_a_folder_with_checkpoints_needs_resume_or_overwrite(tmp_path):
    from grooves.training.runlog import RunFolderError, check_run_dir, clear_run_outputs

    check_run_dir(tmp_path, resume=False, overwrite=False)  # empty: a fresh run
    with pytest.raises(RunFolderError, match="--resume: no checkpoint in"):
        check_run_dir(tmp_path, resume=True, overwrite=False)
    (tmp_path / "checkpoints" / "step_000001.tmp").mkdir(parents=True)  # a write that never finished
    check_run_dir(tmp_path, resume=False, overwrite=False)
    (tmp_path / "checkpoints" / "step_000004").mkdir()
    with pytest.raises(RunFolderError) as info:
        check_run_dir(tmp_path, resume=False, overwrite=False)
    assert str(info.value) == (
        f"{tmp_path} already holds a run (checkpoints up to step_000004); continue it with --resume, "
        "replace it with --overwrite, or set another output_dir"
    )
    check_run_dir(tmp_path, resume=True, overwrite=False)
    check_run_dir(tmp_path, resume=False, overwrite=True)
    with pytest.raises(RunFolderError, match="pass one of them"):
        check_run_dir(tmp_path, resume=True, overwrite=True)

    for name in (
        "samples/step_000001.jsonl",
        "inspect/step_000001.html",
        "metrics.jsonl",
        "findings.jsonl",
        "watch.jsonl",
        "notes.txt",
    ):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("x")
    clear_run_outputs(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "notes.txt"
    ]  # what the run wrote is gone, nothing else
