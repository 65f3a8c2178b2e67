# Two entry points on a fresh machine: `make run` (the main job) and `make test` (the test suite).
# Both create .venv. Without a CUDA GPU they install the CPU build of PyTorch (torch==2.13.0 on
# these machines) first, so nothing pulls CUDA wheels, and the Triton kernels run under
# TRITON_INTERPRET=1.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HAS_CUDA := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
CPU_TORCH := torch==2.13.0
CPU_TRITON := triton==3.6.0
OUT ?= results/figures
WHEELHOUSE ?= wheelhouse

ifeq ($(HAS_CUDA),yes)
TEST_ENV :=
else
TEST_ENV := TRITON_INTERPRET=1
endif

.PHONY: run test lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.torch: $(BIN)/python
ifeq ($(HAS_CUDA),yes)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q torch
else
	$(BIN)/python -m pip install -q $(CPU_TORCH) $(CPU_TRITON)
endif
	touch $@

$(VENV)/.installed: pyproject.toml $(VENV)/.torch
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml $(VENV)/.torch
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $@

run: $(VENV)/.installed
	$(BIN)/tfla-bench roofline --out $(OUT)

test: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(TEST_ENV) $(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV)
