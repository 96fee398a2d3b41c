# corepin: the targets the README tells people to run.
#   make demo   set up .venv; show this machine's topology, pin an exclusive run beside shared ones, report
#   make demo-k8s  the Kubernetes mode on a stand-in cluster on this machine (root; Ctrl-C cleans up)
#   make test   set up .venv with the dev tools, lint, type-check, check layers, run every test
# Other targets: venv, check, bench, docs, man, completion, clean.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_DIR ?= build
FIXTURES ?= ../shared/fixtures/sysfs
PYTEST_ARGS ?=

.PHONY: all venv dev demo demo-k8s test check pytest bench docs man completion clean

all: test

# ---------------------------------------------------------------- virtual environments
$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
	  { echo "corepin needs Python >= 3.11 (found: $$($(PYTHON) --version 2>&1))" >&2; exit 1; }
	@$(PYTHON) -c 'import ensurepip' 2>/dev/null || \
	  { echo "Python's venv module is missing: sudo apt-get install -y python3-venv" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Bytecode is compiled once here: corepin is on the hot path of `corepin run`, and an environment
# with PYTHONDONTWRITEBYTECODE would otherwise recompile every module on every start.
# setup.py generates the gRPC modules from proto/ on every install (editable: under src/).
PROTOS := $(wildcard proto/corepin/v1alpha1/*.proto proto/nri/*.proto proto/podresources/*.proto)
# (a missing generated package - after `git clean`, say - also means: install again)
GENERATED := src/corepin/api/grpc/gen/__init__.py src/corepin/nri/gen/__init__.py \
  src/corepin/kube/gen/__init__.py
$(GENERATED):

$(VENV)/.installed: $(BIN)/python pyproject.toml setup.py $(PROTOS) $(GENERATED)
	$(BIN)/python -m pip install --quiet -e .
	$(BIN)/python -m compileall -q src
	@touch $@

$(VENV)/.installed-dev: $(BIN)/python pyproject.toml setup.py $(PROTOS) $(GENERATED)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -m compileall -q src
	@touch $@ $(VENV)/.installed

venv: $(VENV)/.installed

dev: $(VENV)/.installed-dev

# ---------------------------------------------------------------- the main job
demo: venv
	COREPIN=$(BIN)/corepin DEMO_DIR=$(DEMO_DIR) sh scripts/demo.sh

# A development stand-in cluster (fake API server, stand-in kubelet with real processes in
# scratch cgroups, the real agents, controller, scheduler and webhook): needs root for the
# cgroups (sudo when not root), the dev tools for the webhook's certificate (cryptography).
# DEMO_K8S_ARGS=--once runs it through and stops.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
DEMO_K8S_ARGS ?=
demo-k8s: dev
	$(SUDO) $(BIN)/corepin dev cluster $(DEMO_K8S_ARGS)

# ---------------------------------------------------------------- tests
check: dev
	$(BIN)/ruff check src tests benchmarks setup.py
	$(BIN)/mypy
	$(BIN)/lint-imports

# The guest tests (marker vm) run beside the rest unless PYTEST_ARGS picks tests; pytest's
# exit 5 (no tests collected) is a failure here, not a pass (scripts/run-tests.sh).
pytest: dev
	@PYTEST=$(BIN)/pytest sh scripts/run-tests.sh $(PYTEST_ARGS)

test: check pytest

# ---------------------------------------------------------------- extras
bench: dev
	@set -e; ran=0; for f in benchmarks/[!_]*.py; do \
	  [ -e "$$f" ] || continue; echo "== $$f"; $(BIN)/python "$$f"; ran=1; done; \
	  [ $$ran -eq 1 ] || echo "no benchmarks yet"

# The pictures in docs/ are drawn from the real-machine sysfs fixtures (../shared/fixtures).
docs: venv
	$(BIN)/corepin topology --sysfs-root $(FIXTURES)/intel-2s-8c-ht-32cpu -o svg \
	  --out docs/topology-intel-2s-ht.svg
	$(BIN)/corepin topology --sysfs-root $(FIXTURES)/amd-2s-epyc7451-naples-16l3 -o svg \
	  --out docs/topology-amd-epyc-16l3.svg

# The man page and bash completion are generated from corepin's own argparse parser.
man: venv
	$(BIN)/python scripts/gen_man.py build/man/man1/corepin.1

completion: venv
	$(BIN)/python scripts/gen_completion.py build/completion/corepin

clean:
	rm -rf $(VENV) $(DEMO_DIR) .corepin-demo dist .pytest_cache .mypy_cache .ruff_cache .hypothesis \
	  .import_linter_cache src/*.egg-info src/corepin/api/grpc/gen src/corepin/nri/gen \
	  src/corepin/kube/gen
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
