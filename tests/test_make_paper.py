"""`make paper`: every paper spec's sweep into one folder, resumed where a stopped call left it."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Stands in for Python: records each sweep's arguments; a sweep given --out starts its run directory
# (spec.json), and the spec named in $FAIL exits 1.
STAND_IN = """#!/bin/sh
shift 2  # -m tfla_bench.cli.main
echo "$@" >> "$LOG"
case " $* " in *" $FAIL "*) exit 1;; esac
while [ $# -gt 0 ]; do
  if [ "$1" = --out ]; then mkdir -p "$2" && echo {} > "$2/spec.json"; fi
  shift
done
"""


def make_paper(
    tmp_path: Path, paper_dir: Path, fail: str = "none", wheelhouse: Path | None = None
) -> tuple[subprocess.CompletedProcess, list[str]]:
    python = tmp_path / "python"
    python.write_text(STAND_IN)
    python.chmod(0o755)
    log = tmp_path / "sweeps.log"
    log.unlink(missing_ok=True)
    done = subprocess.run(
        [
            "make",
            "-s",
            "paper",
            f"PYTHON={python}",
            f"PAPER_DIR={paper_dir}",
            "PRECOMPILE=3",
            "PAPER_SPECS=fig6_chunk_tradeoff fig17_headdim",
            f"WHEELHOUSE={wheelhouse or tmp_path / 'no-wheelhouse'}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "LOG": str(log), "FAIL": fail},
    )
    return done, log.read_text().splitlines()


def test_make_paper_starts_each_spec_then_resumes_the_ones_begun(tmp_path):
    paper = tmp_path / "paper"
    first, sweeps = make_paper(tmp_path, paper, fail="fig17_headdim")
    assert first.returncode != 0
    assert "these sweeps did not finish: fig17_headdim" in first.stdout
    assert sweeps == [
        f"sweep fig6_chunk_tradeoff --out {paper}/fig6_chunk_tradeoff --precompile 3",
        f"sweep fig17_headdim --out {paper}/fig17_headdim --precompile 3",
    ]
    # The stopped spec had not begun its run directory; the finished one is resumed (nothing to run).
    again, sweeps = make_paper(tmp_path, paper)
    assert again.returncode == 0, again.stdout + again.stderr
    assert sweeps == [
        f"sweep --resume {paper}/fig6_chunk_tradeoff --precompile 3",
        f"sweep fig17_headdim --out {paper}/fig17_headdim --precompile 3",
    ]
    third, sweeps = make_paper(tmp_path, paper)
    assert third.returncode == 0 and all(line.startswith("sweep --resume") for line in sweeps)
    assert "make paper: fig17_headdim in" in third.stdout


def test_make_paper_packs_the_kernel_cache_where_a_wheelhouse_is(tmp_path):
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    done, sweeps = make_paper(tmp_path, tmp_path / "paper", fail="fig17_headdim", wheelhouse=wheelhouse)
    assert done.returncode != 0  # a sweep that did not finish still fails the command
    assert sweeps[-1] == f"pack --wheelhouse {wheelhouse}" and len(sweeps) == 3
