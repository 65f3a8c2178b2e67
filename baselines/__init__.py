"""Adapters around third-party kernels, one module per adapter; a module whose name starts with `_`
holds what one family's adapters share (imported as `tfla_bench.baselines`)."""
