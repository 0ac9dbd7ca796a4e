"""Data-parallel training (train/distributed.py) with 2 gloo ranks on CPU, launched by torchrun:
one step equals the one-process step; a run whose rank is killed resumes exactly, learning-rate
schedule included."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from grooves.config import dump_config, parse_config
from grooves.core.trajectory import Trajectory, TrajectoryGroup
from grooves.training.distributed import DataParallel
from grooves.training.optim import lr_factor
from run_rows import assert_same_rows

HERE = Path(__file__).resolve().parent
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def _env() -> dict[str, str]:
    src = str(HERE.parents[1] / "src")
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{src}:{os.environ.get('PYTHONPATH', '')}"}


# ---- the pieces, in one process ---------------------------------------------------------------
def test_shares_are_contiguous_and_cover_everything_once():
    ranks = [DataParallel(r, 3) for r in range(3)]
    assert [list(d.share(8)) for d in ranks] == [[0, 1], [2, 3, 4], [5, 6, 7]]
    from dp_step_worker import step_sequences

    seqs = step_sequences()
    shards = [d.shard(seqs) for d in ranks]
    assert [s for shard in shards for s in shard] == seqs  # contiguous, in order, each once
    tokens = [sum(len(s) for s in shard) for shard in shards]
    assert max(tokens) - min(tokens) <= max(len(s) for s in seqs)  # balanced to within one sequence


def test_a_rollouts_token_sequences_go_to_one_rank():
    """A rollout split at a prefix break is one sequence of the loss (GSPO's ratio, sequence_mean):
    its token sequences stay on one rank, wherever the token balance would cut between them."""
    from grooves.core.tokenize import trajectory_to_sequences
    from grooves.core.trajectory import SampledTurn

    def turn(prompt: list[int], n: int) -> SampledTurn:
        return SampledTurn(prompt_token_ids=prompt, token_ids=[7] * n, logprobs=[-1.0] * n)

    split = Trajectory(turns=[turn([1, 2], 4), turn([1, 3], 4)])  # two sequences of 6 tokens
    trajs = [Trajectory(turns=[turn([1, 4], 4)]), split, Trajectory(turns=[turn([1, 5], 4)])]
    seqs = [s for t in trajs for s in trajectory_to_sequences(t, 1.0)]
    assert len(seqs) == 4
    # by tokens alone (6 each of 24), rank 0 would take sequences 0-1 and rank 1 sequences 2-3
    shards = [DataParallel(r, 2).shard(seqs) for r in range(2)]
    assert [s for shard in shards for s in shard] == seqs
    assert [len(shard) for shard in shards] in ([1, 3], [3, 1])


def test_a_world_of_one_changes_nothing():
    dp = DataParallel.single()
    groups = [TrajectoryGroup(trajectories=[Trajectory(reward=1.0)])]
    assert (
        dp.merge_groups(groups) is groups and dp.broadcast(3) == 3 and dp.gather({"a": 1.0}) == [{"a": 1.0}]
    )
    assert dp.device("cuda") == "cuda" and not dp.active and dp.main


# ---- one step on 2 ranks ------------------------------------------------------------------------
DTYPES = ["float32", "float64"]


@pytest.fixture(scope="module")
def two_rank_steps(tiny_model_dir, tmp_path_factory) -> Path:
    """One torchrun launch of 2 gloo ranks, one step in each of DTYPES: OUT/DTYPE/rank{R}.pt."""
    out = tmp_path_factory.mktemp("dp-steps")
    cmd = [*TORCHRUN, str(HERE / "dp_step_worker.py"), str(tiny_model_dir), str(out), *DTYPES]
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_two_rank_step_equals_the_one_process_step(tiny_model_dir, two_rank_steps, dtype):
    """Gradient (after the all_reduce and clipping) and updated adapter of 2 gloo ranks = one process's, to 1e-6."""
    from dp_step_worker import build_policy, run_step

    ranks = [torch.load(two_rank_steps / dtype / f"rank{r}.pt", weights_only=False) for r in range(2)]
    assert all(r["shard"] > 0 for r in ranks)  # both ranks computed a share of the step
    torch.set_num_threads(1)
    alone = run_step(build_policy(str(tiny_model_dir), dtype))
    for name, grad in alone["grads"].items():
        assert torch.equal(ranks[0]["grads"][name], ranks[1]["grads"][name]), name  # one update everywhere
        assert torch.equal(ranks[0]["after"][name], ranks[1]["after"][name]), name
        assert (ranks[0]["grads"][name] - grad).abs().max() <= 1e-6, name
        assert (ranks[0]["after"][name] - alone["after"][name]).abs().max() <= 1e-6, name
    assert max(float(g.abs().max()) for g in alone["grads"].values()) > 1e-3  # a gradient worth comparing
    for key in ("loss", "policy_loss", "clip_fraction", "ratio_mean", "grad_norm", "num_tokens"):
        assert ranks[0]["stats"][key] == pytest.approx(alone["stats"][key], rel=1e-5, abs=1e-7), key
    assert alone["stats"]["clip_fraction"] > 0  # the off-policy logprobs made some tokens clip


# ---- a whole run: kill -9 of one rank, then --resume --------------------------------------------
def _run_config(model_dir, out: Path):
    return parse_config(
        {
            "name": "toy",
            "output_dir": str(out),
            "seed": 1,
            "steps": 4,
            "task": "toy_tokens",
            "task_options": {"vocab_size": 487, "num_scenarios": 16},
            "model": {"base_model": str(model_dir)},
            "rollout": {"group_size": 4, "groups_per_step": 4, "max_tokens": 4},
            "optim": {"lr": 5e-2, "micro_batch_tokens": 4096, "lr_schedule": "cosine", "warmup_steps": 1},
            "lora": {"rank": 4, "alpha": 8},
            "validation": {"every": 0, "scenarios": 4},
            "logging": {"progress": False, "report": False},
        }
    )


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _train(run_file: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [*TORCHRUN, "-m", "grooves", "train", str(run_file), *extra]
    return subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600)


def _rank_pid(launcher: int, rank: int) -> int | None:
    """The process torchrun started for `rank` (its environment says RANK=<rank>)."""
    for child in Path("/proc").iterdir():
        if not child.name.isdigit():
            continue
        try:
            stat = (child / "stat").read_text()
            environ = (child / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == launcher and f"RANK={rank}".encode() in environ:
            return int(child.name)
    return None


@pytest.mark.slow  # three 2-rank launches, over a minute: make test-slow
def test_kill_9_of_one_rank_then_resume_continues_exactly(peaked_model_dir, tmp_path):
    full_dir, part_dir = tmp_path / "full", tmp_path / "part"
    (tmp_path / "full.toml").write_text(dump_config(_run_config(peaked_model_dir, full_dir)))
    (tmp_path / "part.toml").write_text(dump_config(_run_config(peaked_model_dir, part_dir)))
    full = _train(tmp_path / "full.toml")
    assert full.returncode == 0, full.stderr[-3000:]
    rows = _rows(full_dir)
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]  # rank 0 alone writes: each step once
    assert all(r["rollouts"] == 16 for r in rows[1:])  # both ranks' shares merged into every step
    expected = [
        5e-2 * lr_factor(d, schedule="cosine", warmup_steps=1, total_steps=4, min_ratio=0.0) for d in range(4)
    ]
    assert [r["lr"] for r in rows[1:]] == pytest.approx(
        expected, rel=1e-12, abs=0
    )  # 0.025, 0.05, 0.0375, 0.0125
    assert len((full_dir / "samples" / "step_000004.jsonl").read_text().splitlines()) == 4

    launcher = subprocess.Popen(
        [*TORCHRUN, "-m", "grooves", "train", str(tmp_path / "part.toml")],
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.time() + 300
    while not (part_dir / "checkpoints" / "step_000002" / "manifest.json").exists():
        assert launcher.poll() is None, launcher.stderr.read().decode()[-3000:]
        assert time.time() < deadline
        time.sleep(0.1)
    victim = _rank_pid(launcher.pid, 1)
    assert victim is not None
    os.kill(victim, signal.SIGKILL)
    assert launcher.wait(timeout=120) != 0  # torchrun ends the other rank and fails
    killed_at = max(r["step"] for r in _rows(part_dir))
    assert killed_at < 4, "the run ended before the kill; nothing was resumed"

    resumed = _train(tmp_path / "part.toml", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a_rows, b_rows = _rows(full_dir), _rows(part_dir)
    assert [r["step"] for r in b_rows] == [0, 1, 2, 3, 4]
    assert_same_rows(a_rows, b_rows)
