"""Loading a model with peft prints no warning meant for peft's maintainers."""

from __future__ import annotations

import warnings

from grooves.config import LoraConfig
from grooves.policy.transformers import load_model


def test_wrapping_with_peft_raises_no_future_warning(tiny_model_dir, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # transformers' is_gradient_checkpointing deprecation
        model, _ = load_model(str(tiny_model_dir), lora=LoraConfig(rank=2, alpha=4))
        model.save_pretrained(tmp_path / "adapter")
        load_model(str(tiny_model_dir), adapter_path=tmp_path / "adapter")
