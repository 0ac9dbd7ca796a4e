"""The adapters inside a transformers policy's peft model: its own, and extra ones served beside it.

The own adapter (peft's `default`: the one training updates, or the one the policy was started
with) has a version, the number of optimizer steps behind its weights; the trainer bumps it
after each step and every sampled turn records it. Extra adapters (multi-LoRA serving) are loaded
frozen under their own names; a sampling batch runs on one of them inside `scope(name)`.

Loading the first extra adapter into a policy that has no adapter of its own wraps the base
model in a `PeftModel` (in place: the base weights stay shared), so `model` is held here and may
change; everything else reads it from here.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

from grooves.models import check_adapter_base


@contextlib.contextmanager
def peft_wrapping() -> Iterator[None]:
    """Around a peft wrap (`get_peft_model`, `PeftModel.from_pretrained`): peft reads the model's
    `is_gradient_checkpointing`, which transformers 5 deprecates with a FutureWarning on every read.
    The read is peft's, not ours, and the warning asks nothing of a grooves user, so exactly that
    warning is ignored here, and only for the wrap."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
        )
        yield


@contextlib.contextmanager
def keep_requires_grad(model) -> Iterator[None]:
    """Inside, peft may load, switch or delete adapters (its load/set/delete_adapter mark the active
    adapter's weights trainable); after, every parameter that was there has its `requires_grad` back."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        yield
    finally:
        for p, flag in flags:  # parameters added meanwhile keep their own (frozen) setting
            p.requires_grad_(flag)


class PeftAdapters:
    """A peft model, its own adapter's version, and the extra adapters loaded into it."""

    def __init__(self, model, lock: threading.RLock):
        self.model = model
        self.lock = lock
        self.own = hasattr(model, "peft_config")
        """The policy's own weights include an adapter (peft's `default`); else they are the base alone."""
        self.version = 0

    def bump(self) -> int:
        """Called by the trainer after each optimizer step: the adapter now live is this version."""
        self.version += 1
        return self.version

    def load(self, path: str | Path, name: str) -> None:
        """Load a saved peft adapter beside the policy's own weights, frozen, under `name`."""
        from peft import PeftModel

        if not (Path(path) / "adapter_config.json").is_file():
            raise ValueError(
                f"{path}: no adapter_config.json; pass a folder saved by peft (e.g. checkpoints/step_N/adapter)"
            )
        base = getattr(self.model, "name_or_path", None)  # the folder the base weights came from
        if base:
            check_adapter_base(path, base)  # another base's weights: a warning, see grooves.models
        with self.lock, self.keep_requires_grad(), peft_wrapping():
            try:
                if hasattr(self.model, "peft_config"):
                    self.model.load_adapter(str(path), adapter_name=name, is_trainable=False)
                else:  # the first adapter wraps the base model (in place: the base weights stay shared)
                    self.model = PeftModel.from_pretrained(
                        self.model, str(path), adapter_name=name, is_trainable=False
                    )
            except Exception:  # e.g. shapes of another base model: leave no half-loaded adapter behind
                if name in self.loaded():
                    self.unload(name)
                raise
            self.model.eval()

    def unload(self, name: str) -> None:
        """Free an adapter loaded with `load`."""
        with self.lock, self.keep_requires_grad():
            others = [n for n in self.loaded() if n != name]
            if self.model.active_adapter == name and others:
                self.model.set_adapter(others[0])  # peft would warn that the active adapter is gone
            self.model.delete_adapter(name)
            if not self.own and not self.model.peft_config:
                self.model = self.model.unload()  # back to the plain base model

    def loaded(self) -> list[str]:
        return list(getattr(self.model, "peft_config", {}))

    def keep_requires_grad(self) -> contextlib.AbstractContextManager[None]:
        """peft's load/set/delete_adapter reset which adapter trains; the training adapter must keep training."""
        return keep_requires_grad(self.model)

    @contextlib.contextmanager
    def scope(self, adapter: str | None) -> Iterator[None]:
        """Sample with `adapter` (or the policy's own weights), then restore the active adapter."""
        if adapter is None:
            if self.own or not hasattr(self.model, "peft_config"):
                yield
            else:
                with self.model.disable_adapter():
                    yield
            return
        if adapter not in self.loaded():
            raise ValueError(f"adapter {adapter!r} is not loaded; loaded: {self.loaded()}")
        previous = self.model.active_adapter
        with self.keep_requires_grad():
            self.model.set_adapter(adapter)
        try:
            yield
        finally:
            with self.keep_requires_grad():
                self.model.set_adapter(previous)
