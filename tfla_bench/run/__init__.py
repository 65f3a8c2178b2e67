"""Running a sweep: the spec, the run directory and its rows, the runner, precompilation, the
correctness gate, profiling, and sweeps through jobs and clusters."""
