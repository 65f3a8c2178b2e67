"""Tables fit the reader's window: 80 columns in a log or a pipe, the terminal's width in a terminal,
with no cell cut short."""

import io

import pandas as pd
import pytest
from rich.console import Console

from tfla_bench.adapters.workloads import Case
from tfla_bench.measure.row import ResultRow
from tfla_bench.run.console import FittedTable, print_frame, print_install_hints, split_reason, summary_table


def wide_frame() -> pd.DataFrame:
    kernels = ["mlstm_kernels_limit", "mamba2_split_conv", "tfla_sig"]
    frame = pd.DataFrame({"kernel": kernels, "mode": ["fw", "fwbw", "fw"], "dtype": ["bfloat16"] * 3})
    for index in range(12):
        frame[f"measure_{index}"] = [1.2345 * (index + 1), 22.5, 0.001234]
    frame["empty"] = [None] * 3
    return frame


def printed(renderable, *, terminal: bool = False, width: int = 160) -> str:
    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=terminal, color_system=None)
    console.print(renderable)
    return out.getvalue()


def test_a_wide_frame_in_a_log_is_split_into_parts_of_80_columns(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    text = printed(FittedTable(wide_frame(), "title"))
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in text and "empty" not in text  # no cell cut short; the empty column left out
    parts = [line.rstrip() for line in lines if line.startswith("title (")]
    assert len(parts) >= 2 and parts[0] == f"title (1/{len(parts)})"
    assert text.count("mlstm_kernels_limit") == len(parts)  # each part repeats the kernel column
    for index in range(12):
        assert f"measure_{index}" in text
    assert "every row has dtype: bfloat16" in text
    assert "COLUMNS=250" in text


def test_a_wide_terminal_shows_the_frame_whole(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    text = printed(FittedTable(wide_frame(), "title"), terminal=True, width=250)
    assert "(1/" not in text and "mlstm_kernels_limit" in text and "dtype" in text
    assert max(len(line) for line in text.splitlines()) <= 250


def test_print_frame_of_a_narrow_frame_is_one_table(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    out = io.StringIO()
    print_frame(Console(file=out, width=160), pd.DataFrame({"kernel": ["a"], "ratio": [0.5]}), "t")
    assert "(1/" not in out.getvalue() and "0.5" in out.getvalue()


@pytest.mark.parametrize("seq_lens", [(128, 256), tuple(2**n for n in range(9, 17))])
def test_the_sweeps_closing_table_fits_80_columns_in_a_log(monkeypatch, seq_lens):
    monkeypatch.delenv("COLUMNS", raising=False)
    rows = [
        ResultRow(
            case=Case("mlstm_kernels_limit", mode, "bfloat16", 65536 // t, t, 16, 128, 256, 64),
            family="mlstm",
            status="ok" if t < 65536 else "crashed",
            median_ms=123.456 * t / 512,
        )
        for t in seq_lens
        for mode in ("fw", "fwbw")
    ]
    text = printed(summary_table(rows))
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text and all(str(t) in text for t in seq_lens)


def test_an_install_hint_is_split_from_its_reason_only_when_the_parentheses_hold_it_whole():
    assert split_reason("fla-core not installed (pip install fla-core==0.6.0)") == (
        "fla-core not installed",
        "pip install fla-core==0.6.0",
    )
    tfla = "CUDA not available (no GPU visible); TRITON_INTERPRET=1 runs it on the CPU (slow)"
    assert split_reason(tfla) == (tfla, "")
    assert split_reason("needs CUDA") == ("needs CUDA", "")


def test_install_hints_are_one_unwrapped_line_per_command():
    out = io.StringIO()
    command = (
        "MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE pip install --no-build-isolation mamba-ssm==2.3.2"
    )
    reasons = {name: f"mamba-ssm not installed ({command})" for name in ("mamba", "mamba2")}
    print_install_hints(Console(file=out, width=80), {**reasons, "sdpa_cudnn": "needs CUDA"})
    assert out.getvalue().splitlines() == ["how to install:", f"  mamba, mamba2: {command}"]


def test_the_dry_runs_table_of_cases_folds_to_80_columns_in_a_log(monkeypatch):
    from tfla_bench.run.console import cases_table

    monkeypatch.delenv("COLUMNS", raising=False)
    cases = [
        Case("mlstm_kernels_limit", "fwbw", "bfloat16", 8, 8192, 16, 128, 256, 64, params={"gate": "sig"})
    ]
    reason = "unsupported: " + "a reason long enough to fold over several lines of the table " * 2
    text = printed(cases_table(cases, {cases[0].key: reason}))
    assert max(len(line) for line in text.splitlines()) <= 80 and "…" not in text
