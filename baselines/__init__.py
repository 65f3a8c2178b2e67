"""Adapters around third-party kernels, one module per family (imported as `tfla_bench.baselines`)."""
