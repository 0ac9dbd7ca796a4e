"""examples/remote_loop.py: the loop in one process, `grooves serve --train` in another, on loopback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_remote_loop_example_trains_through_a_service_it_starts(tiny_model_dir, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    small = ["rollout.groups_per_step=2", "rollout.group_size=2", "rollout.max_tokens=4"]
    small += ["validation.scenarios=2", "validation.samples=1", "logging.progress=false"]
    cmd = [
        sys.executable,
        str(ROOT / "examples" / "remote_loop.py"),
        "--steps",
        "2",
        "--model",
        str(tiny_model_dir),
    ]
    cmd += [
        "--train-dir",
        str(tmp_path / "svc"),
        "--port",
        str(port),
        *[a for s in small for a in ("--set", s)],
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("model 'capitals' at step 0; held-out success")
    assert [line.split(":")[0] for line in lines if line.startswith("step ")] == ["step 1", "step 2"]
    assert "checkpoint 2 served as model 'capitals-promoted'" in out.stdout
    run_dir = tmp_path / "svc" / "default" / "capitals"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and (run_dir / "report.html").is_file()
