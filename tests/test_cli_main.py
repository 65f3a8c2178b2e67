"""`tfla-bench --version`: the installed distribution's version, and nothing else runs; help, the model
and a mistake answer without loading torch, pandas or matplotlib."""

import subprocess
import sys
from importlib import metadata

import pytest

from tfla_bench.cli.main import main


def test_version_is_the_installed_distributions(capsys):
    assert main(["--version"]) == 0
    out = capsys.readouterr().out
    assert out == f"tfla-bench {metadata.version('tfla-bench')}\n"


def test_version_wins_over_a_command(capsys):
    assert main(["--version", "model", "flops"]) == 0
    assert "FLOPs" not in capsys.readouterr().out


def test_help_texts_break_lines_only_between_paragraphs(capsys, monkeypatch):
    from tfla_bench.cli.main import _command

    def helps(command):
        yield command.name, command.help or ""
        for sub in getattr(command, "commands", {}).values():
            yield from helps(sub)

    for name, text in helps(_command()):
        for paragraph in text.split("\n\n"):
            assert "\n" not in paragraph, name
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["--help"]) == 0
    assert "why (and how to install it). --long" in capsys.readouterr().out


HEAVY = ("torch", "pandas", "matplotlib", "numpy")


@pytest.mark.parametrize(
    "argv, code",
    [
        (["--version"], 0),
        (["--help"], 0),
        (["model", "--help"], 0),
        (["model", "optimal-chunk"], 0),
        (["sweep", "--help"], 0),
        (["sweep", "no_such_spec"], 2),
        (["sweep", "smoke", "--no-such-flag"], 2),
        (["run", "--kernel", "no_such_kernel"], 2),
        (["check", "--kernel", "no_such_kernel"], 2),
        (["compare", "no_such_run"], 2),
        (["report", "no_such_run"], 2),
        (["plot", "no_such_run"], 2),
        (["diff", "no_such_run", "other"], 2),
        (["compare-gpus", "no_such_run", "other"], 2),
        (["profile", "no_such_run"], 2),
        (["site", "no_such_run", "--out", "site"], 2),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else None,
)
def test_help_version_model_and_mistakes_load_no_torch_pandas_or_matplotlib(argv, code, tmp_path):
    # In a fresh interpreter: the test process has loaded them all already.
    script = (
        "import contextlib, io, sys\n"
        "from tfla_bench.cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        "    code = main(sys.argv[1:])\n"
        f"print(code, *[name for name in {HEAVY!r} if name in sys.modules])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, *argv], capture_output=True, text=True, cwd=tmp_path, check=True
    )
    assert result.stdout.split() == [str(code)]
