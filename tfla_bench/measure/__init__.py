"""Measuring one case and the machine: the settings, timing, memory, GPU state, the worker process
that runs a case, the environment record, the measured roofs, Nsight Compute and kernel tuning."""
