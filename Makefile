# Two entry points on a fresh machine: `make run` (the main job) and `make test` (the test suite).
# Both create .venv. Without a CUDA GPU they install the CPU build of PyTorch (torch==2.13.0, from
# PyTorch's CPU index where it can be reached) first, so that nothing pulls CUDA wheels, and the
# Triton kernels run under TRITON_INTERPRET=1.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HAS_CUDA := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
CPU_TORCH := torch==2.13.0
# PyTorch's own index of CPU builds: on PyPI, torch for Linux x86_64 is the CUDA build (several GB).
# Where this index cannot be reached (a machine with a local PyPI mirror only), pip takes $(CPU_TORCH)
# from the configured index, and says so first.
CPU_TORCH_INDEX := https://download.pytorch.org/whl/cpu
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
WHEELHOUSE_WHEELS := fla-core==0.6.0 lightning-attn==0.0.5 mlstm-kernels==2.0.6 einops PyYAML packaging nvidia-ml-py \
	"setuptools>=77" wheel
MAMBA_SSM := mamba-ssm==2.3.2.post1
# FlashAttention 4 (`flash_attn.cute`) and its CUTLASS DSL, whose CUDA library wheel follows the node's CUDA major.
CUDA_MAJOR ?= 13
FA4_WHEELS := flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 \
	nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu$(CUDA_MAJOR)==4.8.1 quack-kernels==0.6.5 \
	apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5
# Source-only CUDA packages: `make wheelhouse` downloads their sdists, `make cuda-wheels` builds them on a GPU node.
CUDA_SDISTS := causal-conv1d==1.7.0 $(MAMBA_SSM) flash-attn==2.8.3.post2
CUDA_WHEELS ?= causal-conv1d mamba-ssm flash-attn fa3
FLASH_ATTN_SRC ?=

# setuptools' editable build warns about folders named like the package, which package-dir maps on purpose.
QUIET_BUILD := PYTHONWARNINGS="ignore:Editable installation"

ifeq ($(HAS_CUDA),yes)
TEST_ENV :=
else
TEST_ENV := TRITON_INTERPRET=1
endif

.PHONY: run test test-quick test-slow test-slurm test-browser lint clean wheelhouse cuda-wheels gpu paper kernel-cache

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.torch: $(BIN)/python
ifeq ($(HAS_CUDA),yes)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q torch
else
	@if $(BIN)/python -c "import urllib.request as u; u.urlopen('$(CPU_TORCH_INDEX)/torch/', timeout=5)" 2>/dev/null; \
	then \
		echo "installing the CPU build of $(CPU_TORCH) from $(CPU_TORCH_INDEX)"; \
		$(BIN)/python -m pip install -q --index-url $(CPU_TORCH_INDEX) "$(CPU_TORCH)+cpu"; \
	else \
		echo "$(CPU_TORCH_INDEX) cannot be reached: installing $(CPU_TORCH) from pip's configured index" \
			"(a CPU build where it holds one, as a local mirror may; from plain PyPI on Linux, the CUDA build)"; \
	fi
	$(BIN)/python -m pip install -q $(CPU_TORCH) $(CPU_TRITON) $(CPU_NUMPY)
endif
	touch $@

$(VENV)/.installed: pyproject.toml $(VENV)/.torch
	$(QUIET_BUILD) $(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml $(VENV)/.torch
	$(QUIET_BUILD) $(BIN)/python -m pip install -q -e ".[test]"
	touch $@

run: $(VENV)/.installed
	$(BIN)/tfla-bench roofline --out $(OUT)

test: $(VENV)/.installed-test
	@echo "make test: ruff, then pytest, about 6 minutes on 2 CPU cores (make test-quick: about a minute)"
	$(BIN)/ruff check .
	$(TEST_ENV) $(BIN)/python -m pytest -q -m "not slurm and not slow and not browser"

# The edit-test loop: the analysis, tables, figures, specs, registry and docs, about a minute on 2 CPU
# cores; no sweep, no worker process and no kernel in the interpreter. `make test` runs them all.
QUICK_TESTS := $(addprefix tests/test_,architecture cli_main cli_model cli_paths committed_runs compare \
	compare_gpus console diff docs families figures gpustate model_counts model_roofline plots_runs \
	published registry report roofs specs)
test-quick: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(TEST_ENV) $(BIN)/python -m pytest -q -m "not slurm and not slow" $(addsuffix .py,$(QUICK_TESTS))

# The tests marked slow (fault injection into real sweeps, jobs killed and requeued, the interpreted
# kernels at 16-wide tiles): a minute or more each on 2 CPU cores. CI runs them after `make test`.
test-slow: $(VENV)/.installed-test
	$(TEST_ENV) $(BIN)/python -m pytest -q -m "slow and not slurm"

# $(call debian_packages,TARGET,PACKAGES): install the Debian packages that are missing, as root with
# apt-get (policy-rc.d keeps their services from starting system-wide); without root or apt-get, say
# which are missing and go on, so the tests skip and say why.
define debian_packages
missing=$$(for p in $(2); do \
	dpkg-query -W -f='$${db:Status-Status}' $$p 2>/dev/null | grep -qx installed || echo $$p; done); \
if [ -n "$$missing" ]; then \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		guard=; if [ ! -e /usr/sbin/policy-rc.d ]; then \
			printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && guard=1; fi; \
		echo "$(1): installing" $$missing; \
		DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
		status=$$?; [ -z "$$guard" ] || rm -f /usr/sbin/policy-rc.d; [ $$status = 0 ] || exit $$status; \
	else \
		echo "$(1): not installed:" $$missing "(and no root apt-get here)"; \
	fi; \
fi
endef

# Sweeps through a real Slurm: one node on localhost, started and stopped by the tests
# (tests/slurm_daemons.py), once without accounting, once with slurmdbd over MariaDB, and once with
# accounting and Slurm's own timeouts and requeue hold (slurmctld stopped and started mid-sweep). Debian's
# packages are installed when missing (root); policy-rc.d keeps their services from starting system-wide.
# Without root or apt-get the tests skip, saying why; SLURM_REQUIRED=1 (CI) makes that a failure.
SLURM_PACKAGES := slurm-wlm munge slurmdbd mariadb-server
SLURM_REQUIRED ?=
test-slurm: $(VENV)/.installed-test
	@$(call debian_packages,$@,$(SLURM_PACKAGES))
	TFLA_BENCH_SLURM_REQUIRED=$(SLURM_REQUIRED) timeout -k 30 900 $(BIN)/python -m pytest -q -rs -m slurm tests/test_slurm.py

# The site (`tfla-bench site`) in a real headless Chromium, driven by selenium through chromedriver:
# Debian's packages are installed when missing (root; policy-rc.d keeps any service from starting).
# Without root or apt-get the tests skip, saying why; BROWSER_REQUIRED=1 (CI) makes that a failure.
BROWSER_PACKAGES := chromium chromium-driver
BROWSER_REQUIRED ?=
test-browser: $(VENV)/.installed-test
	@$(call debian_packages,$@,$(BROWSER_PACKAGES))
	TFLA_BENCH_BROWSER_REQUIRED=$(BROWSER_REQUIRED) timeout -k 30 600 $(BIN)/python -m pytest -q -rs -m browser tests/test_site_browser.py

clean:
	rm -rf $(VENV)

# Every wheel a GPU node without internet needs for the baselines (docs/install.md: "Installing the
# baselines offline"). mamba-ssm is source-only: its wheel is built here with the CUDA extension
# skipped (pure Python; its setup.py imports torch, wheel and packaging: built in the venv).
wheelhouse: $(VENV)/.torch
	mkdir -p $(WHEELHOUSE)
	$(BIN)/python -m pip download --no-deps --only-binary=:all: --python-version $(PYTHON_VERSION) \
		--platform $(PLATFORM) --dest $(WHEELHOUSE) $(WHEELHOUSE_WHEELS)
	$(BIN)/python -m pip install -q setuptools wheel packaging
	MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE $(BIN)/python -m pip wheel --no-deps \
		--no-build-isolation --wheel-dir $(WHEELHOUSE) $(MAMBA_SSM)
	$(BIN)/python -m pip download --no-deps --only-binary=:all: --python-version $(PYTHON_VERSION) \
		--platform $(PLATFORM) --platform manylinux_2_24_x86_64 --platform any --dest $(WHEELHOUSE) $(FA4_WHEELS)
	MAMBA_SKIP_CUDA_BUILD=TRUE CAUSAL_CONV1D_SKIP_CUDA_BUILD=TRUE FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE \
		$(BIN)/python -m pip download --no-deps --no-binary=:all: --no-build-isolation \
		--dest $(WHEELHOUSE)/sdist $(CUDA_SDISTS)

# CUDA builds of the source-only baselines, on a GPU node with nvcc and torch, offline, for that GPU's
# architecture only (docs/install.md). Each build prints its time; a failed one says
# why and the others still build. FA3 needs a flash-attention checkout: FLASH_ATTN_SRC=path.
cuda-wheels: $(addprefix cuda-wheel-,$(CUDA_WHEELS))

cuda-wheel-%:
	-PYTHONPATH=$(CURDIR) $(PYTHON) -m tfla_bench.cuda_wheels $* --wheelhouse $(WHEELHOUSE) \
		$(if $(FLASH_ATTN_SRC),--flash-attn-src $(FLASH_ATTN_SRC))

# Every paper figure's sweep on a GPU after `make gpu`, one after the other into $(PAPER_DIR)/<spec>,
# each compiling beside its measuring in all cores but two. Run again with the same PAPER_DIR after a
# stop (a machine's time limit): a spec begun there is resumed, a finished one kept as it is.
# `tfla-bench compare` and `plot` draw them. Where $(WHEELHOUSE) exists, Triton's kernel cache is then
# packed into it (`make kernel-cache`) for the next machine of this GPU architecture.
PAPER_SPECS ?= fig5_consttoken fig6_chunk_tradeoff fig17_headdim tfla_vs_peer tfla_vs_peer_chunks fig16_lightning fig15_fla
PAPER_DIR ?= runs/paper-$(shell date +%Y%m%d-%H%M%S)
PRECOMPILE ?= $(shell n=$$(nproc); echo $$(( n > 3 ? n - 2 : 1 )))
paper:
	@failed=""; for spec in $(PAPER_SPECS); do \
		start=$$(date +%s); run=$(PAPER_DIR)/$$spec; \
		if [ -f $$run/spec.json ]; then what="--resume $$run"; else what="$$spec --out $$run"; fi; \
		$(PYTHON) -m tfla_bench.cli.main sweep $$what --precompile $(PRECOMPILE) || failed="$$failed $$spec"; \
		echo "make paper: $$spec in $$(( $$(date +%s) - start )) s"; \
	done; \
	if [ -d "$(WHEELHOUSE)" ]; then $(PYTHON) -m tfla_bench.kernel_cache pack --wheelhouse $(WHEELHOUSE) \
		|| echo "make paper: the kernel cache was not packed"; fi; \
	if [ -n "$$failed" ]; then echo "make paper: these sweeps did not finish:$$failed"; exit 1; fi

# Triton's compiled kernels and autotuning choices into $(WHEELHOUSE), for the next machine of this GPU
# architecture, whose `make gpu` unpacks them (tfla_bench/kernel_cache.py).
kernel-cache:
	$(PYTHON) -m tfla_bench.kernel_cache pack --wheelhouse $(WHEELHOUSE)

# One command on a GPU machine: the suite into the node's own Python (its torch and triton), the
# baselines, the CUDA wheels that are missing (built side by side), the kernel cache an earlier machine
# packed (`make kernel-cache`), then `list` and `check`. Offline when $(WHEELHOUSE) holds wheels (`make
# wheelhouse` elsewhere); FA3's source from FLASH_ATTN_SRC or a clone; WITH_FA2=1 builds flash-attn 2
# too. A second run only checks.
gpu:
ifneq ($(wildcard $(WHEELHOUSE)/*.whl),)
	$(PYTHON) -m pip install -q --no-index --find-links $(WHEELHOUSE) --no-deps "setuptools>=77" wheel
endif
	$(QUIET_BUILD) $(PYTHON) -m pip install -q --no-deps --no-build-isolation -e .
	$(PYTHON) -m tfla_bench.gpu_setup $(if $(wildcard $(WHEELHOUSE)/*.whl),--wheelhouse $(WHEELHOUSE)) \
		$(if $(FLASH_ATTN_SRC),--flash-attn-src $(FLASH_ATTN_SRC)) $(if $(WITH_FA2),--with-fa2)
