"""notebooks/reproduce_fig5.ipynb executes top to bottom on CPU.

It reads the newest committed `results/runs/fig5_consttoken-*/` run of every kernel (not one
narrowed with `--kernel`, which `selection.json` records); when none is committed the
test writes a synthetic run to a temporary folder and points the notebook at it through
`TFLA_BENCH_RUN_DIR`. The kernel is this interpreter (a kernelspec written to a temporary
`JUPYTER_PATH`), so a user-wide `python3` kernelspec cannot swap in another Python.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from synthetic_run import fig5_rows, write_run

# The test extra installs both; a GPU node that has only the runtime dependencies still collects the
# other tests (`pytest -m gpu`) and reports this module as skipped with the reason.
NEEDS_TEST_EXTRA = "the notebook test needs the test extra: pip install -e .[test]"
nbformat = pytest.importorskip("nbformat", reason=NEEDS_TEST_EXTRA)
NotebookClient = pytest.importorskip("nbclient", reason=NEEDS_TEST_EXTRA).NotebookClient

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK = REPO / "notebooks" / "reproduce_fig5.ipynb"
KERNEL_NAME = "tfla-bench-test"


def every_kernel(run: Path) -> bool:
    selection = run / "selection.json"
    return not selection.is_file() or not json.loads(selection.read_text()).get("kernels")


def committed_runs() -> list[Path]:
    return sorted(
        p
        for p in (REPO / "results" / "runs").glob("fig5_consttoken-*")
        if (p / "results.csv").is_file() and every_kernel(p)
    )


@pytest.fixture
def kernel_path(tmp_path, monkeypatch):
    spec_dir = tmp_path / "jupyter" / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "tfla-bench test kernel",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    # Connection files and the IPython profile go to the temporary folder, not to $HOME.
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    return tmp_path


def test_notebook_executes_top_to_bottom(kernel_path, monkeypatch):
    if committed_runs():
        monkeypatch.delenv("TFLA_BENCH_RUN_DIR", raising=False)
        expected_run = committed_runs()[-1]
    else:
        expected_run = write_run(kernel_path / "runs" / "fig5_consttoken-20250101-000000", fig5_rows())
        monkeypatch.setenv("TFLA_BENCH_RUN_DIR", str(expected_run))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        notebook,
        kernel_name=KERNEL_NAME,
        timeout=120,
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    )
    client.execute()

    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "\n".join(
        o.get("text", "") + o.get("data", {}).get("text/plain", "")
        for o in outputs
        if o.output_type != "error"
    )
    assert expected_run.name in text
    assert "ratio = run / published" in text and "ms ratio" in text
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 3  # runtime, memory, roofline fraction (and the roofline when fwbw rows ran)
