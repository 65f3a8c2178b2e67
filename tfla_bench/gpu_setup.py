"""Set up a GPU machine in one command (`make gpu`): install the baselines, build the CUDA wheels that
are missing, install them, then list the adapters and run the correctness gate.

    python -m tfla_bench.gpu_setup                       # online: PyPI, and flash-attention cloned
    python -m tfla_bench.gpu_setup --wheelhouse wheelhouse --flash-attn-src ../flash-attention

Steps, each timed:
1. the pure-Python baselines (fla-core, lightning-attn, mlstm-kernels, FlashAttention 4 with its CUTLASS
   DSL, ...) from the wheelhouse (offline) or PyPI, each only where its version is not installed yet;
2. the CUDA wheels whose modules do not import (`CUDA_BUILDS`), built side by side
   (`tfla_bench.cuda_wheels`), a wheel already in the wheelhouse used as it is;
3. those wheels installed over whatever is there: a pure-Python mamba-ssm of the same version stays
   installed otherwise, and `mamba` unavailable;
4. the kernel cache that an earlier machine of this GPU architecture packed into the wheelhouse
   (`tfla_bench.kernel_cache`), unpacked into Triton's cache directory: its kernels need not compile
   here, nor its autotuners time their configs again, nor our kernels' tuned shapes tune again;
5. `tfla-bench check`: every adapter's verdict, and for each one that cannot run here, why.

The wheels it builds stay in the wheelhouse, and it says so: carried to the next machine with it, they
are installed there in seconds instead of built for minutes. A second run finds everything installed
and only checks. FlashAttention 3 builds from flash-attention's
`hopper/` at `FLASH_ATTN_COMMIT` with its cutlass submodule: `--flash-attn-src` (or `FLASH_ATTN_SRC`),
else a clone where the network allows. flash-attn 2 takes about 30 minutes to build and is left out
unless `--with-fa2`.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

FLASH_ATTN_REPO = "https://github.com/Dao-AILab/flash-attention.git"
# The commit FA3 was built and checked from; its csrc/cutlass submodule pins cutlass 7127592.
FLASH_ATTN_COMMIT = "0251105a2fb19d2957484b7f023cd8c115286ced"
# Pure-Python wheels: distribution name and version (None: any).
WHEELS = (
    ("fla-core", "0.6.0"),
    ("lightning-attn", "0.0.5"),
    ("mlstm-kernels", "2.0.6"),
    ("flash-attn-4", "4.0.0b36"),
    ("nvidia-cutlass-dsl", "4.8.1"),
    ("nvidia-cutlass-dsl-libs-base", "4.8.1"),
    ("nvidia-cutlass-dsl-libs-core", "4.8.1"),
    ("quack-kernels", "0.6.5"),
    ("apache-tvm-ffi", "0.1.15.post2"),
    ("torch-c-dlpack-ext", "0.1.5"),
    ("einops", None),
    ("PyYAML", None),
    ("packaging", None),
    ("nvidia-ml-py", None),
)


# FlashAttention 4 and its CUTLASS DSL, besides the DSL's CUDA library wheel (`nvidia-cutlass-dsl-libs-cuN`).
FA4_WHEELS = (
    "flash-attn-4",
    "nvidia-cutlass-dsl",
    "nvidia-cutlass-dsl-libs-base",
    "nvidia-cutlass-dsl-libs-core",
    "quack-kernels",
    "apache-tvm-ffi",
    "torch-c-dlpack-ext",
)


@dataclass(frozen=True)
class CudaBuild:
    """A CUDA-only package: the `tfla_bench.cuda_wheels` name, its wheel's distribution name, and the
    module that imports only when its CUDA extension is installed."""

    package: str
    distribution: str
    module: str


CUDA_BUILDS = (
    CudaBuild("causal-conv1d", "causal_conv1d", "causal_conv1d_cuda"),
    CudaBuild("mamba-ssm", "mamba_ssm", "selective_scan_cuda"),
    CudaBuild("fa3", "flash_attn_3", "flash_attn_interface"),
    CudaBuild("flash-attn", "flash_attn", "flash_attn_2_cuda"),
)

# The source distributions the CUDA builds start from (`make wheelhouse` downloads the same).
SDISTS = {
    "causal-conv1d": "causal-conv1d==1.7.0",
    "mamba-ssm": "mamba-ssm==2.3.2.post1",
    "flash-attn": "flash-attn==2.8.3.post2",
}
Runner = Callable[[Sequence[str]], int]


def run(command: Sequence[str]) -> int:
    """Run a command, its output on ours; its exit code."""
    return subprocess.run(list(command), check=False).returncode


def installed(distribution: str) -> str | None:
    """The installed version of a distribution, or None."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def has_module(name: str) -> bool:
    """Whether a module can be found (without importing it: a CUDA extension may load slowly)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def missing_wheels() -> list[str]:
    """`name==version` (or `name`) of each pure-Python wheel not installed at its version."""
    return [
        f"{name}=={version}" if version else name
        for name, version in WHEELS
        if installed(name) is None or (version is not None and installed(name) != version)
    ]


def cuda_major() -> str:
    """The CUDA major version torch was built with (`13`), for the CUTLASS DSL's CUDA library wheel."""
    import torch  # heavy; only this step needs it

    return (torch.version.cuda or "13").split(".")[0]


def pip(*args: str) -> list[str]:
    return [sys.executable, "-m", "pip", "install", "--no-deps", "-q", *args]


def source_flags(wheelhouse: Path | None) -> list[str]:
    return ["--no-index", "--find-links", str(wheelhouse)] if wheelhouse is not None else []


def in_wheelhouse(wheelhouse: Path, requirement: str) -> bool:
    """Whether the wheelhouse holds a wheel of `name==version` (or of `name`)."""
    name, _, version = requirement.partition("==")
    stem = name.replace("-", "_").lower()
    return any(
        wheel.name.lower().startswith(f"{stem}-{version}".lower() if version else f"{stem}-")
        for wheel in wheelhouse.glob("*.whl")
    )


def install_wheels(wheelhouse: Path | None, runner: Runner) -> str:
    """Step 1; what it did, in a few words. Offline, a wheel the wheelhouse lacks is named, not fatal:
    the adapters that need it stay unavailable, with the reason."""
    wanted = missing_wheels()
    libs = f"nvidia-cutlass-dsl-libs-cu{cuda_major()}"
    if installed(libs) is None:
        wanted.append(libs)
    absent = [w for w in wanted if wheelhouse is not None and not in_wheelhouse(wheelhouse, w)]
    wanted = [w for w in wanted if w not in absent]
    said = [f"not in {wheelhouse}: {', '.join(absent)}"] if absent else []
    if any(w.split("==")[0] in FA4_WHEELS or w == libs for w in absent):
        # Half a CUTLASS DSL (no CUDA library wheel) makes `import cutlass` fail, and mamba-ssm 2.3
        # imports it: install all of FlashAttention 4's wheels or none.
        wanted = [w for w in wanted if w.split("==")[0] not in FA4_WHEELS]
        said.append("FlashAttention 4 left out (its wheels go in together)")
    if not wanted:
        return "; ".join(["every pure-Python baseline is installed", *said])
    if runner(pip(*source_flags(wheelhouse), *wanted)) != 0:
        raise SetupError(f"pip could not install {', '.join(wanted)} (its message is above)")
    return "; ".join([f"installed {', '.join(wanted)}", *said])


def builds_needed(with_fa2: bool) -> list[CudaBuild]:
    """The CUDA builds whose module does not import yet (flash-attn 2 only with `with_fa2`)."""
    return [b for b in CUDA_BUILDS if not has_module(b.module) and (with_fa2 or b.package != "flash-attn")]


def built_wheel(wheelhouse: Path, build: CudaBuild) -> Path | None:
    """A wheel of this CUDA build already in the wheelhouse (built on an earlier run), or None."""
    found = sorted(wheelhouse.glob(f"{build.distribution}-*linux*.whl"))
    return found[-1] if found else None


def flash_attn_source(given: Path | None, work: Path, runner: Runner) -> Path:
    """A flash-attention checkout for FA3: `given`, else a clone at `FLASH_ATTN_COMMIT` in `work`."""
    if given is not None:
        return given
    target = work / "flash-attention"
    if not (target / "hopper" / "setup.py").is_file():
        clone = ["git", "clone", "--filter=blob:none", "--no-checkout", FLASH_ATTN_REPO, str(target)]
        steps = [
            clone,
            ["git", "-C", str(target), "checkout", "-q", FLASH_ATTN_COMMIT],
            ["git", "-C", str(target), "submodule", "update", "--init", "--depth", "1", "csrc/cutlass"],
        ]
        if any(runner(step) != 0 for step in steps):
            raise SetupError(
                "FA3 needs flash-attention's source and no clone was possible here: set "
                f"FLASH_ATTN_SRC to a checkout at {FLASH_ATTN_COMMIT[:8]} with its csrc/cutlass submodule"
            )
    return target


def build_all(builds: list[CudaBuild], wheelhouse: Path, fa_src: Path | None) -> dict[str, str]:
    """Build side by side; each build's outcome (`built`, or its one-line failure)."""
    processes = {}
    for build in builds:
        command = [
            sys.executable,
            "-m",
            "tfla_bench.cuda_wheels",
            build.package,
            "--wheelhouse",
            str(wheelhouse),
        ]
        if build.package == "fa3" and fa_src is not None:
            command += ["--flash-attn-src", str(fa_src)]
        processes[build.package] = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    outcomes = {}
    for package, process in processes.items():
        _, err = process.communicate()
        lines = [line for line in err.splitlines() if line.strip()]
        outcomes[package] = "built" if process.returncode == 0 else (lines or ["failed"])[-1]
    return outcomes


class SetupError(Exception):
    """A step that cannot go on; the message is the one line the user sees."""


def main(argv: list[str] | None = None, runner: Runner = run) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tfla_bench.gpu_setup", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--wheelhouse", type=Path, help="install from this folder, offline (`make wheelhouse`)"
    )
    parser.add_argument("--flash-attn-src", type=Path, default=os.environ.get("FLASH_ATTN_SRC") or None)
    parser.add_argument("--work", type=Path, default=Path("build"), help="where a clone and new wheels go")
    parser.add_argument("--with-fa2", action="store_true", help="also build flash-attn 2 (about 30 minutes)")
    parser.add_argument("--skip-check", action="store_true", help="leave out `tfla-bench check`")
    args = parser.parse_args(argv)
    wheelhouse = args.wheelhouse or args.work / "wheels"
    started = time.perf_counter()
    try:
        step("baselines", lambda: install_wheels(args.wheelhouse, runner))
        step("CUDA wheels", lambda: build_and_install(args, wheelhouse, runner))
        if args.wheelhouse is not None:
            step("kernel cache", lambda: unpack_kernel_cache(args.wheelhouse))
    except SetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if not args.skip_check:
        cli = [
            sys.executable,
            "-c",
            "import sys; from tfla_bench.cli.main import main; sys.exit(main())",
            "check",
        ]
        step("check", lambda: "" if runner(cli) == 0 else "it failed (its message is above)")
    print(f"set-up done in {time.perf_counter() - started:.0f} s")
    return 0


def build_and_install(args: argparse.Namespace, wheelhouse: Path, runner: Runner) -> str:
    """Steps 2 and 3; what they did."""
    needed = builds_needed(args.with_fa2)
    if not needed:
        return "every CUDA extension imports"
    wheelhouse.mkdir(parents=True, exist_ok=True)
    to_build = [b for b in needed if built_wheel(wheelhouse, b) is None]
    sdists = [SDISTS[b.package] for b in to_build if b.package in SDISTS]
    if args.wheelhouse is None and sdists:  # online: the sources come from PyPI
        skip = (
            "MAMBA_SKIP_CUDA_BUILD=TRUE",
            "CAUSAL_CONV1D_SKIP_CUDA_BUILD=TRUE",
            "FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE",
        )
        download = [
            "env",
            *skip,
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
        ]
        if runner([*download, "--no-build-isolation", "-d", str(wheelhouse / "sdist"), *sdists]) != 0:
            raise SetupError(f"pip could not download {', '.join(sdists)}")
    fa_src = None
    if any(b.package == "fa3" for b in to_build):
        fa_src = flash_attn_source(args.flash_attn_src, args.work, runner)
    outcomes = build_all(to_build, wheelhouse, fa_src) if to_build else {}
    wheels = [wheel for b in needed if (wheel := built_wheel(wheelhouse, b)) is not None]
    if wheels and runner(pip("--force-reinstall", "--no-index", *map(str, wheels))) != 0:
        raise SetupError(f"pip could not install {', '.join(w.name for w in wheels)}")
    failed = [f"{package}: {outcome}" for package, outcome in outcomes.items() if outcome != "built"]
    built = [package for package, outcome in outcomes.items() if outcome == "built"]
    done = f"installed {', '.join(w.name for w in wheels)}" if wheels else "nothing installed"
    carry = (
        f"built {', '.join(built)} into {wheelhouse}: carry that folder to the next machine and "
        "`make gpu` installs them there instead of building them"
    )
    return "; ".join([done, *(f"FAILED {line}" for line in failed), *([carry] if built else [])])


def unpack_kernel_cache(wheelhouse: Path) -> str:
    """Step 4, in this process: Triton and torch are installed by now."""
    from tfla_bench import kernel_cache
    from tfla_bench.kernels.config import user_tuned_file

    try:
        arch, _, version = kernel_cache.this_machine()
        cache = kernel_cache.triton_cache_dir()
        return kernel_cache.unpack(wheelhouse, cache, arch, version, user_tuned_file())
    except kernel_cache.CacheError as exc:
        return f"FAILED: {exc}"


def step(name: str, action: Callable[[], str]) -> None:
    """Run one step and print its name, what it did and its time."""
    print(f"== {name}", flush=True)
    began = time.perf_counter()
    said = action()
    print(f"== {name}: {said + '; ' if said else ''}{time.perf_counter() - began:.0f} s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
