"""One Tinker training model: a LoRA adapter on the service's shared base, trained request by request.

A Tinker model is a `HostedModel` (the trainer's policy over the shared base, its AdamW, its RNG
stream), driven the Tinker way instead of by whole steps: `forward_backward` adds a request's
gradient to the adapter's `.grad` (the loss of `core.datum_loss`, summed over the request's
datums and tokens), `optim_step` applies AdamW once with the request's hyperparameters and clears
the gradient, and the weights can be saved and loaded by name:

- `save_state(name)`: adapter, optimizer and RNG states, written as the trainer writes a
  checkpoint (atomic, checksummed: `train.checkpoint.save_checkpoint`), plus the model's LoRA
  settings, so a new model (after a restart of the service too) is created from it exactly;
- `save_sampler(name)`: the adapter alone (peft format, loadable by `grooves serve --adapter`), a
  frozen snapshot that a sampling client samples.

An update whose gradient norm is not finite, or that multiplies the adapter's norm by more than
`MAX_WEIGHT_GROWTH`, is not applied (the weights and optimizer state stay as they were), as in the
trainer with `optim.on_nonfinite = "skip"`; the request fails and says so.

Every method here blocks (torch work): the routes run them on a worker thread, in `seq_id` order.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from grooves.core.datum_loss import datum_loss
from grooves.core.forward import target_logprobs
from grooves.models import describe_base, record_adapter_base
from grooves.training.checkpoint import TrainState, latest_checkpoint, load_checkpoint, save_checkpoint
from grooves.training.optim import adamw
from grooves.training.step import MAX_WEIGHT_GROWTH, guarded_step
from grooves.training_service.hosted import HostedModel
from grooves.training_service.tinker.codec import FwdBwd, forward_backward_output
from grooves.training_service.tinker.futures import RequestFailed

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]
META = "tinker.json"


@dataclass(frozen=True)
class LoraSettings:
    """What a Tinker model was created with (`create_model`'s `lora_config`), kept with its states."""

    base_model: str
    rank: int
    seed: int
    train_attn: bool = True
    train_mlp: bool = True
    train_unembed: bool = True

    def sections(self) -> dict:
        """The model's run-file sections: LoRA on the chosen projections, alpha = 2 x rank."""
        targets = (ATTENTION if self.train_attn else []) + (MLP if self.train_mlp else [])
        return {
            "seed": self.seed,
            "lora": {"rank": self.rank, "alpha": 2.0 * self.rank, "target_modules": targets},
        }


@dataclass(frozen=True)
class AdamStep:
    """`optim_step`'s `adam_params`."""

    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0


class TinkerModel:
    """A training model of one tenant, known to the SDK by `model_id` (`<session>:train:<n>`)."""

    def __init__(self, model_id: str, tenant: str, settings: LoraSettings, hosted: HostedModel, folder: Path):
        self.model_id, self.tenant, self.settings = model_id, tenant, settings
        self.hosted, self.folder = hosted, folder
        self.steps = 0

    @property
    def policy(self):
        return self.hosted.policy

    @property
    def vocab_size(self) -> int:
        return int(self.policy.model.get_input_embeddings().num_embeddings)

    # ---- forward and backward ----------------------------------------------------------------
    def forward_backward(self, req: FwdBwd) -> bytes:
        """Every datum's learner logprobs and loss; with a backward (not `forward_only`), the
        loss's gradient added to the adapter's. Answers a `ForwardBackwardOutput` message."""
        policy, model = self.policy, self.policy.model
        logprobs: list[np.ndarray] = [np.zeros(0)] * len(req.data)
        total = 0.0
        with policy.lock, self.hosted.rngs(), policy.training_phase():
            model.train(not req.forward_only)
            try:
                with torch.set_grad_enabled(not req.forward_only):
                    for group in self._micro_batches(req):
                        lps = self._logprobs(model, [req.data[i] for i in group])
                        losses = [
                            datum_loss(req.loss_fn, lp, _tensors(req.data[i].inputs, lp.device), req.config)
                            for i, lp in zip(group, lps, strict=True)
                        ]
                        loss = torch.stack(losses).sum()
                        if not req.forward_only:
                            loss.backward()
                        total += float(loss.detach())
                        for i, lp in zip(group, lps, strict=True):
                            logprobs[i] = lp.detach().float().cpu().numpy()
            finally:
                model.eval()
        metrics = {"loss:sum": total, "num_tokens:sum": float(req.num_tokens)}
        return forward_backward_output({"logprobs": logprobs}, metrics)

    def _micro_batches(self, req: FwdBwd) -> list[list[int]]:
        """Datum indices in groups whose padded size stays within `optim.micro_batch_tokens`."""
        budget = self.hosted.config.optim.micro_batch_tokens or 4096
        groups: list[list[int]] = []
        width = 0
        for i in sorted(range(len(req.data)), key=lambda i: -len(req.data[i].tokens)):
            n = len(req.data[i].tokens)
            if groups and (len(groups[-1]) + 1) * max(width, n) <= budget:
                groups[-1].append(i)
                width = max(width, n)
            else:
                groups.append([i])
                width = n
        return groups

    @staticmethod
    def _logprobs(model, data) -> list[torch.Tensor]:
        """Each datum's logprob of its `target_tokens` at every input position, [N] float32."""
        device = model.get_input_embeddings().weight.device
        width = max(len(d.tokens) for d in data)
        ids = torch.zeros(len(data), width, dtype=torch.long)  # [B, L], right-padded
        mask = torch.zeros(len(data), width, dtype=torch.long)  # [B, L]
        for b, d in enumerate(data):
            ids[b, : len(d.tokens)] = torch.from_numpy(d.tokens)
            mask[b, : len(d.tokens)] = 1
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False).logits
        rows, _, vocab = logits.shape  # [B, L, V]
        pred = torch.cat([b * width + torch.arange(len(d.tokens)) for b, d in enumerate(data)]).to(device)
        targets = torch.from_numpy(np.concatenate([d.inputs["target_tokens"] for d in data])).to(device)
        lp, _ = target_logprobs(logits.reshape(rows * width, vocab), pred, targets)  # [sum N]
        return list(lp.split([len(d.tokens) for d in data]))

    # ---- the optimizer -----------------------------------------------------------------------
    def optim_step(self, adam: AdamStep) -> dict:
        """One AdamW step on the gradient gathered since the last one, with `adam`'s settings."""
        policy = self.policy
        with policy.lock, self.hosted.rngs():
            params = [p for p in policy.model.parameters() if p.requires_grad]
            optimizer = self.hosted.optimizer
            for group in optimizer.param_groups:
                group.update(
                    lr=adam.learning_rate,
                    betas=(adam.beta1, adam.beta2),
                    eps=adam.eps,
                    weight_decay=adam.weight_decay,
                )
            try:
                limit = adam.grad_clip_norm if adam.grad_clip_norm > 0 else math.inf
                grad_norm = float(torch.nn.utils.clip_grad_norm_(params, limit))
                if not math.isfinite(grad_norm):
                    raise RequestFailed(
                        f"the gradient's norm is {grad_norm}, not finite: this optimizer step was not applied "
                        "(the weights and optimizer state are as before; the gradient was cleared)"
                    )
                growth = guarded_step(optimizer, params)
                if growth > MAX_WEIGHT_GROWTH:
                    raise RequestFailed(
                        f"this update would multiply the adapter weights' norm by {growth:.3g} (more than "
                        f"{MAX_WEIGHT_GROWTH:g}x in one step, at learning_rate {adam.learning_rate:g}); it was not "
                        "applied: lower the learning rate"
                    )
            finally:
                optimizer.zero_grad(set_to_none=True)
            policy.adapters.bump()
            self.steps += 1
        return {"metrics": {"grad_norm:mean": grad_norm, "step:max": float(self.steps)}}

    # ---- saved states --------------------------------------------------------------------------
    def save_state(self, folder: Path) -> None:
        """Adapter, optimizer and RNG states in `folder` (a checkpoint of its own), with the settings."""
        policy = self.policy
        with policy.lock, self.hosted.rngs():
            save_checkpoint(
                folder,
                TrainState(step=self.steps, data_position=self.steps),
                policy.model,
                self.hosted.optimizer,
                policy.generator,
                "",
                keep=1,
            )
        (folder / META).write_text(json.dumps(asdict(self.settings), indent=1))

    def load_state(self, folder: Path, *, optimizer: bool) -> None:
        """The weights (and with `optimizer`, the optimizer state) saved by `save_state` in `folder`."""
        path = latest_checkpoint(folder)
        if path is None:
            raise RequestFailed(f"the saved state at {folder.name!r} holds no checkpoint")
        policy = self.policy
        with policy.lock, self.hosted.rngs():
            params = [p for p in policy.model.parameters() if p.requires_grad]
            o = self.hosted.config.optim
            loaded = adamw(params, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay)
            state = load_checkpoint(path, policy.model, loaded, policy.generator)
            self.hosted.optimizer = (
                loaded if optimizer else adamw(params, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay)
            )
            policy.model.zero_grad(set_to_none=True)
            policy.adapters.bump()
            self.steps = state.step

    def save_sampler(self, folder: Path) -> int:
        """The adapter alone, in peft's format, for sampling (frozen: later steps do not change it);
        returns the version of the live adapter it copies (`policy.adapters.version`)."""
        tmp = folder.with_name(folder.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        with self.policy.lock:
            self.policy.model.save_pretrained(tmp, selected_adapters=["default"])
            version = self.policy.adapters.version
        base = getattr(self.policy.model.peft_config.get("default"), "base_model_name_or_path", None)
        if base:
            record_adapter_base(tmp, describe_base(base))
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
        return version


def read_settings(folder: Path) -> LoraSettings:
    return LoraSettings(**json.loads((folder / META).read_text()))


def _tensors(inputs: dict[str, np.ndarray], device) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(v).to(device) for k, v in inputs.items()}


SAFE = re.compile(r"[^A-Za-z0-9._-]")


def folder_name(text: str) -> str:
    """`text` as one folder name: characters other than letters, digits, `.`, `_`, `-` become `-`."""
    safe = SAFE.sub("-", text).strip(".")
    if not safe or safe != text.replace(":", "-") or len(safe) > 128:
        raise ValueError(f"{text!r}: use 1-128 letters, digits, '.', '_', '-' (and ':' in model ids)")
    return safe
