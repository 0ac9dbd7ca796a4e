#!/usr/bin/env bash
# The GRPO step benchmark on one GPU (an H200), in under 8 minutes: one table with grooves and TRL's
# GRPOTrainer per step on the same work, grooves' data-parallel path (2 ranks sharing the GPU, gloo),
# the FLOP floor of that GPU (the step's matmul FLOPs over the matmul rate measured there) and the
# peak GPU memory of each; bench_grpo_step.py makes it.
#
#   bash benchmarks/gpu_bundle.sh            # once, where PyPI is reachable: writes .gpu/
#   bash benchmarks/gpu.sh                   # on the GPU machine, with .gpu/ beside the checkout
#
# Environment (the first that applies):
#   .gpu/wheels present: the machine's own python3 (with its CUDA torch) plus those wheels, installed
#     offline into /tmp/grooves-site. Nothing is downloaded: such machines often reach no index.
#   READY_PY=/path/to/python: that python as it is (it already holds grooves' dependencies, e.g. the
#     CPU check here with .venv's python); nothing is installed, src/ goes on the path.
#   else: a virtualenv benchmarks/.venv-gpu with vLLM, made on first use: vllm 0.33.0 pins its own
#     CUDA torch 2.14.0 and needs transformers < 5.21 and fastapi < 0.137. Those lie inside grooves'
#     ranges (`pip install '.[vllm]'` resolves) but not in the CPU lock .venv is made from
#     (constraints/cpu.txt: torch 2.13.0+cpu, transformers 5.23.0, fastapi 0.163.2).
# Sampler: vLLM when it imports (grooves' `vllm` backend, TRL's colocated vLLM), else both sample
#   with transformers on the GPU; the table's title names the backend.
# Model: MODEL_DIR, else Qwen2.5-1.5B-Instruct from the Hugging Face cache, else the embedded
#   SmolLM2-135M if it is cached, else random weights in the Qwen2.5-1.5B architecture with
#   SmolLM2's tokenizer (benchmarks/random_model.py; SHAPE=smollm2-135m for the small one).
# TRL is skipped, with the reason, when it does not import (SKIP_TRL=1 skips it anyway); DP_RANKS=0
# leaves the data-parallel row out. BUDGET_S (default 470) is the limit for the whole script.
#
#   DEVICE=cpu DTYPE=float32 SHAPE=smollm2-135m STEPS=1 bash benchmarks/gpu.sh   # the same flow on a CPU
#   READY_PY=.venv/bin/python DEVICE=cpu DTYPE=float32 STEPS=1 bash benchmarks/gpu.sh   # on CPU, no bundle
set -euo pipefail
cd "$(dirname "$0")/.."
device="${DEVICE:-cuda}"
dtype="${DTYPE:-bfloat16}"
bundle="${BUNDLE:-.gpu}"
start=$SECONDS

if [[ "$device" == cuda* ]] && ! { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }; then
    echo "benchmarks/gpu.sh needs an NVIDIA GPU (nvidia-smi found none); on CPU run: make bench-trl" >&2
    exit 1
fi

# ---- the environment ----------------------------------------------------------------------------
if [[ -n "${READY_PY:-}" ]]; then
    python="$READY_PY"
    echo "== $python as it is: nothing installed"
    export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
elif [[ -d "$bundle/wheels" ]]; then
    python="${PY:-python3}"
    site="${SITE:-/tmp/grooves-site}"
    echo "== installing $(ls "$bundle"/wheels/*.whl | wc -l) wheels from $bundle/wheels into $site (offline)"
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$bundle"/wheels/*.whl
    export PYTHONPATH="$site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
else
    venv="${GPU_VENV:-benchmarks/.venv-gpu}"
    python="$venv/bin/python"
    if ! "$python" -c "import vllm, trl, grooves" >/dev/null 2>&1; then
        echo "== no $bundle/wheels: creating $venv (vllm, trl, grooves without its CPU pins; needs PyPI)"
        test -x "$python" || "${PY:-python3.11}" -m venv "$venv"
        "$venv/bin/pip" install -q --upgrade pip
        # grooves' dependencies at the CPU lock's versions, except the four vLLM constrains
        # (torch, transformers, fastapi, numpy)
        deps="$("$python" - <<'PY'
import re, tomllib
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
pins = [line.strip().split("==") for line in open("constraints/cpu.txt") if "==" in line and not line.startswith("#")]
lock = {norm(name): version for name, version in pins}
names = [norm(re.split(r"[=<>!~ ]", d)[0]) for d in deps]
print(" ".join(f"{n}=={lock[n]}" for n in names if n not in ("torch", "transformers", "fastapi", "numpy")))
PY
)"
        # shellcheck disable=SC2086
        "$venv/bin/pip" install -q vllm==0.33.0 trl==1.16.0 accelerate==1.16.0 datasets==5.2.0 \
            transformers==5.20.2 numpy==2.3.5 fastapi==0.136.3 $deps
        "$venv/bin/pip" install -q --no-deps -e .
    fi
fi
"$python" -c 'import torch, transformers, peft, grooves.trainer, grooves.server; print("torch", torch.__version__, "transformers", transformers.__version__, "peft", peft.__version__, "cuda", torch.cuda.is_available())'

backend=transformers
trl_flags=()
if "$python" -c "import vllm" >/dev/null 2>&1; then
    backend=vllm
    if [[ "${TRL_VLLM:-1}" == "1" ]]; then trl_flags+=(--trl-use-vllm); fi
else
    echo "== vLLM does not import here: grooves and TRL both sample with transformers on $device"
fi
if [[ "${SKIP_TRL:-0}" == "1" ]]; then
    trl_flags=(--skip-trl)
elif ! why="$("$python" -c "import trl, datasets" 2>&1)"; then
    echo "== TRL does not import, so the table has grooves and the floor only: $(tail -n 1 <<<"$why")"
    trl_flags=(--skip-trl)
fi

# ---- the model ----------------------------------------------------------------------------------
model="${MODEL_DIR:-}"
if [[ -z "$model" ]]; then
    hub="${HF_HOME:-$HOME/.cache/huggingface}/hub/models--Qwen--Qwen2.5-1.5B-Instruct/snapshots"
    snapshot="$(ls -d "$hub"/*/ 2>/dev/null | head -n 1 || true)"
    smol="$("$python" -c 'from grooves.models import ALIASES, DEFAULT_MODEL, grooves_home; print(grooves_home() / "models" / ALIASES[DEFAULT_MODEL]["dir_name"])')"
    if [[ -n "$snapshot" && -f "$snapshot/config.json" ]]; then
        model="${snapshot%/}"
    elif [[ -z "${SHAPE:-}" && -f "$smol/manifest.json" ]]; then
        model="$smol"
    else
        shape="${SHAPE:-qwen2.5-1.5b}"
        model="/tmp/grooves-random-$shape"
        echo "== no trained weights on disk: random weights in the $shape architecture ($model)"
        test -f "$model/random_weights.json" || "$python" benchmarks/random_model.py --shape "$shape" \
            --tokenizer "$bundle/tokenizer" --out "$model" --dtype "$dtype" --device "$device" >/dev/null
    fi
fi
echo "== model: $model ($((SECONDS - start)) s so far)"

# the whole script stays under 8 minutes (BUDGET_S: another limit, e.g. on a loaded CPU)
budget=$((${BUDGET_S:-470} - (SECONDS - start)))
status=0
timeout "$budget" "$python" benchmarks/bench_grpo_step.py \
    --model "$model" --device "$device" --dtype "$dtype" --backend "$backend" "${trl_flags[@]}" \
    --trl-python "$python" --warmup "${WARMUP:-1}" --steps "${STEPS:-3}" --dp-ranks "${DP_RANKS:-2}" \
    --json "${JSON:-runs/bench_grpo_step_gpu.json}" || status=$?
if [[ "$status" == 124 ]]; then
    echo "== stopped at the time limit (${BUDGET_S:-470} s for the whole script) before the table" >&2
fi
if [[ "$status" != 0 ]]; then exit "$status"; fi
echo "== done in $((SECONDS - start)) s"
