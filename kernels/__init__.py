"""Our own Triton TFLA kernels and their PyTorch references (imported as `tfla_bench.kernels`)."""
