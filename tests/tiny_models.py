"""Tiny real models for tests and examples: a random Llama with a byte-level BPE tokenizer.

Built from a config in seconds, saved as a normal Hugging Face directory, so every code path
(loading, chat template, LoRA, serving) runs exactly as with a real checkpoint. The chat
template is SmolLM2's, so the tool-call format and the masks match the embedded default.
"""

from __future__ import annotations

from pathlib import Path

SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "You are a helpful assistant. Answer the question.",
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>',
    '<tools>[{"type": "function", "function": {"name": "lookup"}}]</tools>',
    "system user assistant tool 0 1 2 3 4 5 6 7 8 9 yes no hello world title story",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ {}[]():;,.!?\"'-_/=+*<>|@#$%&",
]


def build_tiny_tokenizer(vocab_size: int = 512):
    """A byte-level BPE tokenizer with SmolLM2's special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
    )
    fast.chat_template = SMOLLM2_CHAT_TEMPLATE
    return fast


def build_tiny_model_dir(
    path: str | Path,
    *,
    seed: int = 0,
    hidden_size: int = 32,
    layers: int = 2,
    init_std: float = 0.02,
    architecture: str = "llama",
) -> Path:
    """Write a tiny random Llama (or, with `architecture="qwen2"`, Qwen2: biased q/k/v) + tokenizer to `path`.

    `init_std` 0.02 (the usual init) gives a near-uniform next-token distribution; about 0.2 gives a
    peaked, input-dependent one, which RL tests need to show learning within a few steps.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    architectures = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}
    if architecture not in architectures:
        raise ValueError(f"architecture {architecture!r}: use one of {sorted(architectures)}")
    config_class, model_class = architectures[architecture]
    path = Path(path)
    tok = build_tiny_tokenizer()
    config = config_class(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden_size // 4,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        initializer_range=init_std,
    )
    torch.manual_seed(seed)
    model = model_class(config)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def lora_policy(model_dir, targets=None, **kwargs):
    """A `TransformersPolicy` on `model_dir` with a rank-4 LoRA adapter (on `targets`, default all
    seven projections) whose B is drawn nonzero (peft starts it at zero, where the adapter would
    change nothing), the same adapter each call."""
    import torch

    from grooves.config import LoraConfig
    from grooves.policy.transformers import TransformersPolicy

    lora = (
        LoraConfig(rank=4, alpha=8)
        if targets is None
        else LoraConfig(rank=4, alpha=8, target_modules=targets)
    )
    torch.manual_seed(0)  # peft draws lora_A from torch's global generator
    policy = TransformersPolicy(str(model_dir), lora=lora, seed=0, **kwargs)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return policy


def teach_answer(policy, messages, tools, answer: str, *, steps: int = 400) -> None:
    """Train `policy`'s tiny model until its greedy answer to `messages` (with `tools`) is exactly
    `answer` and end-of-turn; fails if it has not learned it in `steps` Adam steps."""
    import torch

    tok = policy.tokenizer
    prompt = policy.prompts.render(messages, tools)
    target = tok(answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    ids = torch.tensor([prompt + target])  # [1, P+T]
    labels = ids.clone()
    labels[0, : len(prompt)] = -100  # learn the answer only
    model = policy.model
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        out = model(input_ids=ids, labels=labels)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        hits = out.logits[0, len(prompt) - 1 : -1].argmax(-1) == ids[0, len(prompt) :]
        if bool(hits.all()) and out.loss.item() < 0.05:
            break
    model.eval()
    assert bool(hits.all()), f"the tiny model did not learn to answer {answer!r}"
