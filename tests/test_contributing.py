"""CONTRIBUTING.md's worked example is the file `tests/examples/torch_linear_attention.py`, and that
adapter works as the page says: `list` shows it, `check` passes it, `run` measures it on the CPU."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tfla_bench.adapters import registry
from tfla_bench.cli.main import main
from tfla_bench.run import rundir

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "tests" / "examples" / "torch_linear_attention.py"


def test_the_page_shows_the_example_file_as_it_is():
    page = (REPO / "CONTRIBUTING.md").read_text()
    block = re.search(r"<!-- tests/examples/torch_linear_attention.py -->\n```python\n(.*?)```", page, re.S)
    assert block is not None and block.group(1) == EXAMPLE.read_text()


@pytest.fixture
def example(monkeypatch):
    """The example loaded as the page says: its folder on the path, its module in TFLA_BENCH_PLUGINS."""
    registry.load()
    monkeypatch.setattr(registry, "_ADAPTERS", dict(registry._ADAPTERS))
    monkeypatch.syspath_prepend(str(EXAMPLE.parent))
    monkeypatch.delitem(sys.modules, "torch_linear_attention", raising=False)
    monkeypatch.setenv(registry.PLUGINS_ENV, "torch_linear_attention")


def test_list_shows_the_example_and_where_it_came_from(example, capsys):
    assert main(["list", "--json"]) == 0
    entries = {entry["name"]: entry for entry in json.loads(capsys.readouterr().out)}
    entry = entries["torch_linear_attention"]
    assert entry["available"] is True and entry["family"] == "linear_attention"
    assert entry["origin"] == "TFLA_BENCH_PLUGINS torch_linear_attention"


def test_check_passes_the_example(example, capsys):
    argv = ["check", "--kernel", "torch_linear_attention", "--device", "cpu", "--dtype", "float32", "--json"]
    assert main(argv) == 0
    (verdict,) = json.loads(capsys.readouterr().out)
    assert verdict["status"] == "ok" and verdict["passed"] is True and verdict["max_rel_error"] < 1e-5


def test_a_tiny_cpu_run_of_the_example(example, tmp_path, capsys):
    out = tmp_path / "linear-run"
    argv = ["run", "--kernel", "torch_linear_attention", "--seq-len", "64", "--batch", "1", "--heads", "2"]
    argv += [
        "--head-dim-qk",
        "16",
        "--head-dim-v",
        "32",
        "--dtype",
        "float32",
        "--out",
        str(out),
        "--reps",
        "3",
    ]
    assert main(argv) == 0
    rows = rundir.read_results(out / rundir.RESULTS).rows
    assert {(row.case.mode, row.status) for row in rows} == {("fw", "ok"), ("fwbw", "ok")}
    fw = next(row for row in rows if row.case.mode == "fw")
    assert fw.flops == 2 * 64 * 64 * (16 + 32)  # 2 heads x (2 T^2 Dqk + 2 T^2 Dv) / 2 (causal)
