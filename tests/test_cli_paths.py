"""Output paths checked before any work, and the help: every writer of every command, every help page."""

from __future__ import annotations

import pytest
import torch
import typer
from synthetic_run import fig5_rows, write_run

from tfla_bench.cli import paths
from tfla_bench.cli.main import app, main
from tfla_bench.errors import UserError


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    rows = [r for r in fig5_rows(seq_lens=(8192,)) if r["mode"] == "fw"]
    return write_run(tmp_path_factory.mktemp("runs") / "fig5-20250101-000000", rows)


@pytest.fixture
def places(tmp_path):
    """A file, a folder, and a path below the file (whose parent can never be made)."""
    (tmp_path / "file").write_text("keep me\n")
    (tmp_path / "folder").mkdir()
    return {
        "file": tmp_path / "file",
        "folder": tmp_path / "folder",
        "below_file": tmp_path / "file" / "x",
        "new": tmp_path / "new" / "deeper",
    }


ADHOC = ["run", "-k", "sdpa_math", "--seq-len", "16", "--tokens", "32", "--heads", "1", "--head-dim-qk", "8"]
# Every writer: its command line (RUN: a run directory, OUT: the output path), and what OUT must be.
WRITERS = {
    "compare --json": (["compare", "RUN", "--json", "OUT"], "file"),
    "compare --csv": (["compare", "RUN", "--csv", "OUT"], "file"),
    "diff --json": (["diff", "RUN", "RUN", "--json", "OUT"], "file"),
    "diff --csv": (["diff", "RUN", "RUN", "--csv", "OUT"], "file"),
    "diff --plot": (["diff", "RUN", "RUN", "--plot", "OUT"], "file"),
    "report --out": (["report", "RUN", "--out", "OUT"], "file"),
    "plot --out": (["plot", "RUN", "--out", "OUT"], "folder"),
    "roofline --out": (["roofline", "--gpu", "h100", "--out", "OUT"], "folder"),
    "sweep --out": (["sweep", "experiments/smoke.toml", "--out", "OUT"], "folder"),
    "run --out": ([*ADHOC, "--out", "OUT"], "folder"),
}


@pytest.mark.parametrize("writer", WRITERS)
def test_wrong_output_path_is_one_line_and_exit_2(run_dir, places, capsys, writer):
    template, kind = WRITERS[writer]
    flag = template[template.index("OUT") - 1]
    for wrong in ("folder" if kind == "file" else "file", "below_file"):
        argv = [{"RUN": str(run_dir), "OUT": str(places[wrong])}.get(arg, arg) for arg in template]
        assert main(argv) == 2, wrong
        err = capsys.readouterr().err
        assert err.startswith(f"error: {flag} {places[wrong]}: ") and err.count("\n") == 1, err
    assert places["file"].read_text() == "keep me\n"
    assert list(places["folder"].iterdir()) == []


def test_outputs_never_replace_the_run_they_read(run_dir, capsys):
    before = (run_dir / "results.csv").read_bytes()
    for argv in (
        ["compare", str(run_dir), "--csv", str(run_dir / "results.csv")],
        ["compare", str(run_dir), "--json", str(run_dir / "env.json")],
        ["report", str(run_dir), "--out", str(run_dir / "results.csv")],
        ["diff", str(run_dir), str(run_dir), "--csv", str(run_dir / "results.csv")],
    ):
        assert main(argv) == 2
        assert "would replace an input" in capsys.readouterr().err
    assert (run_dir / "results.csv").read_bytes() == before


def test_missing_parents_are_created(run_dir, places, capsys):
    out = places["new"] / "comparison.json"
    assert main(["compare", str(run_dir), "--json", str(out)]) == 0
    assert out.is_file()
    assert paths.output_dir(places["new"] / "a" / "b", "--out") == places["new"] / "a" / "b"


def test_check_writes_nothing(places):
    with pytest.raises(UserError, match="is a file"):
        paths.output_dir(places["file"], "--out")
    paths.output_file(places["new"] / "f.json", "--json")
    paths.output_dir(places["new"] / "dir", "--out")
    assert not places["new"].exists()


def _command_paths(command, prefix=()):
    yield prefix
    for name, sub in getattr(command, "commands", {}).items():
        yield from _command_paths(sub, (*prefix, name))


def test_help_has_no_placeholders(capsys):
    commands = list(_command_paths(typer.main.get_command(app)))
    assert len(commands) >= 18  # the root, 12 commands, the model group and its 5 subcommands
    for command in commands:
        assert main([*command, "--help"]) == 0
        text = capsys.readouterr().out
        assert "Usage: tfla-bench" in text
        for placeholder in "<>{}":
            assert placeholder not in text, (command, placeholder, text)


@pytest.mark.parametrize("argv", [[], ["model"]])
def test_bare_command_prints_the_help(capsys, argv):
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "Usage: tfla-bench" in captured.out and captured.err == ""


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:3"])
def test_check_on_cuda_without_cuda_exits_2(capsys, device):
    assert main(["check", "--device", device, "-k", "sdpa_math"]) == 2
    assert capsys.readouterr().err == f"error: --device {device}: no CUDA device is visible\n"


def test_compare_published_none_says_so(run_dir, capsys):
    assert main(["compare", str(run_dir), "--published", "none"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --published none leaves compare nothing to compare with; pass --published")


@pytest.mark.gpu
def test_roofs_checks_its_file_before_measuring(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TFLA_BENCH_ROOFS_FILE", str(tmp_path))
    assert main(["roofs"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: the measured-roofs file {tmp_path}: is a folder; give a file name\n"
