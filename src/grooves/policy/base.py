"""What the trainer, the server and SFT need from a policy: the `Policy` protocol.

A policy is one model that both samples and trains. Its parts are separate objects, each with one
job, and a backend composes them rather than forwarding their members by hand:

- `prompts` (`policy.prompts.PromptState`): chat-template rendering with the model family's tool
  format, and the token records that let a later turn continue the exact ids sampled before;
- `adapters` (`AdapterState`): the version of the policy's own (training) adapter, which the
  trainer bumps after each optimizer step, and extra adapters served beside it;
- `generate`: sampling, on whatever engine the backend has (`policy.sampling` on transformers,
  vLLM's engine in `policy.vllm`);
- `model`, `tokenizer`, `generator`, `lock`, `training_phase`: what training reads and holds.

`TransformersPolicy` and `VLLMPolicy` implement it; the trainer, the server and SFT are typed
against it. `ContextOverflow` (a prompt too long for the model) is the error every backend's
prompts raise.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from grooves.policy.prompts import ContextOverflow, PromptState

if TYPE_CHECKING:
    import torch

    from grooves.policy.sampling import Completion, SamplingParams

__all__ = ["AdapterState", "ContextOverflow", "Policy"]


class AdapterState(Protocol):
    """The adapters of a policy: its own, trained in place and versioned, and extra ones served beside it."""

    version: int
    """The step whose weights the policy's own adapter holds; every sampled turn records it. A
    resumed run sets it to the checkpoint's step."""

    def bump(self) -> int:
        """After each optimizer step: the adapter now live is the next version; returns it."""
        ...

    def load(self, path: str | Path, name: str) -> None:
        """Serve a saved peft adapter beside the policy's own weights, frozen, under `name`."""
        ...

    def unload(self, name: str) -> None:
        """Free an adapter loaded with `load`."""
        ...

    def loaded(self) -> list[str]:
        """Names of the adapters in the model (the own one, `default`, included where the backend has it)."""
        ...


class Policy(Protocol):
    """A model that samples (for the server) and trains (for the trainer and SFT)."""

    served_name: str
    """The model name clients send."""
    trainable: bool
    """It carries a LoRA adapter that an optimizer updates (else it only samples)."""

    @property
    def model(self) -> Any:
        """The peft model training differentiates and checkpoints; updated in place."""
        ...

    tokenizer: Any
    generator: torch.Generator
    """The sampler's random generator (saved and restored with checkpoints)."""
    lock: threading.RLock
    """Held by a sampling batch and by an optimizer step, so the two never touch the weights at once."""
    prompts: PromptState

    @property
    def adapters(self) -> AdapterState:
        """Its adapters (read-only here: each backend holds its own kind of `AdapterState`)."""
        ...

    def generate(
        self,
        prompts: list[list[int]],
        params: list[SamplingParams],
        adapter: str | None = None,
        cancelled: Sequence[Callable[[], bool]] | None = None,
    ) -> list[list[Completion]]:
        """Completions of several prompts sampled as one batch (blocking). `adapter` names an extra
        adapter (None: the policy's own weights); `cancelled[i]()` turning True withdraws prompt i."""
        ...

    def training_phase(self) -> contextlib.AbstractContextManager[None]:
        """The span of an optimizer step: what the backend does around it (vLLM may sleep), and the
        training speed paths of `model.fast`."""
        ...
