"""A training step through the service vs the in-process trainer's step, side by side in one run.

The workload is `examples/capitals.toml` on SmolLM2-135M-Instruct (float32, CPU, LoRA r8 on every
projection): 4 groups of 8 rollouts per step, at most 24 completion tokens, then one optimizer step,
with a checkpoint every step (`checkpoint.every = 1`, which a service needs to come back
after a kill; the in-process side does the same).

- in-process: the trainer's step as `training.loop.run` takes it: `gather` through the in-process
  OpenAI-compatible app (no socket), `train_step`, then the run folder (metrics row, samples,
  checkpoint, reward curve);
- service: `grooves serve --train` in a second process on loopback; the loop in this process
  gathers through `TrainableModel.gather` (HTTP) and sends the groups with `TrainableModel.train`,
  which runs the same `train_step` and run-folder writes on the service.

Both start from the same seed with the same first adapter and sample with the same seeds, so they
do the same work; their losses match until the sampler's batches of the concurrent rollouts, which
depend on timing, part them (`same_losses` in the summary). The two alternate step by step, and which one goes first alternates too, so a busy
machine slows both alike. Both processes get the same torch thread count and OMP_WAIT_POLICY=PASSIVE.
Reported: the median over the measured steps (after warm-up) of each side's step seconds, split into
rollouts and training, the overhead ratio, and the bytes a service step sends and receives (chat
completions, the training request and its answer). Besides wall seconds, each step's CPU seconds:
this process's (`time.process_time`, every thread) plus the service process's (`/proc/PID/stat`),
the work a step costs whatever else the machine runs; on a machine shared with other jobs the
wall seconds of a step vary far more than the difference measured.

    python benchmarks/bench_service.py --warmup 1 --steps 6 --json docs/results/service_overhead.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


class CountingTransport(httpx.AsyncBaseTransport):
    """An HTTP transport that counts the bytes of each request and answer, by route."""

    def __init__(self):
        self.inner = httpx.AsyncHTTPTransport()
        self.sent: dict[str, int] = {}
        self.received: dict[str, int] = {}

    def take(self) -> tuple[dict[str, int], dict[str, int]]:
        sent, received, self.sent, self.received = self.sent, self.received, {}, {}
        return sent, received

    async def handle_async_request(self, request):
        kind = "train" if request.url.path.endswith("/steps") else "chat"
        self.sent[kind] = self.sent.get(kind, 0) + len(await request.aread())
        response = await self.inner.handle_async_request(request)
        data = await response.aread()
        self.received[kind] = self.received.get(kind, 0) + len(data)
        return httpx.Response(response.status_code, headers=response.headers, content=data, request=request)

    async def aclose(self):
        await self.inner.aclose()


class CpuClock:
    """CPU seconds of this process and of one other (the service), all threads, user + system."""

    def __init__(self, pid: int):
        self.pid, self.tick = pid, os.sysconf("SC_CLK_TCK")

    def __call__(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        other = (int(fields[11]) + int(fields[12])) / self.tick  # utime, stime
        return time.process_time() + other


class InProcess:
    """The trainer's step in this process, as `training.loop.run` takes it."""

    def __init__(self, config, run_dir: Path):
        from grooves.policy import policy_for
        from grooves.rollouts.handle import ModelHandle
        from grooves.serve.app import create_app, inprocess_client
        from grooves.training.checkpoint import seed_everything
        from grooves.training.optim import adamw
        from grooves.training.runlog import RunLog
        from grooves.training.step import run_loss

        seed_everything(config.seed)
        self.config = config
        self.policy = policy_for(config.model, config.lora, seed=config.seed, served_name=config.name)
        self.app = create_app(self.policy)
        self.client = inprocess_client(self.app)
        r = config.rollout
        self.handle = ModelHandle(
            self.client, self.policy.served_name, r.temperature, r.top_p, r.max_tokens, seed=config.seed
        )
        params = [p for p in self.policy.model.parameters() if p.requires_grad]
        o = config.optim
        self.optimizer = adamw(params, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay)
        self.loss = run_loss(config)
        self.run_dir = run_dir
        self.log = RunLog(run_dir)

    async def step(self, step: int, scenarios: list[dict]) -> dict:
        from grooves.config import dump_config
        from grooves.rollouts.gather import gather
        from grooves.training.checkpoint import TrainState, save_checkpoint
        from grooves.training.step import reward_stats, train_step

        c = self.config
        t0 = time.perf_counter()
        groups = await gather(
            _rollout(),
            self.handle,
            scenarios,
            c.rollout.group_size,
            concurrency=c.rollout.concurrency,
            max_failure_fraction=c.rollout.max_failure_fraction,
            progress=False,
            seed_key=(step,),
        )
        t1 = time.perf_counter()
        stats, _ = train_step(self.policy, self.optimizer, groups, c, self.loss)
        self.log.log({"step": step, **reward_stats(groups), **stats})
        self.log.samples(step, groups)
        save_checkpoint(
            self.run_dir,
            TrainState(step, step),
            self.policy.model,
            self.optimizer,
            self.policy.generator,
            dump_config(c),
            c.checkpoint.keep,
        )
        self.log.plot()
        t2 = time.perf_counter()
        tokens = sum(t.num_sampled_tokens for g in groups for t in g.ok)
        return {
            "seconds": t2 - t0,
            "rollout": t1 - t0,
            "train": t2 - t1,
            "loss": stats["loss"],
            "tokens": tokens,
        }


class Remote:
    """The same step from a loop in this process through `grooves serve --train` in another."""

    def __init__(self, model, counter: CountingTransport):
        self.model, self.counter = model, counter

    async def step(self, step: int, scenarios: list[dict]) -> dict:
        t0 = time.perf_counter()
        groups = await self.model.gather(_rollout(), scenarios, step=step)
        t1 = time.perf_counter()
        result = await self.model.train(groups, step=step)
        t2 = time.perf_counter()
        sent, received = self.counter.take()
        tokens = sum(t.num_sampled_tokens for g in groups for t in g.ok)
        return {
            "seconds": t2 - t0,
            "rollout": t1 - t0,
            "train": t2 - t1,
            "loss": result.metrics["loss"],
            "tokens": tokens,
            "server_train_seconds": result.metrics["seconds_train"],
            "bytes_sent": sent,
            "bytes_received": received,
        }


def _rollout():
    from grooves.tasks.capitals import CapitalsTask

    return CapitalsTask().rollout


def _start_service(train_dir: Path, port: int, threads: int) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "OMP_WAIT_POLICY": "PASSIVE"}
    cmd = [sys.executable, "-m", "grooves.cli", "serve", "--train", "--model", "smollm2-135m"]
    cmd += ["--train-dir", str(train_dir), "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while time.time() < deadline:
        assert proc.poll() is None, f"the service exited with {proc.returncode}"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise SystemExit("the service did not start within 600 s")


async def run(args) -> dict:
    import torch

    from grooves.config import load_config
    from grooves.remote import TrainableModel
    from grooves.tasks.capitals import CapitalsTask
    from grooves.training.data import ScenarioStream

    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="bench-service-"))
    config = load_config(
        ROOT / "examples" / "capitals.toml",
        {"output_dir": str(work / "inprocess"), "checkpoint.every": 1, "logging.progress": False},
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    service = _start_service(work / "service", port, args.threads)
    clock = CpuClock(service.pid)
    counter = CountingTransport()
    try:
        local = InProcess(config, work / "inprocess")
        model = await TrainableModel.create(f"http://127.0.0.1:{port}", "capitals", config, transport=counter)
        remote = Remote(model, counter)
        sides = {"inprocess": local, "service": remote}
        stream = ScenarioStream(CapitalsTask().scenarios("train"), config.seed)
        steps: dict[str, list[dict]] = {"inprocess": [], "service": []}
        for step in range(1, args.warmup + args.steps + 1):
            scenarios = [s for _, s in stream.take(config.rollout.groups_per_step)]
            order = ["inprocess", "service"] if step % 2 else ["service", "inprocess"]
            for name in order:
                cpu = clock()
                out = await sides[name].step(step, scenarios)
                out["cpu_seconds"] = clock() - cpu
                out.update(step=step, warmup=step <= args.warmup, first=name == order[0])
                steps[name].append(out)
                print(
                    f"step {step} {name:9s} {out['seconds']:.2f} s (rollouts {out['rollout']:.2f}, train {out['train']:.2f})",
                    flush=True,
                )
        await model.close()
        await local.client.close()
        local.app.state.scheduler.close()
    finally:
        service.send_signal(signal.SIGINT)
        service.wait(timeout=300)
    return {"steps": steps, "work_dir": str(work)}


def summarize(steps: dict[str, list[dict]]) -> dict:
    def med(name, key):
        return statistics.median(s[key] for s in steps[name] if not s["warmup"])

    keys = ("seconds", "rollout", "train", "cpu_seconds", "tokens")
    out = {name: {k: med(name, k) for k in keys} for name in steps}
    measured = [s for s in steps["service"] if not s["warmup"]]
    out["service"]["server_train_seconds"] = statistics.median(s["server_train_seconds"] for s in measured)
    for kind in ("chat", "train"):
        out["service"][f"bytes_sent_{kind}"] = statistics.median(
            s["bytes_sent"].get(kind, 0) for s in measured
        )
        out["service"][f"bytes_received_{kind}"] = statistics.median(
            s["bytes_received"].get(kind, 0) for s in measured
        )
    pairs = [
        (a["seconds"], b["seconds"])
        for a, b in zip(steps["inprocess"], steps["service"], strict=True)
        if not a["warmup"]
    ]
    out["overhead"] = {
        "step_median_ratio": out["service"]["seconds"] / out["inprocess"]["seconds"] - 1,
        "step_paired_median_ratio": statistics.median(b / a - 1 for a, b in pairs),
        "rollout_median_ratio": out["service"]["rollout"] / out["inprocess"]["rollout"] - 1,
        "train_median_ratio": out["service"]["train"] / out["inprocess"]["train"] - 1,
        "cpu_median_ratio": out["service"]["cpu_seconds"] / out["inprocess"]["cpu_seconds"] - 1,
    }
    out["same_losses"] = [a["loss"] for a in steps["inprocess"]] == [b["loss"] for b in steps["service"]]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2, help="torch threads of each process")
    ap.add_argument("--json", default=None, help="also write every step's numbers here")
    args = ap.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    load_before = os.getloadavg()
    started = time.time()
    result = asyncio.run(run(args))
    summary = summarize(result["steps"])
    report = {
        "command": " ".join(["python", "benchmarks/bench_service.py", *sys.argv[1:]]),
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
        },
        "wall_seconds": time.time() - started,
        "summary": summary,
        "steps": result["steps"],
    }
    s, o = summary, summary["overhead"]
    print(
        f"in-process step {s['inprocess']['seconds']:.2f} s, service step {s['service']['seconds']:.2f} s: "
        f"overhead {o['step_median_ratio']:+.1%} (paired median {o['step_paired_median_ratio']:+.1%}); "
        f"rollouts {o['rollout_median_ratio']:+.1%}, train {o['train_median_ratio']:+.1%}; "
        f"CPU seconds {s['inprocess']['cpu_seconds']:.2f} vs {s['service']['cpu_seconds']:.2f} ({o['cpu_median_ratio']:+.1%}); "
        f"train request {s['service']['bytes_sent_train'] / 1024:.1f} KiB, chat {s['service']['bytes_sent_chat'] / 1024:.1f} KiB "
        f"sent / {s['service']['bytes_received_chat'] / 1024:.1f} KiB received per step; same losses: {s['same_losses']}"
    )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
