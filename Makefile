# Everything the project needs, from nothing: `make demo` (README command one), `make test` (two).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch, from PyTorch's CPU index: PyPI's torch for Linux pulls the multi-GB CUDA
# stack, pinned or not. One retry: where that index cannot be reached, pip goes on without it.
TORCH := torch==2.13.0
TORCH_INDEX := --extra-index-url https://download.pytorch.org/whl/cpu --retries 1
# Every other package at the version the suite passed with (`make lock` refreshes it).
LOCK := constraints.txt

.PHONY: setup demo test test-fast lint bench clean llama-cpp lock

$(BIN)/anyspec: pyproject.toml $(LOCK)
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c $(LOCK) $(TORCH_INDEX) $(TORCH)
	$(BIN)/pip install -q -c $(LOCK) -e '.[dev,server,bench]'
	touch $@

setup: $(BIN)/anyspec

demo: setup
	$(BIN)/anyspec demo

test: setup
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/python -m pytest -q

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow"

bench: setup
	mkdir -p benchmarks/results
	$(BIN)/anyspec bench --json benchmarks/results/bench.json --markdown benchmarks/results/bench.md \
		--plot benchmarks/results/bench.png

# llama.cpp (from the pinned llama-cpp-python sdist) for side-by-side benchmarks, into anyspec's cache.
llama-cpp: setup
	PY=$(BIN)/python bash benchmarks/build_llama_cpp.sh "$$($(BIN)/python -c 'from anyspec.paths import cache_dir; print(cache_dir())')/llama.cpp"

# The newest releases pyproject.toml allows, in a scratch venv, written to $(LOCK); then run
# `make clean test` and commit $(LOCK) if it passes.
lock:
	rm -rf .venv-lock
	$(PY) -m venv .venv-lock
	.venv-lock/bin/pip install -q --upgrade pip
	.venv-lock/bin/pip install -q $(TORCH_INDEX) $(TORCH) '.[dev,server,bench]'
	{ sed -n '/^#/p' $(LOCK); .venv-lock/bin/pip freeze --exclude-editable | grep -iv '^anyspec' \
		| sed 's/+cpu$$//'; } > $(LOCK).new
	mv $(LOCK).new $(LOCK)
	rm -rf .venv-lock

lint: setup
	$(BIN)/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) .venv-lock build *.egg-info
