"""CLI command `site`: every run in one static site, opened from disk.

    tfla-bench site results/runs --out site
    tfla-bench site results/runs/fig5_consttoken-* results/runs/fig17_headdim-* --out /tmp/site

RUNS are run directories or folders of them. The site (`tfla_bench.analyse.site`) holds an index of
the runs, each run's report, a page per spec with its runs side by side and across GPUs, and the
history of every case that two or more runs share, with the changes beyond the noise flagged by the
rule `diff` gates on. It prints where the index is and what it holds first.

Exit codes: 0; 2 for a user mistake (a path that does not exist, no run directory among RUNS, no run
that can be read, an --out holding other files); 1 when a page cannot be written once writing began.
A run that cannot be read is a warning, named on the index, and the site goes on without it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from tfla_bench.cli.paths import output_dir, path_option, writes
from tfla_bench.errors import UserError
from tfla_bench.run import rundir
from tfla_bench.run.console import make_console, progress_bar


def site(
    runs: Annotated[
        list[Path],
        typer.Argument(
            help="Run directories, or folders of them (results/runs).",
            show_default=False,
            parser=path_option("RUNS"),
        ),
    ],
    out: Annotated[
        Path,
        typer.Option(
            "--out", parser=path_option("--out"), help="The site's folder (empty, or a site built before)."
        ),
    ],
    jobs: Annotated[
        int | None, typer.Option("--jobs", help="Processes drawing side by side; default one per CPU.")
    ] = None,
) -> None:
    """Build one static site of many runs: an index, each run's report, each spec's runs side by side
    and across GPUs, and the history of every case with the changes beyond the noise flagged."""
    if jobs is not None and jobs < 1:
        raise UserError(f"--jobs: expected 1 or more, got {jobs}")
    rundir.find_runs(runs)  # a path that is not there, or no run at all, is said before the imports
    # Resolved, so that `new/..` is the folder it names, not a `new` made on the way.
    out = output_dir(out, "--out").resolve()
    # pandas and matplotlib take a second to import: loaded once the flags and paths are checked.
    from tfla_bench.analyse.site import build_site, check_out

    check_out(out)  # before the progress bar, which a mistake would leave as an empty line
    console = make_console(stderr=True)
    with progress_bar(console, transient=True) as bar, writes(f"the site in {out}", folder=out):
        task = bar.add_task("site", total=None)

        def progress(what: str, done: int, total: int) -> None:
            bar.update(task, description=what, completed=done, total=total)

        def warn(line: str) -> None:
            bar.console.print(line, markup=False, highlight=False)

        built = build_site(runs, out, warn, progress, jobs)
    gpus = ", ".join(built.gpus)
    flags = f"{built.flagged} change(s) beyond the noise flagged" if built.flagged else "no change flagged"
    left = f"; {len(built.left_out)} run(s) left out (unreadable)" if built.left_out else ""
    print(
        f"{len(built.runs)} run(s) of {len(built.specs)} spec(s) on {gpus}; {flags}{left}\n"
        f"open {built.index.resolve().as_uri()}",
        file=sys.stdout,
    )


def register(app: typer.Typer) -> None:
    """Add `site` to the main app."""
    app.command("site")(site)
