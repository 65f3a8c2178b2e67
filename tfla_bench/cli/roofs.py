"""CLI command `roofs`: measure the present GPU's matmul, HBM and L2 roofs and save them for later runs.

Examples::

    tfla-bench roofs
    tfla-bench roofs --device cuda:1 --json
"""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from tfla_bench.cli.options import JsonOption
from tfla_bench.cli.paths import output_file
from tfla_bench.errors import UserError
from tfla_bench.measure import roofs as measured_roofs
from tfla_bench.measure.roofs import MeasuredRoofs
from tfla_bench.model.hardware import detect_accelerator
from tfla_bench.run.console import make_console


def register(app: typer.Typer) -> None:
    """Add `roofs` to the main app."""
    app.command("roofs")(roofs)


def roofs(
    device: Annotated[str, typer.Option("--device", help="the CUDA device to measure")] = "cuda:0",
    as_json: JsonOption = False,
) -> None:
    """Measure dense bf16 matmul, HBM and L2 bandwidth of the GPU; save them per GPU and driver."""
    # torch takes seconds to import; `--help` does not need it.
    import torch

    if not torch.cuda.is_available():
        raise UserError("roofs measures a GPU and needs CUDA; no CUDA device is visible")
    if not device.startswith("cuda"):
        raise UserError(f"--device: expected a CUDA device such as cuda:0, got {device!r}")
    index = torch.device(device).index or 0
    if index >= torch.cuda.device_count():
        raise UserError(f"--device {device}: {torch.cuda.device_count()} CUDA device(s) visible")
    output_file(measured_roofs.cache_path(), "the measured-roofs file")
    result = measured_roofs.measure(device)
    path = measured_roofs.save(result)
    if as_json:
        typer.echo(json.dumps({**result.to_dict(), "saved_to": str(path)}))
        return
    console = make_console()
    console.print(roofs_table(result))
    console.print(f"saved to {path} (key: {result.key})")


def roofs_table(result: MeasuredRoofs) -> Table:
    """Measured roofs beside the data sheet of the GPU (when the model knows it) and their ratio."""
    sheet = detect_accelerator(result.gpu_name)
    title = f"{result.gpu_name}, driver {result.driver}: measured vs " + (
        f"data sheet ({sheet.display_name})" if sheet else "no data sheet (GPU not in the model)"
    )
    table = Table(title=title)
    for column in ("roof", "measured", "data sheet", "measured / data sheet"):
        table.add_column(column, justify="left" if column == "roof" else "right")
    for name, measured, datasheet, unit in measured_roofs.versus_datasheet(result):
        table.add_row(
            name,
            f"{measured:.3g} {unit}",
            f"{datasheet:.3g} {unit}" if datasheet else "",
            f"{measured / datasheet:.2f}" if datasheet else "",
        )
    return table
