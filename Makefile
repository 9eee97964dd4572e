# Two commands on a fresh machine: `make reproduce` and `make test` (both create/refresh .venv first).
# `make lab` opens the notebooks in JupyterLab (headless: it prints the URL to open).
PYTHON ?= python3
VENV ?= .venv
PROFILE ?= quick
# CPU machines get the pinned CPU build of torch: on Linux x86-64 PyPI's torch wheel bundles CUDA (GBs), so torch
# comes from PyTorch's CPU index there. On a GPU box with CUDA torch already installed (docs/gpu.md):
#   make VENV_FLAGS=--system-site-packages TORCH_SPEC=torch
# (overriding TORCH_SPEC drops the CPU index; TORCH_INDEX= drops it too).
ifeq ($(origin TORCH_SPEC),undefined)
TORCH_SPEC := torch==2.13.0
ifeq ($(shell uname -s)-$(shell uname -m),Linux-x86_64)
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
endif
endif
TORCH_INDEX ?=
VENV_FLAGS ?=
BIN = $(VENV)/bin
# JupyterLab: loopback only (reach it from elsewhere through `ssh -L 8888:127.0.0.1:8888 host`); root needs
# --allow-root (containers, cloud GPU boxes)
LAB_IP ?= 127.0.0.1
LAB_PORT ?= 8888
RUN_UID ?= $(shell id -u)
LAB_FLAGS = --no-browser --ip=$(LAB_IP) --port=$(LAB_PORT) $(if $(filter 0,$(RUN_UID)),--allow-root)

.PHONY: setup reproduce test lab clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints/cpu.txt Makefile
	$(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(BIN)/python -m pip install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -c constraints/cpu.txt -e ".[dev,lab,lint]"
	touch $@

reproduce: setup
	$(BIN)/hotpaths reproduce --profile $(PROFILE)

test: setup
	$(BIN)/python -m pytest -q

lab: setup
	@echo "JupyterLab on http://$(LAB_IP):$(LAB_PORT)/lab: open the URL with the token that it prints below (Ctrl-C stops it)"
	$(BIN)/jupyter lab $(LAB_FLAGS) --ServerApp.root_dir=notebooks

# conda users: environment.yml carries the same pins as constraints/cpu.txt
environment.yml: constraints/cpu.txt constraints/environment_yml.py
	$(PYTHON) constraints/environment_yml.py > $@

clean:
	rm -rf build scratch papermill_runs/.staging-*
