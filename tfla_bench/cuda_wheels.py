"""Wheels of the baselines that PyPI ships only as CUDA source: causal-conv1d, mamba-ssm, flash-attn 2, and
FlashAttention 3 from a flash-attention checkout's `hopper/` folder.

Each build targets one GPU architecture (the present GPU's, or `--arch`), works offline from an sdist in the
wheelhouse (`make wheelhouse` puts them in `<wheelhouse>/sdist`), writes its wheel into the wheelhouse and
prints how long it took. A build that fails says which package and why (the last line of its log) and exits
1; `make -k cuda-wheels` goes on with the others.

    python -m tfla_bench.cuda_wheels mamba-ssm --wheelhouse wheelhouse
    python -m tfla_bench.cuda_wheels fa3 --wheelhouse wheelhouse --flash-attn-src ../flash-attention

Switches, as their setup scripts read them:
- causal-conv1d, mamba-ssm: `*_FORCE_BUILD=TRUE` (otherwise setup.py tries to download a prebuilt wheel),
  and their hard-coded `-gencode` pairs other than the target architecture are removed from setup.py.
- flash-attn 2: `FLASH_ATTENTION_FORCE_BUILD=TRUE`, `FLASH_ATTN_CUDA_ARCHS=<arch>`.
- FlashAttention 3: Hopper (sm90) only; `FLASH_ATTENTION_DISABLE_*` builds only the dtypes and head dims that
  the benchmarks use (`--fa3-keep`, default bf16 and head dim 128, forward and backward).
- `MAX_JOBS` (default: CPU cores / 2) and `NVCC_THREADS` (default 2) pass through.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

LOG_DIR = "build-logs"
# FlashAttention 3's build switches (hopper/setup.py); `--fa3-keep` names the ones left on.
FA3_SWITCHES = (
    "FP16", "FP8", "SPLIT", "PAGEDKV", "APPENDKV", "LOCAL", "SOFTCAP", "PACKGQA", "VARLEN", "CLUSTER", "SM80",
    "HDIM64", "HDIM96", "HDIM128", "HDIM192", "HDIM256", "HDIMDIFF64", "HDIMDIFF192",
)  # fmt: skip
FA3_KEEP_DEFAULT = ("HDIM128",)


@dataclass(frozen=True)
class SdistPackage:
    """A source-only package built from its sdist: its sdist's file-name prefix and its force-build switch."""

    name: str
    sdist_prefix: str
    force_build_env: str
    patch_gencode: bool


SDIST_PACKAGES = {
    package.name: package
    for package in (
        SdistPackage("causal-conv1d", "causal_conv1d-", "CAUSAL_CONV1D_FORCE_BUILD", patch_gencode=True),
        SdistPackage("mamba-ssm", "mamba_ssm-", "MAMBA_FORCE_BUILD", patch_gencode=True),
        SdistPackage("flash-attn", "flash_attn-", "FLASH_ATTENTION_FORCE_BUILD", patch_gencode=False),
    )
}
PACKAGES = (*SDIST_PACKAGES, "fa3")


class BuildError(Exception):
    """A build that cannot start or that failed; the message is the one line the user sees."""


def present_arch() -> str:
    """The present GPU's compute capability as nvcc spells it (`90` for an H100)."""
    try:
        # only the present GPU's architecture needs torch; --arch builds without it.
        import torch
    except ImportError as exc:
        raise BuildError("torch is not importable: the CUDA builds compile against it") from exc
    if not torch.cuda.is_available():
        raise BuildError("no CUDA GPU is visible: give --arch (e.g. 90) to build without one")
    major, minor = torch.cuda.get_device_capability()
    return f"{major}{minor}"


def keep_only_arch(setup_py: str, arch: str) -> str:
    """`setup_py` with every hard-coded `-gencode arch=compute_N,code=sm_N` pair removed except `arch`'s.

    A removed pair becomes `pass`, so an `if` block that held only that pair stays valid Python.
    """
    pair = re.compile(
        r'cc_flag\.append\("-gencode"\)\s*\n(\s*)cc_flag\.append\("arch=compute_(\d+a?),code=sm_\d+a?"\)'
    )

    def keep(match: re.Match[str]) -> str:
        return match.group(0) if match.group(2).rstrip("a") == arch else "pass\n" + match.group(1) + "pass"

    patched, count = pair.subn(keep, setup_py)
    if count == 0:
        raise BuildError("setup.py has no -gencode pairs to select from (its layout changed)")
    if f"arch=compute_{arch}," not in patched:
        patched = patched.replace(
            "cc_flag = []", f'cc_flag = ["-gencode", "arch=compute_{arch},code=sm_{arch}"]', 1
        )
    return patched


def find_sdist(wheelhouse: Path, package: SdistPackage) -> Path:
    """The package's sdist in `<wheelhouse>/sdist` (the newest when several are there)."""
    found = sorted((wheelhouse / "sdist").glob(f"{package.sdist_prefix}*.tar.gz"))
    if not found:
        raise BuildError(
            f"no {package.sdist_prefix}*.tar.gz in {wheelhouse / 'sdist'}: run `make wheelhouse` first"
        )
    return found[-1]


def build_env(arch: str) -> dict[str, str]:
    """The environment every build shares: parallel jobs, nvcc threads and the target architecture."""
    env = dict(os.environ)
    env.setdefault("MAX_JOBS", str(max(1, (os.cpu_count() or 2) // 2)))
    env.setdefault("NVCC_THREADS", "2")
    env["TORCH_CUDA_ARCH_LIST"] = f"{arch[:-1]}.{arch[-1]}"
    return env


def run_logged(command: list[str], cwd: Path, env: dict[str, str], log: Path) -> None:
    """Run `command`, its output to `log`; a non-zero exit is a `BuildError` quoting the log's last line."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        result = subprocess.run(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
        errors = [line for line in lines if "error" in line.lower()]
        last = (errors or lines or ["(no output)"])[-1].strip()
        raise BuildError(f"exit {result.returncode}: {last[:300]} (log: {log})")


def build_sdist(package: SdistPackage, wheelhouse: Path, arch: str) -> list[Path]:
    """Unpack the sdist, select the architecture, and `pip wheel` it without build isolation."""
    sdist = find_sdist(wheelhouse, package)
    env = build_env(arch) | {package.force_build_env: "TRUE"}
    if package.name == "flash-attn":
        env["FLASH_ATTN_CUDA_ARCHS"] = arch
    with tempfile.TemporaryDirectory(prefix=f"build-{package.name}-") as tmp:
        with tarfile.open(sdist) as archive:
            archive.extractall(tmp, filter="data")
        (source,) = [path for path in Path(tmp).iterdir() if path.is_dir()]
        if package.patch_gencode:
            setup_py = source / "setup.py"
            setup_py.write_text(keep_only_arch(setup_py.read_text(), arch))
        out = Path(tmp) / "wheels"
        command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
        run_logged(
            [*command, "--wheel-dir", str(out), str(source)],
            source,
            env,
            wheelhouse / LOG_DIR / f"{package.name}.log",
        )
        return move_wheels(out, wheelhouse)


def build_fa3(src: Path | None, wheelhouse: Path, arch: str, keep: tuple[str, ...]) -> list[Path]:
    """FlashAttention 3 from `<src>/hopper` with every switch but `keep` disabled (sm90 only)."""
    if arch != "90":
        raise BuildError(f"FlashAttention 3 is built for Hopper (sm90) only, not sm{arch}")
    if src is None:
        raise BuildError(
            "give the flash-attention checkout: FLASH_ATTN_SRC=... (its hopper/ and csrc/cutlass)"
        )
    hopper = src / "hopper"
    if not (hopper / "setup.py").is_file():
        raise BuildError(
            f"{hopper / 'setup.py'} does not exist: FLASH_ATTN_SRC must be a flash-attention checkout"
        )
    if not (src / "csrc" / "cutlass" / "include" / "cute").is_dir():
        raise BuildError(
            f"{src / 'csrc/cutlass'} is empty: check out its cutlass submodule at the pinned commit"
        )
    unknown = sorted(set(keep) - set(FA3_SWITCHES))
    if unknown:
        raise BuildError(f"unknown --fa3-keep {', '.join(unknown)}; known: {', '.join(FA3_SWITCHES)}")
    if not (src / "README.md").exists():
        (src / "README.md").write_text("")  # hopper/setup.py reads ../README.md as its long description
    env = build_env(arch) | {"FLASH_ATTENTION_FORCE_BUILD": "TRUE"}
    env |= {f"FLASH_ATTENTION_DISABLE_{name}": "TRUE" for name in FA3_SWITCHES if name not in keep}
    with tempfile.TemporaryDirectory(prefix="build-fa3-") as tmp:
        command = [sys.executable, "setup.py", "bdist_wheel", "--dist-dir", tmp]
        run_logged(command, hopper, env, wheelhouse / LOG_DIR / "fa3.log")
        return move_wheels(Path(tmp), wheelhouse)


def move_wheels(built: Path, wheelhouse: Path) -> list[Path]:
    """Move the built wheels into the wheelhouse, replacing other wheels of the same distribution (one
    version of each: `pip install wheelhouse/*.whl` refuses two)."""
    moved = []
    for wheel in sorted(built.glob("*.whl")):
        distribution = wheel.name.split("-")[0]
        for old in wheelhouse.glob(f"{distribution}-*.whl"):
            print(f"  replacing {old.name}")
            old.unlink()
        target = wheelhouse / wheel.name
        shutil.move(wheel, target)
        moved.append(target)
    if not moved:
        raise BuildError(f"the build produced no wheel in {built}")
    return moved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tfla_bench.cuda_wheels", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("package", choices=PACKAGES)
    parser.add_argument("--wheelhouse", type=Path, default=Path("wheelhouse"))
    parser.add_argument(
        "--arch", help="compute capability without the dot (90 for H100); default: the present GPU"
    )
    parser.add_argument("--flash-attn-src", type=Path, help="a flash-attention checkout, for fa3")
    parser.add_argument(
        "--fa3-keep", default=",".join(FA3_KEEP_DEFAULT), help="FA3 switches left enabled (comma-separated)"
    )
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        arch = args.arch or present_arch()
        args.wheelhouse.mkdir(parents=True, exist_ok=True)
        print(f"building {args.package} for sm{arch} ...", flush=True)
        if args.package == "fa3":
            keep = tuple(name.strip().upper() for name in args.fa3_keep.split(",") if name.strip())
            wheels = build_fa3(args.flash_attn_src, args.wheelhouse, arch, keep)
        else:
            wheels = build_sdist(SDIST_PACKAGES[args.package], args.wheelhouse, arch)
    except BuildError as exc:
        print(f"FAILED {args.package} after {time.perf_counter() - start:.0f} s: {exc}", file=sys.stderr)
        return 1
    for wheel in wheels:
        size_mb = wheel.stat().st_size / 1e6
        print(f"built {args.package} in {time.perf_counter() - start:.0f} s: {wheel} ({size_mb:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
