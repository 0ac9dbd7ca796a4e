#!/usr/bin/env bash
# Creates benchmarks/.venv-trl: TRL's GRPOTrainer for the side-by-side step benchmark.
# TRL is a peer we measure against, not a dependency of grooves, so it gets its own virtualenv.
# torch is installed first with the same CPU build as grooves, and checked after every install:
# a resolver that swaps in another torch (a CUDA build) would make the comparison meaningless.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${TRL_VENV:-$here/.venv-trl}"
py="${PY:-python3.11}"

test -x "$venv/bin/python" || "$py" -m venv "$venv"
pip="$venv/bin/pip"
"$pip" install -q --upgrade pip
"$pip" install -q torch==2.13.0
# the same model stack as grooves (transformers, peft), so both sides run the same kernels
"$pip" install -q torch==2.13.0 trl==1.16.0 transformers==5.23.0 peft==0.21.2 \
    accelerate==1.16.0 datasets==5.2.0 safetensors==0.8.0 rich==15.0.0
torch_version="$("$venv/bin/python" -c 'import torch; print(torch.__version__)')"
if [[ "$torch_version" != "2.13.0+cpu" ]]; then
    echo "benchmarks/.venv-trl has torch $torch_version, expected 2.13.0+cpu; remove $venv and rerun" >&2
    exit 1
fi
"$venv/bin/python" -c 'import trl, peft, transformers; print("trl", trl.__version__, "peft", peft.__version__, "transformers", transformers.__version__)'
