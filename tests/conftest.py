"""Test set-up: Triton kernels run under the interpreter when there is no GPU; `gpu` tests need CUDA."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    # Must be set before any `@triton.jit` function is defined (i.e. before our kernels are imported).
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
