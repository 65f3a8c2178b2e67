"""CLI commands `list`, `run` (ad hoc cases from flags) and `sweep` (a TOML spec).

Examples::

    tfla-bench list --json
    tfla-bench run --kernel sdpa_cudnn,mlstm_torch --seq-len 2048,8192 --tokens 65536 --heads 32 \\
        --head-dim-qk 128 --mode fw,fwbw --param causal=false
    tfla-bench sweep experiments/sdpa_h100.toml --kernel sdpa_cudnn --dry-run
    tfla-bench sweep smoke --out /tmp/smoke-run
    tfla-bench sweep --resume results/runs/smoke-20250101-120000 --retry crashed,timeout
    tfla-bench sweep experiments/fig5_consttoken.toml --executor slurm --partition gpu --nodes 4 \\
        --gpus-per-node 8 --time 4:00:00 --precompile 14

A sweep or resume holds the run directory's lock (`tfla_bench.run.rundir`) from before the correctness
gate to its last row. With `--executor slurm` or `local` the cases run in jobs (`tfla_bench.run.cluster`)
and the lock is held while the sweep follows them (with `--no-wait`, while it submits them).
"""

from __future__ import annotations

import functools
import inspect
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any, get_type_hints

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from tfla_bench.adapters import registry
from tfla_bench.adapters.workloads import Case
from tfla_bench.cli import check as check_command
from tfla_bench.cli.options import _int_list, _ints, _names
from tfla_bench.cli.paths import output_dir, path_option
from tfla_bench.errors import UserError
from tfla_bench.measure import row as row_schema
from tfla_bench.measure import settings
from tfla_bench.run import cluster, correctness, jobs, phases, rundir, runner, specs
from tfla_bench.run.cluster import ClusterFlags
from tfla_bench.run.console import (
    cases_table,
    make_console,
    print_install_hints,
    split_reason,
    summary_table,
)
from tfla_bench.run.specs import Spec

# The most compile processes: each holds a GPU context and a compiler, so more than this would only
# thrash the host.
MAX_PRECOMPILE = 1024
# The flags whose names differ from the settings they set.
FLAG_OF = {"budget_s": "budget", "timeout_s": "timeout"}

KernelOption = Annotated[
    list[str] | None,
    typer.Option("--kernel", "-k", help="kernel name; repeat or comma-separate (sweep: filter the spec's)"),
]
OutOption = Annotated[
    Path | None,
    typer.Option("--out", parser=path_option("--out"), help="run directory (default runs/SPEC-TIMESTAMP)"),
]
ExecutorOption = Annotated[
    str | None,
    typer.Option(
        "--executor",
        metavar="none|slurm|local",
        help="none: in this process (default); slurm: jobs through submitit; local: submitit's jobs on "
        "this machine. A resumed run keeps its own",
    ),
]
NodesOption = Annotated[
    int | None, typer.Option("--nodes", help="split the cases over N jobs of one node each (default 1)")
]
GpusPerNodeOption = Annotated[
    int | None, typer.Option("--gpus-per-node", help="GPUs of each job (default 1; local: 1, or 0 on CPU)")
]
TimeOption = Annotated[
    str | None,
    typer.Option("--time", help="each job's time limit: minutes or [D-]HH:MM:SS (default 60 minutes)"),
]
PartitionOption = Annotated[str | None, typer.Option("--partition", help="Slurm partition")]
AccountOption = Annotated[str | None, typer.Option("--account", help="Slurm account")]
ConstraintOption = Annotated[
    str | None, typer.Option("--constraint", help="Slurm node constraint, e.g. a GPU type")
]
SlurmArgOption = Annotated[
    list[str] | None,
    typer.Option("--slurm-arg", metavar="KEY=VALUE", help="any other sbatch option, e.g. qos=high (repeat)"),
]
NoWaitOption = Annotated[
    bool,
    typer.Option("--no-wait", help="submit the jobs and return; `tfla-bench status RUN_DIR` merges the rows"),
]


@dataclass(frozen=True)
class _Flags:
    """The options `run` and `sweep` share (None: the spec's value); each field is one option, so a
    new shared option is one field here (`_with_flags` gives it to both commands)."""

    gpus: Annotated[
        str | None, typer.Option("--gpus", help="GPUs to use: a count N (the first N) or a list such as 0,2")
    ] = None
    warmup: Annotated[
        int | None, typer.Option("--warmup", help="a fixed number of untimed calls (default: 25 ms of calls)")
    ] = None
    reps: Annotated[
        int | None,
        typer.Option("--reps", help="a fixed number of timed calls (default: adaptive, see --rel-ci)"),
    ] = None
    rel_ci: Annotated[
        float | None,
        typer.Option(
            "--rel-ci", help="adaptive reps: stop when the median's 95% interval is within +-this (0.01)"
        ),
    ] = None
    budget: Annotated[
        float | None,
        typer.Option("--budget", help="adaptive reps: seconds of timed calls per case at most (1.0)"),
    ] = None
    timeout: Annotated[
        float | None, typer.Option("--timeout", help="seconds per case, first call included (default 900)")
    ] = None
    autotune_ms: Annotated[
        float | None,
        typer.Option(
            "--autotune-ms",
            help="timed ms per config of a library's Triton autotuner in a first call (20; Triton: 100)",
        ),
    ] = None
    l2_flush: Annotated[
        bool | None,
        typer.Option("--l2-flush/--no-l2-flush", help="zero a 2x-L2 buffer before each timed call"),
    ] = None
    cuda_graph: Annotated[
        bool | None, typer.Option("--cuda-graph/--no-cuda-graph", help="time CUDA-graph replays of one call")
    ] = None
    energy: Annotated[
        bool | None,
        typer.Option(
            "--energy/--no-energy",
            help="energy per call: NVML's counter over calls after the timed ones (H200: 0.6-0.7 s a case)",
        ),
    ] = None
    clock: Annotated[
        str | None,
        typer.Option(
            "--clock",
            help="events (CUDA events around each call) or kernels (its span in the GPU's activity record)",
        ),
    ] = None
    power_cap: Annotated[
        str | None,
        typer.Option(
            "--power-cap",
            help="a case meeting its power cap is timed again: gaps (idle gaps between calls) or again",
        ),
    ] = None
    energy_method: Annotated[
        str | None,
        typer.Option(
            "--energy-method",
            help="around (the counter read around the timed calls) or series (calls of its own after them)",
        ),
    ] = None
    energy_s: Annotated[
        float | None,
        typer.Option("--energy-s", help="the shortest energy series in seconds (the series method)"),
    ] = None
    grad: Annotated[
        str | None,
        typer.Option("--grad", help="fwbw upstream gradient: fixed (randn, made once) or sum (out.sum())"),
    ] = None
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the expanded cases and exit")] = False
    check: Annotated[
        bool,
        typer.Option(
            "--check", help="run the correctness gate first; a failing kernel's rows say failed_check"
        ),
    ] = False
    precompile: Annotated[
        int,
        typer.Option(
            "--precompile",
            metavar="N",
            help="compile the kernels in N processes before measuring (autotuned configs split over them)",
        ),
    ] = 0
    tune: Annotated[
        bool | None,
        typer.Option(
            "--tune/--no-tune",
            help="tune our kernels at each shape without a tuned config for this GPU before measuring "
            "(default on a GPU; about a minute a shape, kept in the user's tuned-config file for every "
            "later call)",
        ),
    ] = None
    roofs: Annotated[
        bool,
        typer.Option(
            "--roofs/--no-roofs",
            help="record the GPU's measured roofs in env.json (measured first when none are saved)",
        ),
    ] = True
    ncu: Annotated[
        bool,
        typer.Option(
            "--ncu", help="after timing, profile every ok case under ncu for its DRAM bytes (profile.csv)"
        ),
    ] = False
    ncu_path: Annotated[
        Path | None, typer.Option("--ncu-path", help="the ncu executable for --ncu (default: ncu on PATH)")
    ] = None


def _with_flags(command: Callable[..., None]) -> Callable[..., None]:
    """`command` with the options of `_Flags` after its own; it receives their values as one `flags`.

    Typer reads a command's options from its signature, so the wrapper shows typer the merged one.
    """
    hints = get_type_hints(_Flags, include_extras=True)
    shared = [
        inspect.Parameter(
            field.name, inspect.Parameter.KEYWORD_ONLY, default=field.default, annotation=hints[field.name]
        )
        for field in fields(_Flags)
    ]
    own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != "flags"]

    @functools.wraps(command)
    def with_flags(**values: Any) -> None:
        flags = _Flags(**{field.name: values.pop(field.name) for field in fields(_Flags)})
        command(**values, flags=flags)

    with_flags.__signature__ = inspect.Signature([*own, *shared])  # type: ignore[attr-defined]
    return with_flags


def register(app: typer.Typer) -> None:
    """Add `list`, `run` and `sweep` to the main app."""
    app.command("list")(list_adapters)
    app.command("run")(_with_flags(run))
    app.command("sweep")(_with_flags(sweep))


def list_adapters(
    long: Annotated[
        bool,
        typer.Option(
            "--long", help="every fact of each kernel: layout, modes, dtypes, constraints, origin, ..."
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print a JSON list of every fact instead")] = False,
    fresh: Annotated[
        bool, typer.Option("--fresh", help="ask every adapter whether it runs here, whatever the cache holds")
    ] = False,
) -> None:
    """List every kernel adapter: its family, whether it runs here and, where not, why (and how to
    install it). --long or --json add layout, modes, dtypes, constraints and origin (built-in module,
    entry point or TFLA_BENCH_PLUGINS module).

    Whether an adapter runs here is cached (~/.cache/tfla-bench/availability.json, or
    $TFLA_BENCH_AVAILABILITY_FILE) until the Python, the installed packages, the adapters' source,
    the visible GPUs or TRITON_INTERPRET and CUDA_VISIBLE_DEVICES change; a line says when the
    answers came from it, and --fresh asks again. `check` writes what it learns there too."""
    adapters = registry.adapters()
    answers = registry.availability_answers(adapters, fresh=fresh)
    entries = [_list_entry(adapter, answers.reasons[adapter.name]) for adapter in adapters]
    cached = _cached_line(answers)
    if as_json:
        typer.echo(json.dumps(entries, indent=2))
        if cached:
            make_console(stderr=True).print(cached, highlight=False)
        return
    available = sum(entry["available"] for entry in entries)
    console = make_console()
    console.print(f"{len(entries)} kernel adapter(s), {available} available here", highlight=False)
    if cached:
        console.print(cached, highlight=False)
    if long:
        for entry in entries:
            console.print(_long_entry(entry))
        return
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("kernel", no_wrap=True)
    table.add_column("family", no_wrap=True)
    table.add_column("here", no_wrap=True)
    table.add_column("why not", overflow="fold")
    for entry in entries:
        here = "[green]yes[/]" if entry["available"] else "[red]no[/]"
        table.add_row(entry["name"], entry["family"], here, split_reason(entry["reason"] or "")[0])
    console.print(table)
    print_install_hints(console, {entry["name"]: entry["reason"] or "" for entry in entries})


def _cached_line(answers: registry.Availability) -> str:
    """The line that says the availability came from the cache, and how old it is; empty if it did not."""
    if answers.cached_since is None:
        return ""
    age_s = max(0.0, time.time() - answers.cached_since)
    for unit, seconds in (("day", 86400), ("h", 3600), ("min", 60)):
        if age_s >= seconds:
            count = int(age_s // seconds)
            age = f"{count} {unit}{'s' if unit == 'day' and count > 1 else ''}"
            break
    else:
        age = f"{int(age_s)} s"
    total = len(answers.reasons)
    which = "" if len(answers.cached) == total else f" of {len(answers.cached)} of {total} kernels"
    return f"availability{which} from the cache, asked {age} ago (--fresh asks again)"


def _list_entry(adapter: registry.Adapter, reason: str | None) -> dict[str, Any]:
    """What `list --json` says of one adapter, `reason` its `available()`."""
    return {
        "name": adapter.name,
        "family": adapter.family,
        "layout": adapter.layout,
        "modes": list(adapter.modes),
        "dtypes": list(adapter.dtypes),
        "cpu_capable": adapter.cpu_capable,
        "uses_chunk_size": adapter.uses_chunk_size,
        "available": reason is None,
        "reason": reason,
        "constraints": adapter.constraints,
        "module": type(adapter).__module__,
        "origin": adapter.origin,
    }


def _long_entry(entry: dict[str, Any]) -> Table:
    """One adapter as a block of `fact  value` lines, which reads at any width."""
    table = Table.grid(padding=(0, 2))
    table.add_column(no_wrap=True, style="dim")
    table.add_column(overflow="fold")
    table.add_row(f"[bold]{entry['name']}[/]", f"{entry['family']}, {entry['origin']}")
    available = "[green]yes[/]" if entry["available"] else f"[red]no[/]: {entry['reason']}"
    for fact, value in (
        ("available", available),
        ("layout", entry["layout"]),
        ("modes", ", ".join(entry["modes"])),
        ("dtypes", ", ".join(entry["dtypes"])),
        ("runs on CPU", "yes" if entry["cpu_capable"] else "no"),
        ("chunk size", "yes" if entry["uses_chunk_size"] else "no"),
        ("constraints", entry["constraints"] or "-"),
    ):
        table.add_row(f"  {fact}", value)
    return table


# The paper's Fig. 5 setting: a constant 65,536 tokens per batch and embedding dim 4096 for every kernel.
PAPER_TOKENS = 65536
PAPER_EMBEDDING_DIM = 4096


def run(
    kernel: KernelOption = None,
    seq_len: Annotated[
        str | None, typer.Option("--seq-len", help="sequence length(s), e.g. 2048,8192 (required)")
    ] = None,
    tokens: Annotated[
        str | None,
        typer.Option(
            "--tokens",
            help=f"tokens per batch: batch = tokens/seq_len (default {PAPER_TOKENS}, as the paper's Fig. 5)",
        ),
    ] = None,
    batch: Annotated[str | None, typer.Option("--batch", help="batch size(s), instead of --tokens")] = None,
    heads: Annotated[
        str | None, typer.Option("--heads", help="number of heads, instead of --embedding-dim")
    ] = None,
    embedding_dim: Annotated[
        str | None,
        typer.Option(
            "--embedding-dim",
            help=f"heads = embedding_dim / head_dim_v (default {PAPER_EMBEDDING_DIM}, as the paper's Fig. 5)",
        ),
    ] = None,
    head_dim_qk: Annotated[
        str | None,
        typer.Option("--head-dim-qk", help="query/key head dim(s) (required; the paper's mLSTM: 128)"),
    ] = None,
    head_dim_v: Annotated[
        str | None,
        typer.Option(
            "--head-dim-v", help="value head dim(s) (default: --head-dim-qk; the paper's mLSTM: 256)"
        ),
    ] = None,
    chunk_size: Annotated[
        str | None, typer.Option("--chunk-size", help="chunk size(s), for kernels that take one")
    ] = None,
    mode: Annotated[str, typer.Option("--mode", help="fw, fwbw or fw,fwbw")] = "fw,fwbw",
    dtype: Annotated[
        str, typer.Option("--dtype", help="bfloat16, float16 or float32 (or a list)")
    ] = "bfloat16",
    param: Annotated[
        list[str] | None, typer.Option("--param", help="kernel parameter key=value (repeat; a,b expands)")
    ] = None,
    expand: Annotated[str, typer.Option("--expand", help="grid or zip for several lists")] = "grid",
    name: Annotated[str, typer.Option("--name", help="run name (directory prefix)")] = "adhoc",
    out: OutOption = None,
    flags: _Flags = _Flags(),
) -> None:
    """Measure kernels at shapes given as flags (the same spec a TOML file would give). --kernel,
    --seq-len and --head-dim-qk are required; the batch and heads follow the paper's Fig. 5 (65,536
    tokens, embedding dim 4096) unless given."""
    kernels = _names(kernel, "--kernel")
    for name_ in kernels:  # a misspelt kernel first: the shape flags are of no use without it
        registry.get(name_)
    missing = [
        text
        for text, value in (
            ("--kernel NAME (see tfla-bench list)", kernels),
            ("--seq-len T (e.g. 8192)", seq_len),
            ("--head-dim-qk D (e.g. 128, with --head-dim-v 256 as the paper's mLSTM)", head_dim_qk),
        )
        if not value
    ]
    if missing:
        raise UserError(f"run needs {', '.join(missing)}")
    for pair in (
        ("--tokens", tokens, "--batch", batch),
        ("--heads", heads, "--embedding-dim", embedding_dim),
    ):
        if pair[1] is not None and pair[3] is not None:
            raise UserError(f"run takes one of {pair[0]} and {pair[2]}, not both")
    if batch is None and tokens is None:
        tokens = str(PAPER_TOKENS)
    if heads is None and embedding_dim is None:
        embedding_dim = str(PAPER_EMBEDDING_DIM)
    shape: dict[str, Any] = {}
    for key, flag, value in (
        ("seq_len", "--seq-len", seq_len),
        ("head_dim_qk", "--head-dim-qk", head_dim_qk),
        ("head_dim_v", "--head-dim-v", head_dim_v if head_dim_v is not None else head_dim_qk),
        ("tokens", "--tokens", tokens),
        ("batch", "--batch", batch),
        ("num_heads", "--heads", heads),
        ("embedding_dim", "--embedding-dim", embedding_dim),
        ("chunk_size", "--chunk-size", chunk_size),
    ):
        if value is not None:
            shape[key] = _shape_flag(flag, value)
    raw: dict[str, Any] = {
        "name": name,
        "description": "ad hoc run from the command line",
        "kernels": kernels,
        "modes": _names([mode], "--mode"),
        "dtype": _names([dtype], "--dtype"),
        "expand": expand,
        "params": _params(param or []),
        "shape": shape,
    }
    spec = specs.parse_spec(raw, "command line")
    _execute(spec, None, out, None, flags)


def sweep(
    spec_path: Annotated[
        Path | None,
        typer.Argument(
            metavar="SPEC",
            help="a TOML spec file, or the name of a shipped one such as smoke (optional with --resume)",
            show_default=False,
        ),
    ] = None,
    out: OutOption = None,
    resume: Annotated[
        Path | None,
        typer.Option(
            "--resume",
            parser=path_option("--resume"),
            help="continue this run directory; finished cases are kept",
        ),
    ] = None,
    retry: Annotated[
        str | None,
        typer.Option(
            "--retry",
            metavar="STATUSES",
            help="with --resume: run rows of these statuses again and replace them "
            f"(any of {','.join(row_schema.RERUNNABLE_STATUSES)}; {runner.RETRY_BESIDE}: the rows "
            "measured beside the precompile, which have no energy)",
        ),
    ] = None,
    force: Annotated[
        bool,
        typer.Option("--force", help="with --resume: accept a spec that differs from the run's (recorded)"),
    ] = False,
    kernel: KernelOption = None,
    seq_len: Annotated[
        str | None,
        typer.Option("--seq-len", help="filter the spec's cases to these sequence lengths, e.g. 8192"),
    ] = None,
    executor: ExecutorOption = None,
    nodes: NodesOption = None,
    gpus_per_node: GpusPerNodeOption = None,
    time: TimeOption = None,
    partition: PartitionOption = None,
    account: AccountOption = None,
    constraint: ConstraintOption = None,
    slurm_arg: SlurmArgOption = None,
    no_wait: NoWaitOption = False,
    flags: _Flags = _Flags(),
) -> None:
    """Run every case of a spec, each in an isolated worker; rows go to results.csv in the run directory.
    With --executor slurm or local the cases are split over jobs of one node each."""
    if spec_path is not None:
        spec = specs.load_spec(specs.find_spec(spec_path))
    elif resume is not None:
        spec = _recorded_spec(resume)
    else:
        raise UserError("sweep needs a SPEC file (or --resume DIR)")
    if resume is None and (retry is not None or force):
        raise UserError(f"{'--retry' if retry is not None else '--force'} needs --resume DIR")
    only_lengths = _int_list("--seq-len", seq_len) if seq_len is not None else None
    scheduler = ClusterFlags(
        executor, nodes, gpus_per_node, time, partition, account, constraint, tuple(slurm_arg or ()), no_wait
    )
    kernels = _names(kernel, "--kernel")
    _execute(spec, kernels, out, resume, flags, _statuses(retry), force, only_lengths, scheduler)


def _execute(
    spec: Spec,
    only: list[str] | None,
    out: Path | None,
    resume: Path | None,
    flags: _Flags,
    retry: frozenset[str] = frozenset(),
    force: bool = False,
    seq_lens: list[int] | None = None,
    scheduler: ClusterFlags | None = None,
) -> None:
    """Apply measurement flags, expand (keeping the kernels `only` and lengths `seq_lens` when given),
    and either print the cases or run them (holding the run directory's lock), in this process or in
    jobs as `scheduler` says, and print the summary."""
    clock = phases.PhaseClock()
    runner.check_out_or_resume(out, resume)
    spec = _with_measurement_flags(spec, flags)
    _check_published(spec)
    selection = None
    if resume is not None and not only and not seq_lens:
        selection = resume / rundir.SELECTION
        only, seq_lens = rundir.read_selection(resume)  # the cases the run set out to measure
    cases = _selected_cases(spec, only, seq_lens, selection)
    options = cluster.resolve(scheduler or ClusterFlags(), jobs.read(resume) if resume is not None else None)
    if options is not None:
        for flag, given in (("--gpus", flags.gpus), ("--check", flags.check), ("--ncu", flags.ncu)):
            if given:
                raise UserError(f"{flag} is not available with --executor {options.executor}")
        cluster.require_submitit(options.executor)
    if flags.ncu:
        from tfla_bench.measure import ncu  # only --ncu uses Nsight Compute

        ncu.locate(flags.ncu_path)  # a bad --ncu-path is refused before anything runs
    # A dry run refuses what the run would: every check that writes nothing comes before it.
    devices = runner.select_devices(flags.gpus) if options is None else []
    for path, flag in ((out, "--out"), (resume, "--resume")):
        if path is not None:
            output_dir(path, flag)
    if resume is not None:
        _recorded_spec(resume)  # an invalid record is refused with what to do, before the lock
    stdout = make_console()
    if flags.dry_run:
        target = resume or out
        if target is not None and target.is_dir():
            runner.check_run_dir(target, spec, resume=resume is not None, force=force, cuda=_cuda(devices))
        import torch

        # A resume keeps its finished rows (`--retry` names those it runs again); it reads, writes nothing.
        warn = make_console(stderr=True)
        kept = (
            runner.resume_plan(cases, resume / rundir.RESULTS, retry, warn)[1] if resume is not None else []
        )
        stdout.print(cases_table(cases, runner.case_fates(cases, cuda=torch.cuda.is_available(), kept=kept)))
        if options is not None:
            stdout.print(f"would submit {cluster.describe(options, len(cases))}")
        return
    run_dir, resuming = runner.resolve_run_dir(spec.name, out, resume)
    with rundir.RunLock(run_dir, warn=lambda line: print(line, file=sys.stderr)):
        forced = runner.check_run_dir(run_dir, spec, resume=resuming, force=force, cuda=_cuda(devices))
        if resuming:
            cluster.settle(run_dir)
        else:
            rundir.write_selection(run_dir, only, seq_lens)
        plan = _Plan(spec, cases, run_dir, resuming, retry, forced, flags, clock, stdout)
        if options is not None:
            _execute_in_jobs(plan, options)
        else:
            _execute_here(plan, devices)


def _with_measurement_flags(spec: Spec, flags: _Flags) -> Spec:
    """`spec` with the measurement settings the flags give, each checked by `tfla_bench.measure.settings`."""
    given = {
        "warmup": flags.warmup,
        "reps": flags.reps,
        "rel_ci": flags.rel_ci,
        "budget_s": flags.budget,
        "timeout_s": flags.timeout,
        "autotune_ms": flags.autotune_ms,
        "l2_flush": flags.l2_flush,
        "cuda_graph": flags.cuda_graph,
        "energy": flags.energy,
        "energy_method": flags.energy_method,
        "energy_s": flags.energy_s,
        "clock": flags.clock,
        "power_cap": flags.power_cap,
        "grad": flags.grad,
    }
    for key, value in given.items():
        if value is not None:
            settings.check(key, value, f"--{FLAG_OF.get(key, key).replace('_', '-')}")
    if not 0 <= flags.precompile <= MAX_PRECOMPILE:
        raise UserError(
            f"--precompile: expected an integer in [0, {MAX_PRECOMPILE}] processes, got {flags.precompile}"
        )
    return spec.with_measurement(**given)


def _check_published(spec: Spec) -> None:
    """A spec's `published` names a data set `compare` can find, before minutes of measuring."""
    if spec.published is None:
        return
    # pandas reads the data sets' names: loaded for a spec that names one.
    from tfla_bench.analyse import published

    try:
        published.resolve(spec.published)
    except UserError as exc:
        raise UserError(f"{spec.source}: key 'published': {exc}") from None


def _cuda(devices: list[str]) -> bool | None:
    """Whether the sweep measures on CUDA here; None when it runs in jobs (`devices` empty), whose
    nodes decide."""
    return devices[0] != "cpu" if devices else None


def _selected_cases(
    spec: Spec, only: list[str] | None, seq_lens: list[int] | None, selection: Path | None = None
) -> list[Case]:
    """The spec's cases of the kernels `only` and the lengths `seq_lens` (None: all of them), given by
    `-k` and `--seq-len`, or read from a resumed run's `selection`, which a refusal then names."""

    def refuse(what: str, flag: str) -> UserError:
        if selection is None:
            return UserError(f"{flag}: {what}")
        return UserError(
            f"{selection}: {what}; it records the cases the run set out to measure: correct it, or pick "
            "them with -k and --seq-len"
        )

    foreign = [name for name in only or () if name not in spec.kernels]
    if foreign and selection is not None:
        raise refuse(f"kernel {foreign[0]!r} is not in spec {spec.name!r} ({', '.join(spec.kernels)})", "-k")
    cases = specs.expand(spec, only or None)
    if not seq_lens:
        return cases
    missing = sorted(set(seq_lens) - {case.seq_len for case in cases})
    if missing:
        known = ", ".join(str(length) for length in sorted({case.seq_len for case in cases}))
        raise refuse(f"{missing[0]} is not a sequence length of spec {spec.name!r} ({known})", "--seq-len")
    return [case for case in cases if case.seq_len in seq_lens]


def _recorded_spec(run_dir: Path) -> Spec:
    """The spec a run directory recorded; a record that is itself invalid (written by an older
    version that let a NaN through, or edited by hand) is refused with how to go on."""
    path = run_dir / rundir.SPEC
    if not path.is_file():
        raise UserError(f"--resume {run_dir}: not a run directory (no {rundir.SPEC})")
    try:
        return runner.load_run_spec(run_dir)
    except UserError as exc:
        raise UserError(
            f"--resume {run_dir}: the run's own record is invalid: {exc}; correct that value in {path} "
            "and resume again, or start a new run with --out"
        ) from None


@dataclass(frozen=True)
class _Plan:
    """A sweep as `_execute` settled it, for running its cases here or in jobs."""

    spec: Spec
    cases: list[Case]
    run_dir: Path
    resuming: bool
    retry: frozenset[str]
    forced: str | None
    flags: _Flags
    clock: phases.PhaseClock
    stdout: Console


def _execute_here(plan: _Plan, devices: list[str]) -> None:
    """Run the cases in this process's workers (after the correctness gate of `--check`, and before
    the profiles of `--ncu`) and print the summary and the time per phase."""
    run_dir, flags, clock, stdout = plan.run_dir, plan.flags, plan.clock, plan.stdout
    failed_check = {}
    if flags.check:
        with clock.phase("gate"):
            failed_check = _gate(sorted({case.kernel for case in plan.cases}), devices[0], run_dir, stdout)
    report = runner.run_sweep(
        plan.spec,
        plan.cases,
        run_dir,
        resume=plan.resuming,
        retry=plan.retry,
        forced=plan.forced,
        devices=devices,
        failed_check=failed_check,
        precompile_processes=flags.precompile,
        roofs=flags.roofs,
        tune=flags.tune,
        clock=clock,
    )
    stdout.print(summary_table(report.rows))
    stdout.print(
        f"{report.dispatched} case(s) run, {report.decided} decided without running, {report.kept} "
        f"kept; {clock.to_dict()['wall_s']:.1f} s; results in {run_dir / rundir.RESULTS}"
    )
    stdout.print(
        "time per phase: "
        + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in clock.phases.items())
        + f"; outside the phases {phases.outside_s(clock.to_dict()):.1f} s"
    )
    ok_rows = [row for row in report.rows if row.status == "ok"]
    if flags.ncu and ok_rows:
        from tfla_bench.cli.profile import profile_run  # the profile command, used with --ncu only

        with clock.phase("profile"):
            profile_run(run_dir, ok_rows, plan.spec, flags.ncu_path, stdout)
        clock.write(run_dir)


def _execute_in_jobs(plan: _Plan, options: cluster.ClusterOptions) -> None:
    """Submit the cases as jobs (`tfla_bench.run.cluster`) and, when it follows them, print the summary."""
    rows = cluster.sweep(
        plan.spec,
        plan.cases,
        plan.run_dir,
        options,
        resume=plan.resuming,
        retry=plan.retry,
        forced=plan.forced,
        precompile=plan.flags.precompile,
        roofs=plan.flags.roofs,
        tune=plan.flags.tune,
        console=plan.stdout,
    )
    if rows is None:
        return
    plan.stdout.print(summary_table(rows))
    plan.stdout.print(
        f"{len(rows)} row(s) of {len(plan.cases)} case(s); {plan.clock.to_dict()['wall_s']:.1f} s; "
        f"results in {plan.run_dir / rundir.RESULTS}"
    )


def _gate(names: list[str], device: str, run_dir: Path, console: Console) -> dict[str, str]:
    """Run the correctness gate on `names` (its worker logs to `<run_dir>/check.log`), keep the verdicts
    as `<run_dir>/check.json`, and return the failing ones with the reason."""
    with check_command.gate_progress(len(names)) as callbacks:
        results = correctness.run_gate(names, device, log_path=run_dir / rundir.CHECK_LOG, **callbacks)
    console.print(check_command.gate_table(results))
    import torch

    gpu = torch.cuda.get_device_name(device) if device.startswith("cuda") else device
    try:
        correctness.write_gate(run_dir / rundir.CHECK, results, gpu)
    except OSError as exc:
        raise UserError(f"cannot write {run_dir / rundir.CHECK}: {exc.strerror}") from None
    return {
        result.name: result.reason
        or f"max relative error {result.max_rel_error:.3g} > tolerance {result.tolerance:.3g}"
        for result in results
        if result.passed is False
    }


def _shape_flag(flag: str, text: str) -> int | list[int]:
    """A shape flag's integers (`_ints`), each within the range a spec's `[shape]` allows."""
    values = _ints(flag, text)
    if not all(specs.shape_integer(value) for value in (values if isinstance(values, list) else [values])):
        raise UserError(f"{flag}: expected {specs.SHAPE_EXPECTED}, got {text!r}")
    return values


def _statuses(text: str | None) -> frozenset[str]:
    """`--retry crashed,timeout` as a set of statuses (and `beside`); a `UserError` naming an unknown one."""
    names = _names([text], "--retry") if text is not None else []
    unknown = [name for name in names if name not in runner.RETRY_CHOICES]
    if unknown or (text is not None and not names):
        raise UserError(f"--retry: expected a comma list of {', '.join(runner.RETRY_CHOICES)}, got {text!r}")
    return frozenset(names)


def _params(entries: list[str]) -> dict[str, Any]:
    """`--param key=value` entries: values parsed as bool, int, float or string; `a,b` is a list."""
    params: dict[str, Any] = {}
    for entry in entries:
        key, sep, text = entry.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--param: expected key=value, got {entry!r}")
        values = [row_schema.parse_param(part.strip()) for part in text.split(",")]
        params[key.strip()] = values[0] if len(values) == 1 else values
    return params
