"""The sampler of a transformers policy: which weights a batch runs on, and the fast paths it uses.

`sampling.sample` is the decoding loop; this object calls it for the policy with the weights the
batch asks for (the policy's own adapter, folded into copies of the base weights where the fast
paths allow, an extra adapter, or the base alone) and the fast paths' decoder and output head.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import torch

from grooves.policy.fast import FastSampling
from grooves.policy.loaded_adapters import PeftAdapters
from grooves.policy.sampling import Completion, SamplingParams, sample


class Sampler:
    """Sampling batches on a transformers policy's model with its adapters and its fast paths.

    A batch runs on the weights its `adapter` names: the policy's own (folded into copies of the
    base weights where the fast paths allow, else through peft's layers), an extra adapter, or the
    base alone for a policy without an adapter. It holds the policy's lock, so an optimizer step
    never changes the weights mid-batch.
    """

    def __init__(
        self,
        adapters: PeftAdapters,
        tokenizer,
        *,
        eos_token_ids: set[int],
        generator: torch.Generator,
        lock,
        fast: FastSampling,
    ):
        self.adapters = adapters
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.generator = generator
        self.lock = lock
        self.fast = fast

    def generate(
        self,
        prompts: list[list[int]],
        params: list[SamplingParams],
        adapter: str | None = None,
        cancelled: Sequence[Callable[[], bool]] | None = None,
    ) -> list[list[Completion]]:
        """Sample completions for several prompts in one batch (blocking); see `Policy.generate`."""
        head = self.fast.output_head(self.adapters.model)
        with self.lock, self._weights(adapter), head:
            model = self.adapters.model
            was_training = model.training
            model.eval()
            try:
                return sample(
                    model,
                    self.tokenizer,
                    prompts,
                    params,
                    eos_token_ids=self.eos_token_ids,
                    generator=self.generator,
                    decoder=self.fast.decoder,
                    prefill=self.fast.prefill,
                    cancelled=cancelled,
                )
            finally:
                if was_training:
                    model.train()

    @contextlib.contextmanager
    def _weights(self, adapter: str | None) -> Iterator[None]:
        """The weights a sampling batch runs on: the own adapter folded in where possible, else peft's layers."""
        if adapter is None and self.fast.folded:
            with self.adapters.keep_requires_grad(), self.fast.folded_weights():
                yield
        else:
            with self.adapters.scope(adapter):
                yield
