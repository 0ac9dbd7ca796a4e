"""Train `capitals` from your own loop: the loop in this process, the GPU (here: CPU) work in a service.

This script starts `grooves serve --train` as a second process on loopback (or uses the one at
`--url`), then runs the whole algorithm as plain Python: take scenarios, sample them through the
service's OpenAI-compatible API, score them here (the capitals check is code), and send each
step's groups to the service, which trains and answers the next request with the new adapter.
The scenarios, the answers' text and the scoring never leave this process; the service sees the
token ids it sampled, the rewards and the step's metrics.

It trains as `grooves train examples/capitals.toml` does (the same scenarios, the same rollout
seeds, the same step function) and prints held-out success before and after, measured as the
trainer measures it.

Run: .venv/bin/python examples/remote_loop.py [--steps 20] [--set rollout.groups_per_step=2]
A second run continues the model the service kept (`--train-dir`), from its next step.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from grooves import RunConfig, ScenarioStream, TrainableModel, load_config, load_task, parse_overrides

ROOT = Path(__file__).resolve().parent


def start_service(model: str, train_dir: str, port: int) -> subprocess.Popen:
    """`grooves serve --train` in a process of its own; returns once it answers."""
    Path(train_dir).mkdir(parents=True, exist_ok=True)
    log = open(Path(train_dir) / "service.log", "a")  # noqa: SIM115 (the service writes to it until it ends)
    cmd = [sys.executable, "-m", "grooves.cli", "serve", "--train", "--model", model]
    cmd += ["--train-dir", train_dir, "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ})
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the service exited with {proc.returncode}; see {train_dir}/service.log")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"the service did not answer within 300 s; see {train_dir}/service.log")


async def held_out_success(model: TrainableModel, task, step: int) -> float:
    """Validation as the trainer runs it: its scenarios, samples, temperature and seed (run seed + 1)."""
    v = model.config.validation
    groups = await model.gather(
        task.rollout,
        task.scenarios("validation")[: v.scenarios],
        step=step,
        group_size=v.samples,
        handle=model.handle(temperature=v.temperature, seed=model.config.seed + 1),
        max_failure_fraction=1.0,
    )
    trajs = [t for g in groups for t in g.ok]
    return sum(t.metrics.get("success", 0.0) for t in trajs) / max(len(trajs), 1)


async def loop(url: str, config: RunConfig, args: argparse.Namespace) -> None:
    task = load_task("capitals")
    model = await TrainableModel.create(url, args.name, config, api_key=args.api_key, exist_ok=True)
    per_step = config.rollout.groups_per_step
    stream = ScenarioStream(task.scenarios("train"), config.seed, position=model.step * per_step)
    steps = args.steps or config.steps
    print(
        f"model {args.name!r} at step {model.step}; held-out success {await held_out_success(model, task, model.step):.1%}"
    )
    while model.step < steps:
        t0 = time.perf_counter()
        groups = await model.gather(task.rollout, [s for _, s in stream.take(per_step)])  # sampled remotely
        result = await model.train(groups)  # scored here; one optimizer step there
        m = result.metrics
        print(
            f"step {result.step}: reward {m['reward_mean']:.3f}, success {m['success_rate']:.1%}, "
            f"loss {m['loss']:+.4f}, adapter version {result.adapter_version}, {time.perf_counter() - t0:.1f} s"
        )
    print(f"held-out success after step {model.step}: {await held_out_success(model, task, model.step):.1%}")
    served = await model.promote()
    print(
        f"checkpoint {served['step']} served as model {served['name']!r}; usage: {(await model.usage())['total']}"
    )
    await model.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-file", default=str(ROOT / "capitals.toml"))
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a run-file field"
    )
    parser.add_argument(
        "--steps", type=int, default=None, help="train up to this step (default: the run file's)"
    )
    parser.add_argument("--name", default="capitals", help="the trainable model's name on the service")
    parser.add_argument("--url", default=None, help="a running service; without it one is started here")
    parser.add_argument("--api-key", default=os.environ.get("GROOVES_API_KEY"))
    parser.add_argument("--model", default=None, help="base model (default: the run file's model.base_model)")
    parser.add_argument("--train-dir", default="runs/service", help="where that service keeps its models")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    # a checkpoint every step: a restarted service comes back at the last step, not up to K-1 before it
    overrides = {"checkpoint.every": 1, **parse_overrides(args.set)}
    overrides |= {"model.base_model": args.model} if args.model else {}
    config = load_config(args.run_file, overrides)
    service = None if args.url else start_service(config.model.base_model, args.train_dir, args.port)
    try:
        asyncio.run(loop(args.url or f"http://127.0.0.1:{args.port}", config, args))
    finally:
        if service is not None:  # a graceful stop: the service writes each model's report
            service.send_signal(signal.SIGINT)
            service.wait(timeout=120)
            print(
                f"run folder: {args.train_dir}/default/{args.name} (report.html, metrics.jsonl, checkpoints/)"
            )


if __name__ == "__main__":
    main()
