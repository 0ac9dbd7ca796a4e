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


def test_an_adapter_naming_its_base_by_hub_id_saves_again_without_asking_the_hub(
    tiny_model_dir, tmp_path, monkeypatch
):
    """An RL run from an SFT adapter saves a checkpoint every step; offline, none may ask the Hub."""
    import json

    import peft.utils.other as peft_other

    asked = []

    def offline(repo_id, filename, **kwargs):
        asked.append((repo_id, filename))
        raise ConnectionError("no network")

    monkeypatch.setattr(peft_other, "file_exists", offline)
    model, _ = load_model(str(tiny_model_dir), lora=LoraConfig(rank=2, alpha=4))
    model.save_pretrained(tmp_path / "sft")
    saved = json.loads((tmp_path / "sft" / "adapter_config.json").read_text())
    saved["base_model_name_or_path"] = (
        "HuggingFaceTB/SmolLM2-135M-Instruct"  # as record_adapter_base names it
    )
    (tmp_path / "sft" / "adapter_config.json").write_text(json.dumps(saved))

    model, _ = load_model(
        str(tiny_model_dir), lora=LoraConfig(rank=2, alpha=4), adapter_path=tmp_path / "sft"
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.save_pretrained(tmp_path / "rl")
    assert asked == []
    assert [str(w.message) for w in caught if "Unable to fetch" in str(w.message)] == []
    again = json.loads((tmp_path / "rl" / "adapter_config.json").read_text())
    assert again["base_model_name_or_path"] == str(tiny_model_dir)
