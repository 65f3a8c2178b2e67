"""Registry adapters for the kernels in this package."""
