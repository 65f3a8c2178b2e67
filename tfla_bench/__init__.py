"""tfla-bench: benchmarks and roofline analysis for Tiled Flash Linear Attention and its competitors."""

__version__ = "0.1.0"
