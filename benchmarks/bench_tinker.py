"""One RL step through the Tinker API vs the same step through grooves' own client, side by side.

Both sides train their own model on one running `grooves serve --train` (start it first), on the
same work: G arithmetic prompts ("What is a + b?", built in code, reward 1 - |n - (a + b)| / (a + b)
for the first number n of the answer, at least 0)
with N samples each, at most T tokens, advantages r - mean(r) per group (a group whose rewards are
all equal is dropped on both sides, as grooves' step drops it), one optimizer step:

- tinker: the `tinker` SDK as tinker-cookbook's RL loop uses it: `SamplingClient.sample` per
  prompt (all in flight at once), `forward_backward(..., "importance_sampling")` + `optim_step`,
  then `save_weights_and_get_sampling_client()` for the next step's sampler;
- grooves: `TrainableModel`: chat completions with `n` samples per prompt (all in flight at once),
  then `train(groups)` (the trainer's `train_step`, with its metrics row and checkpoint).

The two alternate step by step, and which goes first alternates too. Reported per side: the median
over the measured steps of the step's wall seconds, split into sampling and training, and the reward
mean of each step.

    grooves serve --train --model smollm2-135m --port 8744 --train-dir runs/bench-tinker &
    TINKER_TELEMETRY=0 python benchmarks/bench_tinker.py --url http://127.0.0.1:8744 --warmup 1 --steps 4 \\
        --json docs/results/tinker_overhead.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import time
from pathlib import Path

os.environ.setdefault("TINKER_TELEMETRY", "0")

import tinker  # noqa: E402
from tinker import types  # noqa: E402

from grooves.core.trajectory import SampledTurn, Trajectory, TrajectoryGroup  # noqa: E402
from grooves.remote import TrainableModel  # noqa: E402


def problems(step: int, groups: int) -> list[tuple[str, int]]:
    rng = random.Random(step)
    out = []
    for _ in range(groups):
        a, b = rng.randint(1, 20), rng.randint(1, 20)
        out.append((f"What is {a} + {b}? Answer with the number only.", a + b))
    return out


def reward(text: str, answer: int) -> float:
    """How close the first number in the answer is to the sum: 1 when it is the sum, 0 when it is off
    by the sum or more, or there is none (graded, so that a group's rewards differ and each step trains)."""
    found = re.search(r"-?\d+", text)
    if found is None:
        return 0.0
    return max(0.0, 1.0 - abs(int(found.group()) - answer) / answer)


async def tinker_step(state, tokenizer, step: int, args) -> dict:
    t0 = time.perf_counter()
    sampler = state["sampler"]
    params = types.SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=step)
    probs = problems(step, args.groups)
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
        )
        for q, _ in probs
    ]
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    futures = [sampler.sample(types.ModelInput.from_ints(p), args.samples, params) for p in prompts]
    results = [await f for f in futures]
    t1 = time.perf_counter()
    data, rewards = [], []
    for p, (_, answer), res in zip(prompts, probs, results, strict=True):
        rs = [reward(tokenizer.decode(s.tokens, skip_special_tokens=True), answer) for s in res.sequences]
        rewards += rs
        mean = statistics.fmean(rs)
        if len(set(rs)) == 1:  # no signal: dropped, as grooves' step drops such a group
            continue
        for s, r in zip(res.sequences, rs, strict=True):
            seq = p + list(s.tokens)
            pad = [0.0] * (len(p) - 1)
            data.append(
                types.Datum(
                    model_input=types.ModelInput.from_ints(seq[:-1]),
                    loss_fn_inputs={
                        "target_tokens": seq[1:],
                        "logprobs": pad + list(s.logprobs),
                        "advantages": pad + [r - mean] * len(s.tokens),
                    },
                )
            )
    training = state["training"]
    if data:
        fb = training.forward_backward(data, "importance_sampling")
        opt = training.optim_step(types.AdamParams(learning_rate=args.lr))
        await fb
        await opt
    state["sampler"] = await training.save_weights_and_get_sampling_client()
    t2 = time.perf_counter()
    return {
        "seconds": t2 - t0,
        "sampling": t1 - t0,
        "training": t2 - t1,
        "reward_mean": statistics.fmean(rewards),
    }


async def grooves_step(model: TrainableModel, step: int, args) -> dict:
    t0 = time.perf_counter()
    client = model.openai_client()
    probs = problems(step, args.groups)

    async def one(q):
        return await client.chat.completions.create(
            model=model.name,
            messages=[{"role": "user", "content": q}],
            n=args.samples,
            max_tokens=args.max_tokens,
            temperature=1.0,
            seed=step,
        )

    answers = await asyncio.gather(*(one(q) for q, _ in probs))
    t1 = time.perf_counter()
    groups, rewards = [], []
    for (_, answer), resp in zip(probs, answers, strict=True):
        trajs = []
        for c in resp.choices:
            extra = c.model_extra or {}
            turn = SampledTurn(
                prompt_token_ids=extra["prompt_token_ids"],
                token_ids=extra["token_ids"],
                logprobs=extra["sampled_logprobs"],
                adapter_version=extra["adapter_version"],
                temperature=1.0,
            )
            r = reward(c.message.content or "", answer)
            rewards.append(r)
            trajs.append(Trajectory(turns=[turn], reward=r))
        groups.append(TrajectoryGroup(trajectories=trajs))
    await model.train(groups)
    t2 = time.perf_counter()
    return {
        "seconds": t2 - t0,
        "sampling": t1 - t0,
        "training": t2 - t1,
        "reward_mean": statistics.fmean(rewards),
    }


async def main(args) -> dict:
    service = tinker.ServiceClient(base_url=args.url, api_key=args.tinker_key)
    training = await service.create_lora_training_client(base_model=args.base_model, rank=8, seed=0)
    tokenizer = training.get_tokenizer()
    state = {"training": training, "sampler": await training.save_weights_and_get_sampling_client()}
    config = {
        "seed": 0,
        "lora": {"rank": 8, "alpha": 16.0},
        "rollout": {
            "group_size": args.samples,
            "groups_per_step": args.groups,
            "max_tokens": args.max_tokens,
        },
        "optim": {"lr": args.lr},
        "logging": {"progress": False},
    }
    name = f"bench-{int(time.time())}"
    model = await TrainableModel.create(args.url, name, config, api_key=args.grooves_key)
    rows: dict[str, list[dict]] = {"tinker": [], "grooves": []}
    for step in range(args.warmup + args.steps):
        order = ["tinker", "grooves"] if step % 2 == 0 else ["grooves", "tinker"]
        for side in order:
            if side == "tinker":
                row = await tinker_step(state, tokenizer, step, args)
            else:
                row = await grooves_step(model, step, args)
            row["step"] = step
            rows[side].append(row)
            print(side, json.dumps(row), flush=True)
    await model.close()
    service.close("success")
    measured = {k: v[args.warmup :] for k, v in rows.items()}
    summary = {
        side: {
            key: statistics.median(r[key] for r in measured[side])
            for key in ("seconds", "sampling", "training")
        }
        for side in rows
    }
    summary["tinker_vs_grooves_seconds"] = summary["tinker"]["seconds"] / summary["grooves"]["seconds"] - 1
    return {"args": vars(args), "load_average_after": os.getloadavg(), "steps": rows, "median": summary}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument(
        "--base-model", default=str(Path.home() / ".cache/grooves/models/SmolLM2-135M-Instruct")
    )
    parser.add_argument("--tinker-key", default="tml-local")
    parser.add_argument("--grooves-key", default=None)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    load_before = os.getloadavg()
    result = asyncio.run(main(args))
    result["load_average_before"] = load_before
    print(json.dumps(result["median"], indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
