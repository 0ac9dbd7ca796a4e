#!/usr/bin/env bash
# The GRPO step benchmark on one GPU (an H200): grooves with the vLLM backend next to TRL's
# GRPOTrainer (sampling with vLLM too, colocated), the same table as bench_grpo_step.py.
#
#   bash benchmarks/gpu.sh                 # Qwen2.5-1.5B-Instruct if its weights are on disk, else SmolLM2-135M
#   MODEL_DIR=/path/to/model bash benchmarks/gpu.sh
#   TRL_VLLM=0 bash benchmarks/gpu.sh      # TRL samples with transformers' generate instead
#
# vLLM pins its own CUDA torch, transformers and fastapi (vllm 0.33.0: torch 2.14.0, transformers
# < 5.21, fastapi < 0.137), which cannot share an environment with grooves' pins, so everything GPU lives in its own
# virtualenv, benchmarks/.venv-gpu (GPU_VENV to change), made on first use. Budget: the install is
# skipped when the venv exists; model load + CUDA graphs ~1-2 min each; 1 warm-up + 3 steps.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "benchmarks/gpu.sh needs an NVIDIA GPU (nvidia-smi found none); on CPU run: make bench-trl" >&2
    exit 1
fi

venv="${GPU_VENV:-benchmarks/.venv-gpu}"
py="${PY:-python3.11}"
if ! "$venv/bin/python" -c "import vllm, trl, grooves" >/dev/null 2>&1; then
    echo "== creating $venv (vllm, trl, grooves without its CPU pins)"
    test -x "$venv/bin/python" || "$py" -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
    # grooves' own pins, except the four vLLM constrains: torch, transformers, fastapi and numpy get
    # the versions pip resolves next to vllm 0.33.0 (grooves' tests pass with them on CPU)
    deps="$("$venv/bin/python" - <<'PY'
import re, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
print(" ".join(d for d in deps if re.split(r"[=<>!~ ]", d)[0] not in ("torch", "transformers", "fastapi", "numpy")))
PY
)"
    # shellcheck disable=SC2086
    "$venv/bin/pip" install -q vllm==0.33.0 trl==1.16.0 accelerate==1.16.0 datasets==5.2.0 \
        transformers==5.20.2 numpy==2.3.5 fastapi==0.136.3 $deps
    "$venv/bin/pip" install -q --no-deps -e .
fi
"$venv/bin/python" -c 'import torch, vllm, transformers; print("torch", torch.__version__, "vllm", vllm.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())'

model="${MODEL_DIR:-}"
if [[ -z "$model" ]]; then
    hub="${HF_HOME:-$HOME/.cache/huggingface}/hub/models--Qwen--Qwen2.5-1.5B-Instruct/snapshots"
    snapshot="$(ls -d "$hub"/*/ 2>/dev/null | head -n 1 || true)"
    if [[ -n "$snapshot" && -f "$snapshot/config.json" ]]; then
        model="${snapshot%/}"
    else
        echo "== Qwen2.5-1.5B-Instruct is not on disk ($hub); using the embedded SmolLM2-135M"
        model="$("$venv/bin/python" -c 'from grooves.models import ensure_model; print(ensure_model())')"
    fi
fi
echo "== model: $model"

trl_flag=()
if [[ "${TRL_VLLM:-1}" == "1" ]]; then trl_flag=(--trl-use-vllm); fi
timeout 420 "$venv/bin/python" benchmarks/bench_grpo_step.py \
    --model "$model" --device cuda --dtype bfloat16 --backend vllm "${trl_flag[@]}" \
    --trl-python "$venv/bin/python" --warmup 1 --steps 3 --json runs/bench_grpo_step_gpu.json
