"""TRL's side of the GRPO step benchmark: `trl.GRPOTrainer` on the same model, LoRA and prompts.

Runs inside benchmarks/.venv-trl (made by `setup_trl_env.sh`) and imports nothing from grooves.
The driver (`bench_grpo_step.py`) starts it and says `go` once per step on stdin; a
`TrainerCallback` blocks in `on_step_begin` until then, so TRL's own training loop runs
unmodified, one step at a time, in lockstep with grooves.

Generation and training are split without patching TRL: a forward pre-hook on the model
(a public torch API) notes the first forward that runs with gradients enabled in each step.
Everything before it (chat template, `generate`, rewards, advantages) is "generation", as in
grooves' rollout phase; from it to `on_step_end` (forward, backward, optimizer step) is "training".
TRL's own profiling timers only report to wandb / mlflow / trackio, so they are not used.

Settings that differ from TRL's defaults, each to do the same work as grooves: on CPU float32
instead of bf16 autocast (on a GPU both run bf16), no gradient checkpointing, lr 5e-5 with a constant schedule, adam beta2 0.99,
clip range 0.2 / 0.28 with token-level ("dapo") aggregation, beta 0 (no reference model), no
dataset shuffling (step k uses prompt k in both frameworks).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch
from datasets import Dataset
from peft import LoraConfig
from step_workload import (
    emit,
    load_scenarios,
    messages,
    minor_faults,
    peak_gpu_mib,
    peak_rss_mib,
    reward,
    wait_for_go,
)
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class LockstepTimer(TrainerCallback):
    """Waits for the driver before each step and reports its generation / training seconds."""

    def __init__(self) -> None:
        self.step_start = 0.0
        self.train_start: float | None = None
        self.step_end = 0.0
        self.faults_at_start = 0
        self.step_faults = 0

    def on_train_begin(self, args, state, control, model=None, **_):
        inner = model.get_base_model() if hasattr(model, "get_base_model") else model
        inner.register_forward_pre_hook(self._on_forward)

    def _on_forward(self, module, inputs) -> None:
        if self.train_start is None and torch.is_grad_enabled():
            self.train_start = time.perf_counter()

    def on_step_begin(self, args, state, control, **_):
        if not wait_for_go():
            sys.exit(0)
        self.train_start = None
        self.faults_at_start = minor_faults()
        self.step_start = time.perf_counter()

    def on_step_end(self, args, state, control, **_):
        self.step_end = time.perf_counter()
        self.step_faults = minor_faults() - self.faults_at_start

    def on_log(self, args, state, control, logs=None, **_):
        if not logs or "completions/mean_length" not in logs:
            return
        train_start = self.train_start if self.train_start is not None else self.step_end
        emit(
            {
                "generation_s": train_start - self.step_start,
                "training_s": self.step_end - train_start,
                "step_s": self.step_end - self.step_start,
                "completion_tokens": logs["completions/mean_length"] * args.num_generations,
                "minor_faults": self.step_faults,
                "peak_rss_mib": peak_rss_mib(),
                "gpu_peak_mib": peak_gpu_mib(),
            }
        )


def capital_reward(completions, capital, **_) -> list[float]:
    """TRL's reward signature: conversational completions plus dataset columns as keywords."""
    return [reward(c[-1]["content"], cap) for c, cap in zip(completions, capital, strict=True)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--scenarios", required=True)
    ap.add_argument("--steps", type=int, required=True, help="warm-up + measured steps")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--use-vllm", action="store_true", help="sample with vLLM in colocate mode (GPU only)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    scenarios = load_scenarios(args.scenarios)
    dataset = Dataset.from_list(
        [{"prompt": messages(s["country"]), "capital": s["capital"]} for s in scenarios]
    )
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(
        args.model, dtype=getattr(torch, args.dtype), attn_implementation="sdpa"
    )
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="grpo-trl-"),
        use_cpu=args.device == "cpu",
        bf16=args.dtype == "bfloat16",
        gradient_checkpointing=False,
        num_generations=args.group_size,
        per_device_train_batch_size=args.group_size,
        max_completion_length=args.max_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        use_vllm=args.use_vllm,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=0.3,
        learning_rate=5e-5,
        lr_scheduler_type="constant",
        adam_beta2=0.99,
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        loss_type="dapo",
        scale_rewards="group",
        shuffle_dataset=False,
        max_steps=args.steps,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        dataloader_num_workers=0,
    )
    lora = LoraConfig(
        r=8, lora_alpha=16, lora_dropout=0.0, target_modules=LORA_TARGETS, task_type="CAUSAL_LM"
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=capital_reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=lora,
        callbacks=[LockstepTimer()],
    )
    trainer.train()
    emit({"done": True, "peak_rss_mib": peak_rss_mib()})


if __name__ == "__main__":
    main()
