"""How far rounding the base weights moves SmolLM2-135M's next-token distribution.

KL(float32 || variant) of the next token after each of 16 `capitals` training prompts (chat
template, left-padded batch), mean over the prompts, for: fbgemm's dynamic int8 linear
(`torch.ao.quantization.quantize_dynamic`, int8 weights and int8 activations with one scale per
batch), int8 weight-only with one scale per output row (`kernels.quantize_rows`, what
`model.sampler_precision = "int8"` stores), and bfloat16 weights. Only the weights of the linear
layers (and the untied output head) are rounded, in float32 arithmetic: the samplers' own
rounding of the activations to bfloat16 is not included.

    python benchmarks/bench_sampler_kl.py
"""

from __future__ import annotations

import copy
import json

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grooves.models import ensure_model
from grooves.policy.fast.kernels import quantize_rows
from grooves.tasks.capitals import CapitalsTask


def main() -> None:
    path = str(ensure_model())
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    texts = [
        tok.apply_chat_template(
            [{"role": "user", "content": f"What is the capital of {s['country']}?"}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for s in CapitalsTask().scenarios("train")[:16]
    ]
    batch = tok(texts, return_tensors="pt", padding=True)

    def next_token_logprobs(m) -> torch.Tensor:
        with torch.no_grad():
            return torch.log_softmax(m(**batch).logits[:, -1].float(), -1)  # [prompts, vocab]

    ref = next_token_logprobs(model)

    def kl(lp: torch.Tensor) -> float:
        return float((ref.exp() * (ref - lp)).sum(-1).mean())

    def rounded(round_weight) -> torch.nn.Module:
        m = copy.deepcopy(model)
        m.lm_head.weight = torch.nn.Parameter(m.lm_head.weight.detach().clone())  # the lookup stays float32
        with torch.no_grad():
            for layer in m.modules():
                if isinstance(layer, torch.nn.Linear):
                    layer.weight.copy_(round_weight(layer.weight))
        return m

    def int8_rows(w: torch.Tensor) -> torch.Tensor:
        q, scale = quantize_rows(w)
        return q.float() * scale[:, None]

    dynamic = torch.ao.quantization.quantize_dynamic(
        copy.deepcopy(model), {torch.nn.Linear}, dtype=torch.qint8
    )
    out = {
        "prompts": len(texts),
        "fbgemm_dynamic_int8": kl(next_token_logprobs(dynamic)),
        "int8_weight_only_per_row": kl(next_token_logprobs(rounded(int8_rows))),
        "bfloat16_weights": kl(next_token_logprobs(rounded(lambda w: w.bfloat16().float()))),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
