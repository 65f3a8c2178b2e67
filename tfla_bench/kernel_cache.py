"""Triton's kernel cache carried from one GPU machine to the next in the wheelhouse, as the CUDA wheels are.

Triton compiles a kernel at its first call and keeps the binary in its cache directory
(`TRITON_CACHE_DIR`, else `~/.triton/cache`). The sweep's workers keep there the autotuners' choices
too (`worker.AUTOTUNE_CACHE_ENV`), FlashAttention 4's CuTe DSL kernels (`worker.CUTE_CACHE_FOLDER`)
and the precompile's record of what it compiled (`precompile.DONE_FILE`). On a bare machine the
paper's sweeps spend much of their time filling it: compiling, and autotuners timing every config at
each shape (docs/results-h200.md).

    python -m tfla_bench.kernel_cache pack --wheelhouse wheelhouse     # after the sweeps (`make paper`)
    python -m tfla_bench.kernel_cache unpack --wheelhouse wheelhouse   # on the next machine (`make gpu`)

- `pack` writes the directory into one archive in the wheelhouse, named for the GPU architecture and
  the Triton version (`kernel-cache-sm90-triton3.6.0.tar.xz`), with a manifest (`MANIFEST`: where,
  when and on which GPU it was packed). It leaves out the intermediate code that Triton writes beside
  each binary (`INTERMEDIATE`) and never reads when it loads a kernel from the cache.
- `unpack` puts the archive whose architecture and Triton version are this machine's into its cache
  directory, keeping the files that are there, and points Triton's index files (`__grp__*.json`,
  which name their files by absolute path) at the new place.
- Our kernels' tuned configs travel with it: `pack` adds the user's tuned-config file
  (`kernels.config.user_tuned_file`, where `tfla-bench tune` and `sweep --tune` save), and `unpack`
  adds its entries to this machine's file, keeping an entry already there for the same shape. A
  shape tuned on one machine is then looked up, not tuned again, on the next of its architecture.

Triton loads a carried kernel only where it computes the same key for it: the same source, Triton
build, options and target; anything else compiles as before. An autotuner's carried choice was timed
on the machine that packed it, a GPU of the same architecture, and a sweep records in `env.json`
which archive its cache came from (`worker.carried_kernel_cache`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tfla_bench.measure.worker import KERNEL_CACHE_MANIFEST as MANIFEST
from tfla_bench.measure.worker import triton_cache_dir

PREFIX = "kernel-cache-"
SUFFIX = ".tar.xz"
# What Triton writes beside each binary and reads only while compiling: its IRs and the PTX.
INTERMEDIATE = frozenset({".ttir", ".ttgir", ".llir", ".ptx", ".source"})
GROUP_PREFIX = "__grp__"
TUNED_MEMBER = "tfla-bench-tuned-configs.json"  # the user's tuned configs, beside the manifest


class CacheError(Exception):
    """A pack or unpack that cannot be done, said in one line."""


def archive_name(arch: str, triton_version: str) -> str:
    return f"{PREFIX}{arch}-triton{triton_version}{SUFFIX}"


def this_machine() -> tuple[str | None, str, str]:
    """This machine's GPU architecture (`sm90`; None without a CUDA GPU), GPU name and Triton's version."""
    import torch
    import triton

    from tfla_bench.kernels.config import gpu_target

    if not torch.cuda.is_available():
        return None, "", triton.__version__
    arch, gpu = gpu_target(torch.device("cuda"))
    return arch, gpu, triton.__version__


def _kept(cache: Path) -> list[Path]:
    """The cache's files that loading needs, relative to it, the manifest left to `pack`."""
    return sorted(
        path.relative_to(cache)
        for path in cache.rglob("*")
        if (path.is_file() and not path.is_symlink())
        and path.suffix not in INTERMEDIATE
        and path.name not in (MANIFEST, TUNED_MEMBER)
        and path.name != "lock"
    )


def _tar(args: list[str]) -> None:
    done = subprocess.run(["tar", *args], env=os.environ | {"XZ_OPT": "-T0"}, capture_output=True, text=True)
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()
        raise CacheError(f"tar {args[0]} failed: {said[0] if said else f'exit code {done.returncode}'}")


def _tuned_entries(path: Path | None) -> list[dict]:
    """The entries of a tuned-config file ([] where there is none)."""
    if path is None or not path.exists():
        return []
    try:
        entries = json.loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CacheError(f"{path}: not a tuned-config file ({exc})") from None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise CacheError(f"{path}: not a tuned-config file (not a list of entries)")
    return entries


def pack(
    wheelhouse: Path, cache: Path, arch: str, triton_version: str, gpu: str, tuned: Path | None = None
) -> str:
    """Write `cache`, and the tuned-config file `tuned` where there is one, into the wheelhouse's
    archive for `arch` and `triton_version`; what it wrote."""
    if not cache.is_dir():
        raise CacheError(f"no Triton cache at {cache}: nothing compiled here yet")
    files = _kept(cache)
    if not files:
        raise CacheError(f"the Triton cache at {cache} holds no compiled kernel")
    entries = _tuned_entries(tuned)
    wheelhouse.mkdir(parents=True, exist_ok=True)
    archive = wheelhouse / archive_name(arch, triton_version)
    size = sum((cache / f).stat().st_size for f in files)
    manifest = {
        "arch": arch,
        "triton": triton_version,
        "gpu": gpu,
        "packed_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "packed_from": str(cache),
        "files": len(files),
        "bytes": size,
        "tuned_configs": len(entries),
    }
    with tempfile.TemporaryDirectory() as tmp:
        listing = Path(tmp) / "files"
        listing.write_text("".join(f"{f}\n" for f in files))
        (Path(tmp) / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        beside = [MANIFEST]
        if entries:
            (Path(tmp) / TUNED_MEMBER).write_text(json.dumps(entries, indent=1) + "\n")
            beside.append(TUNED_MEMBER)
        partial = archive.with_name(archive.name + ".partial")
        _tar(["-cJf", str(partial), "-C", tmp, *beside, "-C", str(cache), "--files-from", str(listing)])
        partial.replace(archive)
    configs = f" and {len(entries)} tuned configs of {tuned}" if entries else ""
    return (
        f"packed {len(files)} files ({size / 1e6:.0f} MB) of {cache}{configs} into {archive} "
        f"({archive.stat().st_size / 1e6:.0f} MB): carry the wheelhouse to the next {arch} machine "
        "and `make gpu` unpacks it there"
    )


def _repoint_groups(cache: Path) -> int:
    """Point every index file's paths at the folder it lies in; how many it rewrote."""
    rewritten = 0
    for group in cache.rglob(f"{GROUP_PREFIX}*.json"):
        try:
            record = json.loads(group.read_text())
            children = record["child_paths"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not Triton's: left as it is
        moved = {name: str(group.parent / Path(path).name) for name, path in children.items()}
        if moved != children:
            group.write_text(json.dumps(record | {"child_paths": moved}))
            rewritten += 1
    return rewritten


def unpack(
    wheelhouse: Path, cache: Path, arch: str | None, triton_version: str, tuned: Path | None = None
) -> str:
    """Put the wheelhouse's archive for this machine into `cache`, and the tuned configs it carries
    into the tuned-config file `tuned`; what it did, in one line."""
    archives = sorted(wheelhouse.glob(f"{PREFIX}*{SUFFIX}"))
    if not archives:
        return f"no {PREFIX}*{SUFFIX} in {wheelhouse}: every kernel compiles here"
    if arch is None:
        return f"no CUDA GPU here: {', '.join(a.name for a in archives)} left in {wheelhouse}"
    archive = wheelhouse / archive_name(arch, triton_version)
    if not archive.exists():
        return (
            f"none for {arch} with Triton {triton_version} in {wheelhouse} "
            f"(it holds {', '.join(a.name for a in archives)}): every kernel compiles here"
        )
    cache.mkdir(parents=True, exist_ok=True)
    _tar(["-xJf", str(archive), "-C", str(cache), "--skip-old-files"])
    _repoint_groups(cache)
    kernels = sum(1 for _ in cache.rglob(f"{GROUP_PREFIX}*.json"))
    configs = ""
    member = cache / TUNED_MEMBER
    if member.exists():
        carried = _tuned_entries(member)
        member.unlink()
        if tuned is not None and carried:
            from tfla_bench.kernels.config import merge_entries

            try:
                added = merge_entries(tuned, carried)
            except (OSError, ValueError, TypeError, AttributeError) as exc:
                raise CacheError(
                    f"{tuned}: not a tuned-config file ({exc}); the kernels are unpacked"
                ) from None
            configs = f"; {added} of its {len(carried)} tuned configs added to {tuned}"
    try:
        manifest = json.loads((cache / MANIFEST).read_text())
        source = f", packed on {manifest['gpu']} at {manifest['packed_at']}"
    except (OSError, ValueError, KeyError):
        source = ""
    return f"unpacked {archive.name} into {cache}: it holds {kernels} kernels now{source}{configs}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tfla_bench.kernel_cache", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("action", choices=("pack", "unpack"))
    parser.add_argument("--wheelhouse", type=Path, default=Path("wheelhouse"))
    args = parser.parse_args(argv)
    began = time.perf_counter()
    try:
        from tfla_bench.kernels.config import user_tuned_file

        arch, gpu, version = this_machine()
        cache, tuned = triton_cache_dir(), user_tuned_file()
        if args.action == "unpack":
            said = unpack(args.wheelhouse, cache, arch, version, tuned)
        elif arch is None:
            raise CacheError("no CUDA GPU here: a kernel cache is packed where its kernels compiled")
        else:
            said = pack(args.wheelhouse, cache, arch, version, gpu, tuned)
    except CacheError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"kernel cache: {said}; {time.perf_counter() - began:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
