"""`pip install .` ships kernels/ and baselines/ inside the tfla_bench namespace, never top-level, and
the published numbers and the experiment specs as package data."""

import subprocess
import sys
import zipfile
from pathlib import Path

from tfla_bench.run import specs

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
    specs_shipped = {Path(name).name for name in names if name.startswith("tfla_bench/experiments/")}
    assert {p.name for p in (REPO / "experiments").glob("*.toml")} <= specs_shipped

    target = tmp_path / "site"
    install = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)]
    subprocess.run(install, check=True, capture_output=True)
    probe = (
        "import tfla_bench.kernels.adapters, tfla_bench.baselines.sdpa_math;"
        "import tfla_bench.analyse.published as p;"
        "print(tfla_bench.kernels.adapters.__file__);"
        "print(p.published_dir()); print(len(p.load_published('tfla_fig5_consttoken_rerun_nh16')));"
        "from tfla_bench.run import specs; print(specs.find_spec('smoke'));"
        "print(','.join(specs.load_spec(specs.find_spec('smoke')).kernels))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env={"PYTHONPATH": str(target)},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    module, data, rows, smoke, kernels = done.stdout.split()
    assert Path(module).is_relative_to(target) and Path(data).is_relative_to(target)
    assert int(rows) > 100  # the Fig. 5 rerun data set, read from the wheel's copy
    assert Path(smoke).is_relative_to(target)  # `tfla-bench sweep smoke` of an installed wheel
    assert tuple(kernels.split(",")) == specs.load_spec(REPO / "experiments" / "smoke.toml").kernels
