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
