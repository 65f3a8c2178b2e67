"""The `tfla-bench` command line: one typer app, one module per command group in `commands/`.

User mistakes (`UserError`, click usage errors) end in one line on stderr and exit code 2, a
started run stopped by its environment (`RunFailed`) in one line and exit code 1; bugs keep their
traceback.
"""

import sys

import typer

from tfla_bench.commands import analysis, bench, check, diff, model, profile, roofs
from tfla_bench.errors import RunFailed, UserError

app = typer.Typer(
    name="tfla-bench",
    help="Benchmarks and roofline analysis for TFLA (mLSTM) kernels and their competitors.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Benchmarks and roofline analysis for TFLA (mLSTM) kernels and their competitors."""


model.register(app)
bench.register(app)
analysis.register(app)
check.register(app)
roofs.register(app)
profile.register(app)
diff.register(app)

# typer >= 0.20 vendors click and older typer uses the click package; both raise usage errors
# derived from a class named ClickException, found here without importing either click.
_CLICK_EXCEPTION = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code (the console script passes it to `sys.exit`)."""
    command = typer.main.get_command(app)
    try:
        code = command.main(args=argv, prog_name="tfla-bench", standalone_mode=False)
    except (_CLICK_EXCEPTION, UserError) as exc:
        message = exc.format_message() if isinstance(exc, _CLICK_EXCEPTION) else str(exc)
        first_line = message.strip().splitlines()[0] if message.strip() else type(exc).__name__
        print(f"error: {first_line}", file=sys.stderr)
        return 2
    except RunFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (typer.Abort, KeyboardInterrupt):
        print("interrupted", file=sys.stderr)
        return 130
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
