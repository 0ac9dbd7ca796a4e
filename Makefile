# Targets named in the README. Each one sets up what it needs, so it works on a fresh clone.
PY ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup demo hn-demo test test-slow bench bench-trl gpu-bundle lint clean

$(BIN)/grooves: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,ray]'
	touch $(BIN)/grooves

setup: $(BIN)/grooves

demo: setup
	$(BIN)/grooves models fetch
	$(BIN)/grooves train examples/capitals.toml
	$(BIN)/grooves report runs/capitals

hn-demo: setup
	$(BIN)/grooves models fetch
	$(BIN)/python examples/hn_titles/run_demo.py

test: setup
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/python -m pytest -q

test-slow: setup
	$(BIN)/python -m pytest -q -m slow

bench: setup
	$(BIN)/grooves models fetch
	$(BIN)/python benchmarks/bench_generation.py
	$(BIN)/python benchmarks/bench_matmul_forms.py
	$(BIN)/python benchmarks/bench_batch_invariance.py
	$(BIN)/python benchmarks/bench_floor.py
	$(BIN)/python benchmarks/bench_env_reset.py --resets 1000
	$(BIN)/python benchmarks/bench_watch_fpr.py

bench-trl: setup
	bash benchmarks/setup_trl_env.sh
	$(BIN)/python benchmarks/bench_grpo_step.py --warmup 2 --steps 5 --json runs/bench_grpo_step.json

# .gpu/: what benchmarks/gpu.sh needs on a GPU machine without a package index (wheels, tokenizer)
gpu-bundle: setup
	$(BIN)/grooves models fetch
	bash benchmarks/gpu_bundle.sh

lint: setup
	$(BIN)/ruff check src tests benchmarks examples

clean:
	rm -rf $(VENV) build dist src/*.egg-info
