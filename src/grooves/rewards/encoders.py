"""Frozen encoders that turn (input, output) text pairs into feature vectors for a reward model.

A reward model here is a small regressor on top of a frozen encoder, so the encoder is pluggable
(the `Encoder` protocol) and saved by its `spec()`, not its weights:

- `HiddenStateEncoder`: the mean-pooled last hidden state of any transformers causal LM directory,
  typically the policy's own base model. The policy already represents its outputs in this
  space, and nothing new is downloaded. The pair is rendered with the model's chat template (user:
  input, assistant: output) and truncated from the left, so the output is always seen whole.
- `HashedNgramEncoder`: a hashed bag of word n-grams of the input and the output (the "hashing
  trick", Weinberger et al. 2009). Needs no model, costs microseconds, and is deterministic across
  processes (blake2b, not Python's salted `hash`): for tests, demos, and tasks where surface
  features carry the score.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

Pair = tuple[str, str]
"""(input text, output text)."""


class Encoder(Protocol):
    """Maps text pairs to fixed-size float vectors. Must be deterministic and frozen."""

    @property
    def dim(self) -> int: ...

    def encode(self, pairs: Sequence[Pair]) -> torch.Tensor:
        """[B, dim] float32 features of `pairs`."""
        ...

    def spec(self) -> dict[str, Any]:
        """JSON-serializable description from which `encoder_from_spec` rebuilds an identical encoder."""
        ...


_TOKEN = re.compile(r"\w+|[^\w\s]")


class HashedNgramEncoder:
    """Signed hashed counts of word n-grams, log-scaled and L2-normalized, input and output apart."""

    def __init__(self, dim: int = 4096, ngrams: tuple[int, ...] = (1, 2), use_input: bool = True) -> None:
        if dim < 8:
            raise ValueError(f"dim must be >= 8, got {dim}")
        if not ngrams or any(n < 1 for n in ngrams):
            raise ValueError(f"ngrams must be positive lengths, e.g. (1, 2); got {ngrams}")
        self._dim = dim
        self.ngrams = tuple(ngrams)
        self.use_input = use_input

    @property
    def dim(self) -> int:
        return self._dim

    def _features(self, text: str, prefix: str, counts: dict[int, float]) -> None:
        tokens = _TOKEN.findall(text.lower())
        for n in self.ngrams:
            for i in range(len(tokens) - n + 1):
                digest = hashlib.blake2b(
                    f"{prefix}{' '.join(tokens[i : i + n])}".encode(), digest_size=8
                ).digest()
                h = int.from_bytes(digest, "little")
                # the sign bit keeps collisions from biasing a bucket upward (signed hashing trick)
                bucket = h % self._dim
                counts[bucket] = counts.get(bucket, 0.0) + (1.0 if (h >> 63) & 1 else -1.0)

    def encode(self, pairs: Sequence[Pair]) -> torch.Tensor:
        out = torch.zeros(len(pairs), self._dim)  # [B, D]
        for row, (text_in, text_out) in enumerate(pairs):
            counts: dict[int, float] = {}
            self._features(text_out, "o:", counts)
            if self.use_input:
                self._features(text_in, "i:", counts)
            if counts:
                out[row, list(counts)] = torch.tensor(list(counts.values()))
        out = torch.sign(out) * torch.log1p(out.abs())
        return out / out.norm(dim=1, keepdim=True).clamp_min(1e-12)

    def spec(self) -> dict[str, Any]:
        return {
            "kind": "hashed-ngrams",
            "dim": self._dim,
            "ngrams": list(self.ngrams),
            "use_input": self.use_input,
        }


class HiddenStateEncoder:
    """Mean-pooled last hidden state of a causal LM, over the tokens of the rendered pair."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        model_dir: str | None = None,
        max_length: int = 512,
        batch_size: int = 8,
    ) -> None:
        self.model = model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.tokenizer = tokenizer
        self.tokenizer.truncation_side = "left"  # keep the output whole; cut the oldest context
        self.tokenizer.padding_side = "right"  # real tokens keep positions 0..n-1 whatever the batch
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model_dir = model_dir
        self.max_length = max_length
        self.batch_size = batch_size

    @classmethod
    def from_dir(
        cls, model_dir: str | Path, *, max_length: int = 512, batch_size: int = 8
    ) -> HiddenStateEncoder:
        """Load a transformers causal LM directory (e.g. `grooves.models.ensure_model()`) in float32."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = str(Path(model_dir).expanduser())
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        return cls(
            model,
            AutoTokenizer.from_pretrained(path),
            model_dir=path,
            max_length=max_length,
            batch_size=batch_size,
        )

    @property
    def dim(self) -> int:
        return int(self.model.config.hidden_size)

    def render(self, pair: Pair) -> str:
        messages = [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]
        if getattr(self.tokenizer, "chat_template", None):
            return str(self.tokenizer.apply_chat_template(messages, tokenize=False))
        return f"{pair[0]}\n{pair[1]}"

    @torch.no_grad()
    def encode(self, pairs: Sequence[Pair]) -> torch.Tensor:
        chunks = []
        for start in range(0, len(pairs), self.batch_size):
            texts = [self.render(p) for p in pairs[start : start + self.batch_size]]
            batch = self.tokenizer(
                texts,
                return_tensors="pt",
                padding=True,
                truncation=True,
                max_length=self.max_length,
                add_special_tokens=False,
            )
            out = self.model(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                output_hidden_states=True,
            )
            hidden = out.hidden_states[-1].float()  # [B, T, H]
            mask = batch["attention_mask"].unsqueeze(-1).float()  # [B, T, 1]
            chunks.append((hidden * mask).sum(1) / mask.sum(1).clamp_min(1.0))  # [B, H]
        return torch.cat(chunks) if chunks else torch.zeros(0, self.dim)

    def spec(self) -> dict[str, Any]:
        if self.model_dir is None:
            raise ValueError(
                "this HiddenStateEncoder was built from an in-memory model; build it with "
                "HiddenStateEncoder.from_dir(path) so a saved reward model can find it again"
            )
        return {
            "kind": "hidden-states",
            "model_dir": self.model_dir,
            "max_length": self.max_length,
            "batch_size": self.batch_size,
        }


def encoder_from_spec(spec: dict[str, Any]) -> Encoder:
    """Rebuild an encoder from its `spec()`."""
    kind = spec.get("kind")
    if kind == "hashed-ngrams":
        return HashedNgramEncoder(
            dim=int(spec["dim"]), ngrams=tuple(spec["ngrams"]), use_input=bool(spec["use_input"])
        )
    if kind == "hidden-states":
        return HiddenStateEncoder.from_dir(
            spec["model_dir"], max_length=int(spec["max_length"]), batch_size=int(spec["batch_size"])
        )
    raise ValueError(f"unknown encoder kind {kind!r}; known: hashed-ngrams, hidden-states")
