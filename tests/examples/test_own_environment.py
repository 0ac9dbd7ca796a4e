"""docs/environments.md, "Write your own environment": every command of the guide, as printed there,
run on examples/envs/library_desk.py with a tiny random model in place of SmolLM2-135M (and fewer
steps, scenarios and tokens), from a copy of the folder as a fresh clone has it; then both servers
as processes, and the MCP client example of the docs against the MCP one."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from grooves.cli import app

ROOT = Path(__file__).resolve().parents[2]
DOCS = (ROOT / "docs" / "environments.md").read_text()
GUIDE = DOCS[DOCS.index("## Write your own environment") : DOCS.index("## How much they teach")]
GROOVES = (sys.executable, "-m", "grooves.cli")

EXPECTED = [
    "grooves env validate library_desk:SPEC",
    "grooves eval smollm2-135m --task library_desk:SPEC --samples 2 --max-tokens 96",
    "grooves env demos library_desk:SPEC --out runs/library_desk-demos.jsonl --copies 2",
    "grooves sft library_desk_sft.toml",
    "grooves train library_desk_rl.toml",
    "grooves eval runs/library_desk-rl --against runs/library_desk-sft",
    "grooves env serve library_desk:SPEC --port 8100",
    "grooves env serve library_desk:SPEC --mcp --port 8101",
]


def _commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", GUIDE, flags=re.S)
    return [
        line.split("#")[0].strip()
        for block in blocks
        for line in block.splitlines()
        if line.startswith("grooves ")
    ]


def test_the_guide_shows_every_step():
    assert _commands() == EXPECTED
    assert "cd examples/envs" in GUIDE


def _tiny(command: str, model: Path) -> list[str]:
    """The command's arguments, made small: the tiny model, a step or two, two scenarios, few tokens."""
    args = command.split()[1:]
    small_eval = ["--scenarios", "2", "--samples", "1", "--max-tokens", "8"]
    if args[0] == "eval":
        return [str(model) if a == "smollm2-135m" else a for a in args] + small_eval
    if args[0] == "sft":
        return [*args, "--model", str(model), "--steps", "2", "--set", "batch_size=2"]
    if args[0] == "train":
        sets = [f"model.base_model={model}", "steps=1", "rollout.group_size=2", "rollout.groups_per_step=1"]
        sets += ["rollout.max_tokens=8", "task_options.max_turns=2"]
        return [*args, *[a for s in sets for a in ("--set", s)]]
    return args


@pytest.fixture
def desk(tmp_path, monkeypatch):
    """examples/envs as a fresh clone has it (no runs/), as the working folder."""
    folder = tmp_path / "envs"
    shutil.copytree(ROOT / "examples" / "envs", folder, ignore=shutil.ignore_patterns("runs", "__pycache__"))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(folder)
    sys.modules.pop("library_desk", None)
    yield folder
    sys.modules.pop("library_desk", None)


def test_the_guide_runs_from_an_empty_folder_to_a_paired_comparison(desk, tiny_model_dir):
    results = {}
    for command in EXPECTED[:6]:
        result = CliRunner().invoke(app, _tiny(command, tiny_model_dir))
        assert result.exit_code == 0, f"{command}\n{result.output}"
        results[
            command.split()[1] + (" " + command.split()[2] if command.startswith("grooves env") else "")
        ] = result
    assert results["env validate"].stdout.startswith(
        "library_desk: 80 scenarios, min gold 1.000, max bad 0.000 (threshold 0.5): ok"
    )
    assert "120 demonstrations from 60 train scenarios; dropped 0" in results["env demos"].stdout
    assert (desk / "runs" / "library_desk-sft" / "checkpoints" / "step_000002").is_dir()
    assert (desk / "runs" / "library_desk-rl" / "checkpoints" / "step_000001").is_dir()
    assert results["train"].stderr.splitlines()[0] == (
        "plan: 1 steps of 1 groups x 2 rollouts = 2 episodes a step (up to 2 model calls of at most 8 tokens "
        "each: <= 32 sampled tokens a step); no validation"
    )
    rows = [
        json.loads(line)
        for line in (desk / "runs" / "library_desk-rl" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in rows] == [1] and "val/success_rate" not in rows[0]  # at_start, final = false
    paired = results["eval"].stdout  # the last eval: RL against SFT on the same requests
    assert "against runs/library_desk-sft/checkpoints/step_000002/adapter on " in paired
    assert "difference per scenario (target - against), over 2 scenarios:" in paired
    assert "a rollout succeeds at a grade >= 1.0 (success_threshold)" in paired


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(command: str, folder: Path) -> tuple[subprocess.Popen, int, str]:
    """The command as a process on a free port, once it says it is ready: (process, port, ready line)."""
    port = _free_port()
    args = [str(port) if a in ("8100", "8101") else a for a in command.split()[1:]]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [*GROOVES, *args], cwd=folder, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env, text=True
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if line.startswith("ready: "):
            return proc, port, line.strip()
        assert line or proc.poll() is None, f"{command} ended: {proc.stderr.read()}"
    proc.kill()
    raise AssertionError(f"{command}: not ready after 120 s")


def test_the_guide_serves_the_environment_over_http_and_mcp(desk):
    proc, port, ready = _serve(EXPECTED[6], desk)
    try:
        assert ready == (
            f"ready: environment library_desk served at http://127.0.0.1:{port} (GET /env, GET /scenarios, POST /sessions)"
        )
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as http:
            assert http.get("/env").json()["name"] == "library_desk"
            listed = http.get("/scenarios", params={"split": "validation"}).json()
            assert len(listed) == 20 and all("expected" not in s for s in listed)
    finally:
        proc.terminate()
        proc.wait(10)

    proc, port, ready = _serve(EXPECTED[7], desk)
    try:
        assert ready == f"ready: MCP server for library_desk at http://127.0.0.1:{port}/mcp"
        snippet = re.search(r"<!-- mcp-client -->\n```python\n(.*?)```", DOCS, flags=re.S)[1]
        snippet = snippet.replace("http://127.0.0.1:8101/mcp", f"http://127.0.0.1:{port}/mcp")
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
        }
        out = subprocess.run(
            [sys.executable, "-c", snippet], capture_output=True, text=True, timeout=120, env=env
        )
        assert out.returncode == 0, out.stderr
        first, graded = out.stdout.splitlines()
        scenario = json.loads(
            CliRunner().invoke(app, ["env", "scenarios", "library_desk:SPEC", "--limit", "1"]).stdout
        )
        assert first.startswith(f"{scenario['prompt']} -> M") and first.endswith("open loans")
        assert (
            graded == "grade 0.8 {'action': 1.0, 'answer': 0.0}"
        )  # a decline: looked up, lent nothing, no reason given
    finally:
        proc.terminate()
        proc.wait(10)
