"""One data-parallel optimizer step, run by torchrun in tests/training/test_distributed.py.

    torchrun --standalone --nproc-per-node 2 dp_step_worker.py MODEL_DIR OUT_DIR DTYPE

Every rank builds the same tiny policy and the same hand-made step (`step_sequences`), runs
`optimize` with its `DataParallel` place, and saves what the optimizer saw (the gradients after
the all_reduce and clipping) and the adapter after the update to OUT_DIR/rank<R>.pt. With no
torchrun environment it is the one-process run the test compares with.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch


def build_policy(model_dir: str, dtype: str):
    from grooves.config import LoraConfig
    from grooves.policy.transformers import TransformersPolicy

    torch.manual_seed(0)  # peft draws A at random
    policy = TransformersPolicy(
        model_dir, lora=LoraConfig(rank=4, alpha=8), seed=0, served_name="tiny", dtype=dtype
    )
    generator = torch.Generator().manual_seed(0)
    for name, p in policy.model.named_parameters():  # B not zero: A and B both get gradients
        if "lora_B" in name:
            p.data.copy_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * 0.05)
    return policy


def step_sequences():
    """Four groups of varied prompts and completion lengths, advantages of both signs, a sampling
    logprob off the current policy's (so the ratios are not all 1 and some tokens clip)."""
    from grooves.core.tokenize import TrainSequence

    generator = torch.Generator().manual_seed(1)
    seqs = []
    for g in range(4):
        prompt = [1, *(30 + (g * 7 + i) % 60 for i in range(9 + g)), 2]
        for k in range(3 + g % 2):
            n = 2 + (g + 2 * k) % 5
            completion = [(100 + g * 13 + k * 5 + i * 3) % 480 + 3 for i in range(n)]
            ids = prompt + completion
            mask = [False] * len(prompt) + [True] * n
            old = [0.0] * len(prompt) + (-6.0 + torch.rand(n, generator=generator)).tolist()
            adv = float(torch.randn(1, generator=generator))
            seqs.append(TrainSequence(ids, mask, old, adv, g, len(prompt), temperatures=[1.0] * len(ids)))
    return seqs


def run_step(policy, sync=None, **optim) -> dict:
    """One `optimize` on `step_sequences` (`optim`: [optim] settings besides lr 1e-2 and 64-token
    micro-batches); the gradients the optimizer stepped with, the adapter after, the stats."""
    from grooves.config import RunConfig
    from grooves.training.optim import adamw
    from grooves.training.step import optimize, run_loss

    config = RunConfig.model_validate(
        {
            "rollout": {"group_size": 4, "groups_per_step": 4},
            "optim": {"lr": 1e-2, "micro_batch_tokens": 64, **optim},
        }
    )
    params = {n: p for n, p in policy.model.named_parameters() if p.requires_grad}
    optimizer = adamw(params.values(), lr=1e-2, betas=(0.9, 0.99), weight_decay=0.0)
    seen: dict[str, torch.Tensor] = {}

    def record(opt, args, kwargs):
        seen.update({n: p.grad.detach().clone() for n, p in params.items()})

    optimizer.register_step_pre_hook(record)
    stats = optimize(policy, optimizer, step_sequences(), run_loss(config), config.optim, sync=sync)
    after = {n: p.detach().clone() for n, p in params.items()}
    return {"grads": seen, "after": after, "stats": stats}


def main() -> None:
    """argv: the model folder, the output folder, then one or more dtypes: one step in each, written
    to OUT/DTYPE/rank{R}.pt (one launch for several dtypes: a rank's start is most of its time)."""
    model_dir, out, dtypes = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    from grooves.training.distributed import DataParallel

    torch.set_num_threads(1)
    dp = DataParallel.from_env()
    dp.start("cpu")
    for dtype in dtypes:
        policy = build_policy(model_dir, dtype)
        trainable = [p for p in policy.model.parameters() if p.requires_grad]
        dp.broadcast_parameters(trainable)  # as the trainer does
        result = run_step(policy, sync=dp)
        result["shard"] = len(dp.shard(step_sequences()))
        (out / dtype).mkdir(parents=True, exist_ok=True)
        torch.save(result, out / dtype / f"rank{dp.rank}.pt")
    dp.close()


if __name__ == "__main__":
    main()
