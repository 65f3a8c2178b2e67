"""The `tfla-bench` command line: one typer app, one module per command group in `commands/`.

User mistakes (`UserError`, click usage errors) end in one line on stderr and exit code 2, a
started run stopped by its environment (`RunFailed`) in one line and exit code 1, Ctrl-C in one line,
`interrupted`, and exit code 130 (`_CtrlC`); bugs keep their traceback. A command or group given
without arguments prints its help.
"""

import _thread
import functools
import inspect
import signal
import sys
import threading
from typing import Annotated, Any

import typer
import typer.core

from tfla_bench import __version__, errors
from tfla_bench.cli import analysis, bench, check, crossgpu, diff, model, profile, roofs, site, status, tune
from tfla_bench.errors import RunFailed, UserError

app = typer.Typer(
    name="tfla-bench",
    help="Benchmarks and roofline analysis for TFLA (mLSTM) kernels and their competitors.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(given: bool) -> None:
    if given:
        typer.echo(f"tfla-bench {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", is_eager=True, callback=_print_version, help="print the version and exit"),
    ] = False,
) -> None:
    """Benchmarks and roofline analysis for TFLA (mLSTM) kernels and their competitors."""


model.register(app)
bench.register(app)
analysis.register(app)
check.register(app)
roofs.register(app)
profile.register(app)
diff.register(app)
crossgpu.register(app)
site.register(app)
status.register(app)
tune.register(app)

# typer >= 0.20 vendors click and older typer uses the click package; both raise usage errors
# derived from a class named ClickException, found here without importing either click.
_CLICK_EXCEPTION = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
# The exit code of a command stopped by Ctrl-C: 128 + SIGINT, as a shell reports it.
INTERRUPTED = 130
# Seconds after which `_CtrlC` raises again an interrupt that Python only reported: the main thread
# has long left the report by then.
RESEND_S = 0.1


def _plain_help(command: Any) -> Any:
    """Give every parameter of `command` and its subcommands a plain metavar: none for a flag,
    `INT`, `PATH` or `exp|sig` for an option's value, the upper-case name for an argument.
    Typer's own (`<bool>` after a flag that takes no value, `{run_dir}` for a required argument)
    read as text to type. Typer before 0.20 shows click's plain metavars and is left as it is."""
    if not hasattr(typer.core.TyperArgument, "display_type"):
        return command
    ctx = typer.Context(command)
    for param in command.get_params(ctx):  # with the --help option
        if isinstance(param, typer.core.TyperArgument):
            param.metavar = param.metavar or param.name.upper()
            usage = param.metavar if param.required else f"[{param.metavar}]"
            param.get_usage_pieces = lambda ctx, usage=usage: [usage]
            param.display_type_rich = lambda ctx: None
        elif param.is_flag:
            param.metavar = ""
        elif param.metavar is None:
            label = param.display_type(ctx).strip("<>").removeprefix("list[").removesuffix("]")
            param.metavar = label if "|" in label else label.upper()
    if command.help:
        command.help = _unwrapped(command.help)
    for sub in getattr(command, "commands", {}).values():
        _plain_help(sub)
    return command


def _unwrapped(text: str) -> str:
    """A docstring's paragraphs each on one line, so that help rewraps them at the terminal's width:
    typer's list of commands shows the source's line ends as written, mid-sentence."""
    paragraphs = [" ".join(part.split()) for part in inspect.cleandoc(text).split("\n\n")]
    return "\n\n".join(paragraphs)


@functools.cache
def _command() -> Any:
    """The click command of `app`, built once per process (building it takes longer than most commands)."""
    return _plain_help(typer.main.get_command(app))


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code (the console script passes it to `sys.exit`)."""
    with _CtrlC() as ctrl_c:
        try:
            code = _exit_code(_command(), argv)
        except Exception:  # what a KeyboardInterrupt became on its way up, or a bug
            if not ctrl_c.pressed:
                raise
            code = INTERRUPTED
    if ctrl_c.pressed or code == INTERRUPTED:
        if not errors.interrupted_said():
            print(errors.interrupted_line(), file=sys.stderr)
        return INTERRUPTED
    return code


def _exit_code(command: Any, argv: list[str] | None) -> int:
    """Run `command` on `argv`; its exit code, with a mistake's line printed."""
    try:
        code = command.main(args=argv, prog_name="tfla-bench", standalone_mode=False)
    except _CLICK_EXCEPTION as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":
            return 0  # typer printed the help while raising it
        return _usage_error(exc.format_message())
    except UserError as exc:
        return _usage_error(str(exc))
    except RunFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (typer.Abort, KeyboardInterrupt):  # older typer; typer 0.29 returns INTERRUPTED itself
        return INTERRUPTED
    return code if isinstance(code, int) else 0


class _Interrupted(KeyboardInterrupt):
    """Ctrl-C during a command, as `_CtrlC` raises it."""


class _CtrlC:
    """Ctrl-C during a command: while the context is open, SIGINT raises `_Interrupted` and sets `pressed`.

    On its way up the interrupt may become something else: typer makes it exit code 130, and a C
    extension whose initialisation it stops (pybind11's, such as triton's, which a sweep imports
    after writing spec.json) an ImportError; `pressed` says what it was. Where Python only reports
    an exception (a weakref callback, such as the one importlib frees a module lock in, or a
    `__del__`), it is raised again `RESEND_S` later, from a thread, once that report is over. The
    subclass is for the CPython versions (3.11 among them) that take a KeyboardInterrupt leaving
    code compiled from a string (the methods dataclasses and namedtuples build while a module is
    imported) for one that nothing caught: they check for that exact class and, under `python -m`,
    end the process by SIGINT after `main` has returned 130. A SIGINT the process ignores (a shell's
    background job) or handles its own way stays so, as does one outside the main thread, where no
    handler can be set.
    """

    def __init__(self) -> None:
        self.pressed = False
        self._previous: Any = None
        self._previous_hook = sys.unraisablehook

    def __enter__(self) -> "_CtrlC":
        in_main_thread = threading.current_thread() is threading.main_thread()
        if in_main_thread and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous = signal.signal(signal.SIGINT, self._interrupt)
            self._previous_hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
        return self

    def __exit__(self, *exc_info: object) -> None:
        previous, self._previous = self._previous, None  # no interrupt is raised again from now on
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
            sys.unraisablehook = self._previous_hook

    def _interrupt(self, signum: int, frame: object) -> None:
        self.pressed = True
        raise _Interrupted

    def _unraisable(self, unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, _Interrupted):
            threading.Timer(RESEND_S, self._raise_again).start()
        else:
            self._previous_hook(unraisable)

    def _raise_again(self) -> None:
        if self._previous is not None:
            _thread.interrupt_main(signal.SIGINT)


def _usage_error(message: str) -> int:
    """Print the first line of a mistake's message as `error: ...`; return exit code 2."""
    first_line = message.strip().splitlines()[0] if message.strip() else "invalid input"
    print(f"error: {first_line}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
