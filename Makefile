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
# Triton 3.6's CPU interpreter calls int() on 1-element arrays (runtime loop bounds), which NumPy >= 2.3
# rejects; the interpreter is how the kernels are tested without a GPU.
CPU_NUMPY := "numpy<2.3"
OUT ?= results/figures
WHEELHOUSE ?= wheelhouse
# Target of `make wheelhouse`: the GPU node's Python version and platform tag.
PYTHON_VERSION ?= 3.12
PLATFORM ?= manylinux_2_28_x86_64
# Wheels the baselines and the peer need besides the node's own torch/triton/numpy/matplotlib, and
# setuptools/wheel so `pip install -e .` can build there without an index. No dependencies are
# resolved: lightning-attn and mlstm-kernels would pull torch, mamba-ssm tilelang and transformers.
WHEELHOUSE_WHEELS := fla-core==0.6.0 lightning-attn==0.0.5 mlstm-kernels==2.0.6 einops PyYAML packaging \
	"setuptools>=77" wheel
MAMBA_SSM := mamba-ssm==2.3.2.post1

ifeq ($(HAS_CUDA),yes)
TEST_ENV :=
else
TEST_ENV := TRITON_INTERPRET=1
endif

.PHONY: run test lint clean wheelhouse

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.torch: $(BIN)/python
ifeq ($(HAS_CUDA),yes)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q torch
else
	$(BIN)/python -m pip install -q $(CPU_TORCH) $(CPU_TRITON) $(CPU_NUMPY)
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

# Every wheel a GPU node without internet needs for the baselines (README: "Installing the
# baselines offline"). mamba-ssm is source-only: its wheel is built here with the CUDA extension
# skipped (pure Python; its setup.py imports torch, wheel and packaging: built in the venv).
wheelhouse: $(VENV)/.torch
	mkdir -p $(WHEELHOUSE)
	$(BIN)/python -m pip download --no-deps --only-binary=:all: --python-version $(PYTHON_VERSION) \
		--platform $(PLATFORM) --dest $(WHEELHOUSE) $(WHEELHOUSE_WHEELS)
	$(BIN)/python -m pip install -q setuptools wheel packaging
	MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE $(BIN)/python -m pip wheel --no-deps \
		--no-build-isolation --wheel-dir $(WHEELHOUSE) $(MAMBA_SSM)
