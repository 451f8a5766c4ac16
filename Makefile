# Everything the project needs, from nothing: `make demo` (README command one), `make test` (two).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch; an unpinned torch pulls a multi-GB CUDA build.
TORCH := torch==2.13.0

.PHONY: setup demo test test-fast lint bench clean llama-cpp

$(BIN)/anyspec: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[dev,server,bench]'
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

lint: setup
	$(BIN)/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) build *.egg-info
