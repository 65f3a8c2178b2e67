"""`tfla-bench --version`: the installed distribution's version, and nothing else runs."""

from importlib import metadata

from tfla_bench.cli.main import main


def test_version_is_the_installed_distributions(capsys):
    assert main(["--version"]) == 0
    out = capsys.readouterr().out
    assert out == f"tfla-bench {metadata.version('tfla-bench')}\n"


def test_version_wins_over_a_command(capsys):
    assert main(["--version", "model", "flops"]) == 0
    assert "FLOPs" not in capsys.readouterr().out
