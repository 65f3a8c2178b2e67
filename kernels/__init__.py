"""Our own Triton TFLA and limit_chunk kernels, the PyTorch references of every kernel family the
suite checks (`reference`) and the adapters of our kernels (`adapters`); imported as
`tfla_bench.kernels`."""
