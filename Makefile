# Two commands on a fresh machine: `make reproduce` and `make test` (both create/refresh .venv first).
PYTHON ?= python3
VENV ?= .venv
PROFILE ?= quick
# CPU machines: the pinned CPU build. On a GPU box with CUDA torch already installed, use
#   make VENV_FLAGS=--system-site-packages TORCH_SPEC=torch
TORCH_SPEC ?= torch==2.13.0
VENV_FLAGS ?=
BIN = $(VENV)/bin

.PHONY: setup reproduce test lab clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints/cpu.txt
	$(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -c constraints/cpu.txt -e ".[dev]"
	touch $@

reproduce: setup
	$(BIN)/hotpaths reproduce --profile $(PROFILE)

test: setup
	$(BIN)/python -m pytest -q

lab: setup
	$(BIN)/python -m pip install -q -c constraints/cpu.txt -e ".[lab]"
	$(BIN)/jupyter lab notebooks/

clean:
	rm -rf build scratch papermill_runs/.staging-*
