"""`pip install .` ships kernels/ and baselines/ inside the tfla_bench namespace, never top-level, and
the published numbers as package data."""

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_wheel_maps_kernels_and_baselines_into_the_namespace(tmp_path):
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", tmp_path]
    subprocess.run([*build, str(REPO)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("tfla_bench-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    sources = {
        f"tfla_bench/{path.relative_to(REPO).as_posix()}"
        for folder in ("kernels", "baselines")
        for path in (REPO / folder).rglob("*.py")
    }
    assert sources <= set(names), f"not shipped: {sorted(sources - set(names))}"
    assert "tfla_bench/kernels/adapters/tfla_sig.py" in names
    assert not [name for name in names if name.split("/")[0] in ("kernels", "baselines")]
    shipped = {Path(name).name for name in names if name.startswith("tfla_bench/published_data/")}
    published = REPO / "results" / "published"
    assert shipped == {p.name for p in published.iterdir() if p.suffix in (".csv", ".md")}

    target = tmp_path / "site"
    install = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)]
    subprocess.run(install, check=True, capture_output=True)
    probe = (
        "import tfla_bench.kernels.adapters, tfla_bench.baselines.sdpa_math;"
        "import tfla_bench.analyse.published as p;"
        "print(tfla_bench.kernels.adapters.__file__);"
        "print(p.published_dir()); print(len(p.load_published('tfla_fig5_consttoken_rerun_nh16')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env={"PYTHONPATH": str(target)},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    module, data, rows = done.stdout.split()
    assert Path(module).is_relative_to(target) and Path(data).is_relative_to(target)
    assert int(rows) > 100  # the Fig. 5 rerun data set, read from the wheel's copy
