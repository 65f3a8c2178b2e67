"""A stand-in for Nsight Compute's `ncu` that never runs the program it is given.

`install(tmp_path, monkeypatch, mode)` writes an executable `ncu` into `tmp_path` and returns its path.
What it does depends on `mode`:

- `sample`: writes `tests/data/ncu_sample.csv` as ncu's log file;
- `not_permitted`: prints ncu's `ERR_NVGPUCTRPERM` message and exits 1;
- `unknown_metric`: refuses the tensor-pipe metric, as an ncu for another GPU may;
- `empty`: profiles nothing.

Every call appends its arguments (one JSON list per line) to `calls.jsonl` beside the script.
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

SAMPLE = Path(__file__).resolve().parent / "data" / "ncu_sample.csv"

SCRIPT = """#!{python}
import json, shutil, sys
from pathlib import Path
args = sys.argv[1:]
here = Path(__file__).parent
with (here / "calls.jsonl").open("a") as calls:
    calls.write(json.dumps(args) + "\\n")
log = Path(args[args.index("--log-file") + 1])
metrics = args[args.index("--metrics") + 1].split(",")
mode = {mode!r}
if mode == "not_permitted":
    print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance "
          "Counters on the target device 0.")
    sys.exit(1)
tensor = "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
if mode == "unknown_metric" and tensor in metrics:
    log.write_text("==ERROR== Failed to find metric " + tensor + "\\n")
    sys.exit(1)
if mode == "empty":
    log.write_text("==PROF== Connected to process 1\\n==WARNING== No kernels were profiled.\\n")
    sys.exit(0)
shutil.copy({sample!r}, log)
"""


def install(directory: Path, mode: str) -> Path:
    """An executable fake `ncu` in `directory` behaving as `mode`."""
    path = directory / "ncu"
    path.write_text(SCRIPT.format(python=sys.executable, mode=mode, sample=str(SAMPLE)))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def calls(directory: Path) -> list[list[str]]:
    """The argument lists the fake was called with, in order."""
    log = directory / "calls.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
