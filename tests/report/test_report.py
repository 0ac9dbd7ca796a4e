"""The run report: built from a real run directory, readable offline, checked in headless Chromium."""

from __future__ import annotations

import base64
import html
import json
import re
import shutil
import subprocess

import numpy as np
import pytest
from synthetic_runs import RunShape, synthetic_run
from typer.testing import CliRunner

from grooves.cli import app
from grooves.core.trajectory import write_jsonl
from grooves.jsonl import read_jsonl
from grooves.report.html import choose_sample_steps, report_page
from grooves.report.plots import key_groups
from grooves.report.rundir import load_run, rewatch
from grooves.watch import Finding, Watch, WatchConfig

EVIL = '<img src=x onerror="alert(1)"> & </td>'
CONFIG = """# resolved run config <b>not bold</b>
[train]
lr = 5e-5

[watch]
cooldown_steps = 5
echo = false
"""


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A 40-step run whose titles collapse to one string from step 20, written as a trainer would."""
    path = tmp_path_factory.mktemp("run")
    (path / "config.toml").write_text(CONFIG)
    watch = Watch(WatchConfig(cooldown_steps=5, echo=False), run_dir=path)
    steps = synthetic_run(
        3, RunShape(steps=40, groups=6, group_size=4, val_every=5, hack="collapse", hack_step=20)
    )
    with (path / "metrics.jsonl").open("w") as f:
        for s in steps:
            if s.step == 0:
                best = s.groups[0].trajectories[0]
                best.messages[-1]["content"] = EVIL
                best.reward = 1e6  # the best pick of the first shown step
            write_jsonl(path / "samples" / f"step_{s.step:06d}.jsonl", s.groups)
            watch.observe(s.step, s.metrics, s.groups)
            f.write(json.dumps(s.metrics) + "\n")
    assert any(f.detector == "collapse" for f in watch.findings)
    return path


def test_report_command_writes_one_self_contained_page(run_dir):
    result = CliRunner().invoke(app, ["report", str(run_dir)])
    assert result.exit_code == 0, result.output
    page = (run_dir / "report.html").read_text()
    findings = load_run(run_dir).findings
    assert f"{len(findings)} findings" in result.output
    assert page.count('<tr class="finding"') == len(findings)
    for f in findings:
        assert html.escape(f.message) in page
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) >= 4  # rewards, checks, watch statistics, length, training
    assert all(base64.b64decode(b)[:8] == b"\x89PNG\r\n\x1a\n" for b in images)
    assert not re.search(r"<script|<link|src=\"http|url\(", page)  # nothing fetched, nothing run
    assert EVIL not in page and html.escape(EVIL) in page
    assert "&lt;b&gt;not bold&lt;/b&gt;" in page and "lr = 5e-5" in page
    assert 'href="inspect/step_000010.html"' in page


def test_rewatch_reproduces_the_recorded_findings(run_dir):
    run = load_run(run_dir)
    findings, stats = rewatch(run)
    assert [f.model_dump() for f in findings] == [f.model_dump() for f in run.findings]
    assert stats == run.watch_stats


def test_rewatch_flag_and_out_path(run_dir, tmp_path):
    out = tmp_path / "elsewhere" / "r.html"
    result = CliRunner().invoke(
        app, ["report", str(run_dir), "--rewatch", "--out", str(out), "--sample-steps", "2"]
    )
    assert result.exit_code == 0, result.output
    page = out.read_text()
    assert page.count('class="sample-step"') == 2
    assert (
        "inspect/step_000010.html" in page and "../" in page
    )  # links still reach the run's inspection pages


def test_not_a_run_directory(tmp_path):
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2
    assert "no metrics.jsonl" in result.output


def test_killed_writer_and_corrupt_file(tmp_path):
    good = json.dumps({"step": 0, "reward_mean": 1.0})
    (tmp_path / "metrics.jsonl").write_text(good + "\n" + '{"step": 1, "rew')
    assert [r["step"] for r in load_run(tmp_path).metrics] == [0]
    (tmp_path / "metrics.jsonl").write_text(good + "\nnot json\n" + good + "\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl:2 is not JSON"):
        read_jsonl(tmp_path / "metrics.jsonl")


def test_a_run_with_only_metrics_still_reports(tmp_path):
    rows = [{"step": i, "reward_mean": float(np.sin(i / 5)), "loss": 1.0 / (i + 1)} for i in range(30)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = load_run(tmp_path)
    page = report_page(run, [], [])
    assert "The watch raised no findings" in page and "The run kept no samples" in page
    assert "no config.toml" in page and page.count("data:image/png;base64,") == 2


def test_reward_signals_past_the_bound_are_left_out_and_counted(tmp_path):
    """300 signal names: the first 12 by name are drawn, and the heading says 288 were left out
    (drawing every one took 81 s when a training service stopped)."""
    names = [f"reward/signal_{i:03d}_mean" for i in range(300)]
    rows = [{"step": s, "reward_mean": 0.5, **{k: i / 300 for i, k in enumerate(names)}} for s in (1, 2, 3)]
    (title, keys, _, _), *rest = key_groups(rows, [])
    assert keys == ["reward_mean", *names[:12]]
    assert title == (
        "Rewards (trained reward and 12 of 300 signals, the first by name; 288 left out, all in metrics.jsonl)"
    )
    assert not [k for _, section, _, _ in rest for k in section if k.startswith("reward")]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    page = report_page(load_run(tmp_path), [], [], sample_steps=0, picks=(0, 0, 0), links_from=tmp_path)
    assert html.escape(title) in page


def test_choose_sample_steps():
    findings = [
        Finding(step=23, detector="collapse", severity="critical", message="m"),
        Finding(step=5, detector="input_independence", severity="info", message="m"),
    ]
    assert choose_sample_steps([0, 10, 20, 30, 40], findings, limit=6) == [0, 30, 40]
    assert choose_sample_steps([0, 10, 20, 30, 40], findings, limit=2) == [0, 40]
    assert choose_sample_steps([], findings, limit=6) == []


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium(tmp_path, *args: str) -> subprocess.CompletedProcess:
    cmd = [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_report_renders_in_headless_chromium(run_dir, tmp_path):
    from matplotlib.image import imread

    page = run_dir / "report.html"
    CliRunner().invoke(app, ["report", str(run_dir)])
    dom = chromium(tmp_path, "--dump-dom", page.as_uri()).stdout
    findings = load_run(run_dir).findings
    assert dom.count('class="finding"') == len(findings)
    assert f'data-step="{findings[0].step}"' in dom and "collapse" in dom
    assert dom.count("data:image/png;base64,") >= 4
    assert "&lt;img src=x" in dom and '<img src="x"' not in dom  # the model's markup stayed text

    shot = tmp_path / "shot.png"
    chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,3000", "--hide-scrollbars", page.as_uri())
    pixels = (imread(shot)[..., :3] * 255).astype(int)  # [H, W, 3]

    def near(rgb: tuple[int, int, int]) -> int:
        return int((np.abs(pixels - np.array(rgb)).sum(axis=-1) < 40).sum())

    assert near((0x1F, 0x77, 0xB4)) > 200  # the curves' blue: only the inline PNGs draw it
    assert near((0xC6, 0x28, 0x28)) > 200  # critical red: badges, table and the marks on the curves
