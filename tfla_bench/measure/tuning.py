"""Tuning the `KernelConfig` of our mLSTM kernels for one GPU and shape: `tfla-bench tune`; a sweep
on a GPU before it measures, at each shape without a tuned config (`tune_missing`; `--no-tune` skips
it); or `mlstm_tfla` / `mlstm_limit_chunk` at the first call of such a shape, once the user opts in
(`tune_at_first_use`). The timed calls only look the result up.

Each kernel of the chain reads one group of the config's fields (`GROUPS`): the forward output
kernel `fwd`, the dQ/dK/dV kernels `bwd`, the recurrent state kernels `state`. The groups are
searched one after the other (a coordinate search): each over its grid (`grid`), the others at
their best so far; `fwd` is timed in fw, `bwd` and `state` in fwbw.

- Past the grid: each field of the group (`STEPS`, a few beyond the grid's own) is moved one rung
  up or down its ladder (`LADDERS`) from the group's winner, and the best of these neighbours and
  the winner wins; up to `STEP_ROUNDS` times, while a neighbour gains (`steps`). Winners sat at the
  grid's edges on an H200 (2026-12-03, Fig. 17): backward query tiles of 64 in all twelve shapes,
  state blocks of 64 x 128 wherever the head dims allowed, three stages.
- Compiling: before candidates are timed, each runs once at a small shape with the same integer
  specializations as the tuned one (`Shape.small`), in the worker processes of a `Compiler`, kept
  for every search of a command, so the compiling happens side by side and the timing process
  finds the kernels in Triton's cache (`TRITON_CACHE_DIR`, shared by the processes of a machine).
  There a candidate's output and gradients must agree with the default config's (`TOLERANCE`), and
  one that does then runs once at the tuned shape in a worker too, as many side by side as the GPU's
  free memory holds: Triton miscompiled some limit_chunk tile settings on an H200, and an illegal
  memory access breaks the CUDA context of the process it happens in for good, so the tuning process
  runs only what ran in a worker first.
- Correctness: each candidate's fw output and fwbw gradients (q, k, v, i, f) are compared with
  those of the default config, which the GPU tests check against the float64 reference. A
  candidate whose relative RMS difference exceeds `TOLERANCE` is rejected, as is one that fails
  (out of shared memory, an error). The winner is then checked against the float32 chunkwise
  reference (`reference_error`, at a shape of `CHECK_TOKENS` tokens): an error above
  `REFERENCE_SLACK` times the default config's keeps the default.
- 16-bit states: where the winner keeps its chunk states in float32 (`config.float32_states`: every
  limit_chunk config, and mLSTMexp's with more than one forward d_qk block, a workaround of a Triton
  miscompile that struck some configs only), the same config with 16-bit states
  (`KernelConfig.states16`) is compiled and run too. Its fw output and its q, k, v gradients must
  equal the float32-state ones within `STATES_MATCH`, its gate gradients within `GATES_MATCH` (the
  readers cast the states to the input dtype anyway, so a correct compile agrees to the last bits;
  the miscompile was 1e-2 off); it is kept where it is then faster in fwbw.
- TMA loads (TFLA): the winner with its tiles loaded through Hopper tensor descriptors in the
  forward output kernel (`KernelConfig.tma`), in the dQ, dK and dV kernels (`bwd_tma`) and in both,
  where `check_config` takes them: each compiled, held to the winner's own fw output and gradients
  (`TMA_MATCH`: the same tiles, so the same products; only the gate gradients' row sums may add up
  in another order) and timed in fwbw beside it; the fastest is kept. On GPUs with TMA only (sm90
  and later, `tma_available`); `tfla-bench tune --tma-only` runs this stage alone, from the config a
  GPU takes now. There the forward's `tma` is also a field of its group's grid, beside its value
  block `v`, and the backward's `bwd_tma` of its own: the tiles that are fastest with TMA loads are
  not those fastest with pointer loads. On
  an H200, mLSTMexp at Fig. 5's shape screened at 1.669 ms fw with the pointer-load winner's tiles
  (64 x 32 query x key, a 128-wide value block, three stages), 2.279 ms with TMA loads at the same
  tiles, and 1.308 ms with TMA loads at 64 x 64, 256 wide, one stage
  (`results/kernels/tuning-fwd-tfla-exp-B8-NH16-T8192-Dqk128-Dv256-L128.md`). `tfla-bench tune
  --group fwd` searches that group alone, from the config a GPU takes now.
- Timing: the suite's method (`timing.time_calls`): the L2 flushed before each call, a spin ahead
  of it. Every candidate is screened with `SCREEN_RULE` (a few calls); those within `SCREEN_MARGIN`
  of the fastest screen, `FINALISTS` at most, are timed to within +-0.5% or 1 s of calls, and the
  fastest of those wins.

The result is one `config.tuned_entry` per shape, with the default's and the tuned config's median
times; `config.load_tuned` registers such a file, and `config_for` looks the entries up by the GPU's
architecture (or name) and the shape, carrying the nearest tuned shape over to a shape without one.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import multiprocessing
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.pool import Pool
from typing import Any

import torch
import triton

from tfla_bench.adapters import registry
from tfla_bench.adapters.workloads import Case
from tfla_bench.kernels import config as kconfig
from tfla_bench.kernels.config import KernelConfig
from tfla_bench.kernels.reference import mlstm_chunkwise
from tfla_bench.measure import timing

KERNELS = ("tfla", "limit_chunk")
GROUPS = {
    "fwd": ("seq_q", "seq_kv", "v", "num_warps", "num_stages", "tma"),
    "bwd": (
        "bwd_seq_q",
        "bwd_seq_kv",
        "bwd_qk",
        "bwd_num_warps",
        "bwd_num_stages",
        "bwd_fused_kv",
        "bwd_tma",
    ),
    "state": ("state_seq", "state_qk", "state_v", "state_num_warps"),
}
GROUP_MODE = {"fwd": "fw", "bwd": "fwbw", "state": "fwbw"}
# The fields each group steps along past its grid, and the rungs of each field (`steps`).
STEPS = {
    "fwd": ("seq_q", "seq_kv", "qk", "v", "num_warps", "num_stages"),
    "bwd": ("bwd_seq_q", "bwd_seq_kv", "bwd_qk", "bwd_v", "bwd_num_warps", "bwd_num_stages"),
    "state": ("state_seq", "state_qk", "state_v", "state_num_warps", "state_num_stages"),
}
LADDERS = {
    **dict.fromkeys(("seq_q", "seq_kv", "bwd_seq_q", "bwd_seq_kv", "state_seq"), (16, 32, 64, 128, 256)),
    **dict.fromkeys(("qk", "v", "bwd_qk", "bwd_v", "state_qk", "state_v"), (16, 32, 64, 128, 256, 512, 1024)),
    **dict.fromkeys(("num_warps", "bwd_num_warps", "state_num_warps"), (2, 4, 8, 16)),
    **dict.fromkeys(("num_stages", "bwd_num_stages", "state_num_stages"), (1, 2, 3, 4, 5)),
}
STEP_ROUNDS = 3
SCREEN_RULE = timing.StopRule(reps=5)
SCREEN_MARGIN = 0.08
FINALISTS = 4
DEFAULT_PROCESSES = 8
# A candidate's run at the tuned shape in a worker (`Compiler.run`) takes what the default config's
# first calls took in the tuning process, plus `WORKER_BYTES` for the worker's CUDA context and
# Triton's; the runs side by side take at most `PROBE_MEMORY_SHARE` of the GPU's free memory.
WORKER_BYTES = 1 << 30
PROBE_MEMORY_SHARE = 0.7
TOLERANCE = 2e-2
SMALL_CHUNKS = 16  # chunks (and heads) of the compile shape at most, plus one (`specialized_like`)
TUNED_DTYPES = ("bfloat16", "float16")
CHECK_TOKENS = 1024  # tokens of the reference check's sequence (four chunks at least)
# The winner's error against the float32 reference may exceed the default config's by this factor:
# the two configs differ in the order of their roundings, not in what they compute.
REFERENCE_SLACK = 1.5
# 16-bit states give float32 ones' h, dq, dk, dv to the bit, and the gate gradients, whose chunk
# sums read the rounded states, to 5.7e-7 (bfloat16 on an H100, `results/kernels/state-dtype-check-h100.md`;
# 1e-5 in float16 at the CPU tests' small shapes). The miscompile was 1.5e-2 to 9.6e-2 off in each.
STATES_MATCH = 1e-6
GATES_MATCH = 1e-3
# TMA loads give the pointer loads' h to the bit and every gradient to 2.3e-6 (bf16 on an H200 at the
# paper's TFLA shapes, `results/validation/tma-loads-h200-20261204.csv`).
TMA_MATCH = 1e-5
# dK and dV in one kernel are tried up to these head dims (Dqk + Dv): on an H200 (2026-12-03) fwbw took
# 0.95x the split kernels' time at 64 + 64, and 1.29-1.65x at 128 + 256 and 256 + 256 (three tile settings).
FUSED_KV_TRY_DIMS = 256


def specialized_like(count: int) -> int:
    """A count at most `SMALL_CHUNKS` + 1 that a Triton launch specializes as it does `count`: it marks
    an integer argument equal to 1, or divisible by 16, and compiles a variant for each."""
    if count <= SMALL_CHUNKS:
        return count
    return SMALL_CHUNKS if count % 16 == 0 else SMALL_CHUNKS + 1


@dataclass(frozen=True)
class Shape:
    """What a config is tuned for."""

    kernel: str
    gate: str
    batch: int
    heads: int
    seq_len: int
    head_dim_qk: int
    head_dim_v: int
    chunk_size: int
    dtype: torch.dtype = torch.bfloat16

    def small(self) -> Shape:
        """The compile shape: one sequence of at most `SMALL_CHUNKS` + 1 chunks and as many heads,
        where Triton specializes the kernels' integers (chunks, batch*heads) as at this shape
        (`specialized_like`) and the last chunk is as full."""
        L = self.chunk_size
        chunks = specialized_like(-(-self.seq_len // L))
        partial = self.seq_len % L
        seq_len = (chunks - 1) * L + partial if partial else chunks * L
        return dataclasses.replace(
            self, batch=1, heads=specialized_like(self.batch * self.heads), seq_len=seq_len
        )

    def default(self) -> KernelConfig:
        """The kernel's default config at this shape (`config.default_config`)."""
        return kconfig.default_config(
            self.kernel, self.head_dim_qk, self.head_dim_v, self.chunk_size, self.dtype, self.gate
        )

    def config_key(self, target: str) -> tuple:
        """The key of `config.TUNED_CONFIGS` for this shape on the GPUs of `target` (an architecture
        such as `sm90`, or a GPU's name)."""
        return (
            target,
            self.kernel,
            self.head_dim_qk,
            self.head_dim_v,
            self.chunk_size,
            self.dtype,
            self.gate,
        )

    def label(self) -> str:
        return (
            f"{self.kernel} {self.gate} B{self.batch} NH{self.heads} T{self.seq_len} "
            f"Dqk{self.head_dim_qk} Dv{self.head_dim_v} L{self.chunk_size}"
        )


@dataclass(frozen=True)
class Trial:
    """A candidate of a group: its config, its median ms (None: rejected, or screened out), its
    error vs the default config's result, why it was rejected, its screened median, and where it
    came from (`grid`, a `step` past the grid, `states16`: the winner with float32, then 16-bit
    chunk states, its error then vs the float32-state result, or `tma`: the winner with TMA loads,
    its error then vs the winner's result)."""

    group: str
    config: KernelConfig
    median_ms: float | None
    rel_err: float | None
    error: str = ""
    screen_ms: float | None = None
    stage: str = "grid"


@dataclass
class Search:
    """What `tune` found: the best config, every trial (the base first in each group), and the
    seconds spent compiling (`compile`) and checking and timing (`time`)."""

    best: KernelConfig
    trials: list[Trial]
    seconds: dict[str, float] = field(default_factory=lambda: {"compile": 0.0, "time": 0.0})


def grid(shape: Shape, group: str, tma: bool = False) -> dict[str, tuple[int, ...]]:
    """The values tried for each field of `group` (limit_chunk keeps whole-chunk sequence tiles); the
    forward's `tma` and the backward's `bwd_tma` both ways where `tma` (a GPU that loads through
    tensor descriptors)."""
    L = shape.chunk_size
    if shape.kernel == "limit_chunk":
        return {
            "fwd": {"num_warps": (4, 8), "num_stages": (1, 2)},
            "bwd": {"bwd_num_warps": (4, 8), "bwd_num_stages": (1, 2)},
            "state": {"state_qk": (32, 64), "state_v": (64, 128), "state_num_warps": (4, 8)},
        }[group]
    return {
        "fwd": {
            "seq_q": tuple(s for s in (64, 128) if s <= L),
            "seq_kv": tuple(s for s in (32, 64, 128) if s <= L),
            "v": tuple(d for d in (128, 256) if shape.head_dim_v % d == 0)
            or (kconfig.largest_pow2_divisor(shape.head_dim_v, 128),),
            "num_warps": (4, 8),
            "num_stages": (1, 2, 3),
            "tma": (False, True) if tma else (False,),
        },
        "bwd": {
            "bwd_seq_q": tuple(s for s in (32, 64) if s <= L),
            "bwd_seq_kv": tuple(s for s in (32, 64, 128) if s <= L),
            "bwd_qk": tuple(d for d in (128, 256) if shape.head_dim_qk % d == 0)
            or (kconfig.largest_pow2_divisor(shape.head_dim_qk, 128),),
            "bwd_num_warps": (4, 8),
            "bwd_num_stages": (1, 2, 3),
            "bwd_fused_kv": (False, True)
            if shape.head_dim_qk + shape.head_dim_v <= FUSED_KV_TRY_DIMS
            else (False,),
            "bwd_tma": (False, True) if tma else (False,),
        },
        "state": {
            "state_seq": tuple(s for s in (32, 64, 128) if s <= L),
            "state_qk": (32, 64),
            "state_v": (64, 128),
            "state_num_warps": (4, 8),
        },
    }[group]


def candidates(shape: Shape, base: KernelConfig, group: str, tma: bool = False) -> list[KernelConfig]:
    """`base` with `group`'s fields set to every point of its grid (`grid`) that `check_config` accepts
    and, in TFLA's forward, whose warps all hold rows of their own (`idle_warps`); `base` first."""
    values = grid(shape, group, tma)
    found = [base]
    for point in itertools.product(*values.values()):
        candidate = dataclasses.replace(base, **dict(zip(values, point, strict=True)))
        idle = group == "fwd" and shape.kernel == "tfla" and idle_warps(candidate)
        if runs(shape, candidate) and not idle and candidate not in found:
            found.append(candidate)
    return found


def idle_warps(config: KernelConfig) -> bool:
    """Whether TFLA's forward output kernel has more warps than 16-row slices of a query tile of 64
    rows or more (the tiles of Hopper's warpgroup MMA): Triton 3.6 lays the S = Q K^T product of 64
    rows over 8 warps as 128 rows, each row computed twice, and moves the accumulator to another
    layout for the P V product. (A step past the grid may still try such a config.)"""
    return config.seq_q >= 64 and config.num_warps * 16 > config.seq_q


def runs(shape: Shape, config: KernelConfig) -> bool:
    """Whether `config.check_config` accepts `config` at the shape's kernel, head dims and chunk."""
    try:
        kconfig.check_config(shape.kernel, config, shape.head_dim_qk, shape.head_dim_v, shape.chunk_size)
    except ValueError:
        return False
    return True


def steps(shape: Shape, base: KernelConfig, group: str) -> list[KernelConfig]:
    """`base` with one field of `STEPS[group]` moved one rung up or down its ladder, where
    `check_config` accepts it and the chunk states keep their dtype (`config.float32_states`, which
    the forward head-dim block decides for mLSTMexp and which every kernel of the chain reads)."""
    states = kconfig.float32_states(shape.kernel, shape.gate, shape.head_dim_qk, base)
    found = []
    for name in STEPS[group]:
        ladder, value = LADDERS[name], getattr(base, name)
        if value not in ladder:
            continue
        at = ladder.index(value)
        for rung in ladder[max(at - 1, 0) : at + 2]:
            candidate = dataclasses.replace(base, **{name: rung})
            if rung == value or candidate in found or not runs(shape, candidate):
                continue
            if kconfig.float32_states(shape.kernel, shape.gate, shape.head_dim_qk, candidate) == states:
                found.append(candidate)
    return found


def kernel_fn(kernel: str) -> Callable[..., Any]:
    # imports torch at import time, which only this path needs.
    from tfla_bench.kernels.limit_chunk import mlstm_limit_chunk
    from tfla_bench.kernels.tfla import mlstm_tfla

    return {"tfla": mlstm_tfla, "limit_chunk": mlstm_limit_chunk}[kernel]


def make_inputs(shape: Shape, device: str) -> list[torch.Tensor]:
    """q, k, v standard normal, input- and forget-gate pre-activations N(-10, 1) and N(3, 1) in
    float32, all with gradients (seed 0)."""
    generator = torch.Generator(device=device).manual_seed(0)
    B, NH, T = shape.batch, shape.heads, shape.seq_len

    def randn(*size: int, dtype: torch.dtype = shape.dtype, shift: float = 0.0) -> torch.Tensor:
        x = torch.randn(*size, generator=generator, device=device, dtype=torch.float32) + shift
        return x.to(dtype).requires_grad_()

    return [
        randn(B, NH, T, shape.head_dim_qk),
        randn(B, NH, T, shape.head_dim_qk),
        randn(B, NH, T, shape.head_dim_v),
        randn(B, NH, T, dtype=torch.float32, shift=-10.0),
        randn(B, NH, T, dtype=torch.float32, shift=3.0),
    ]


def make_call(shape: Shape, inputs: list[torch.Tensor], config: KernelConfig, mode: str) -> Callable[[], Any]:
    """One call: fw under no_grad (returns h), or fwbw from `h.sum()` (returns None; grads on `inputs`)."""
    fn = kernel_fn(shape.kernel)
    extra = {"gate": shape.gate} if shape.kernel == "tfla" else {}

    def forward() -> torch.Tensor:
        return fn(*inputs, chunk_size=shape.chunk_size, config=config, **extra)

    if mode == "fw":

        def fw() -> torch.Tensor:
            with torch.no_grad():
                return forward()

        return fw

    def fwbw() -> None:
        for x in inputs:
            x.grad = None
        forward().float().sum().backward()

    return fwbw


def outputs(shape: Shape, inputs: list[torch.Tensor], config: KernelConfig, mode: str) -> list[torch.Tensor]:
    """What a candidate is compared on: h (fw), or every input's gradient (fwbw)."""
    result = make_call(shape, inputs, config, mode)()
    if mode == "fw":
        return [result]
    return [x.grad for x in inputs]


def rel_rms(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    """The largest relative RMS difference over the tensors."""
    worst = 0.0
    for a, b in zip(got, want, strict=True):
        a, b = a.double(), b.double()
        worst = max(worst, float((a - b).norm() / b.norm().clamp_min(1e-30)))
    return worst


def reference_error(shape: Shape, config: KernelConfig, device: str) -> float:
    """The largest relative RMS of `config`'s fw output and fwbw gradients against the float32
    chunkwise reference, on one sequence of two heads and `CHECK_TOKENS` tokens (four chunks at least)."""
    small = dataclasses.replace(shape, batch=1, heads=2, seq_len=max(4 * shape.chunk_size, CHECK_TOKENS))
    inputs = make_inputs(small, device)
    got = outputs(small, inputs, config, "fw") + outputs(small, inputs, config, "fwbw")
    wide = [x.detach().float().requires_grad_() for x in inputs]
    h, _ = mlstm_chunkwise(*wide, gate=small.gate, chunk_size=min(64, small.chunk_size))
    h.sum().backward()
    return rel_rms(got, [h.detach(), *(x.grad for x in wide)])


class ContextLost(RuntimeError):
    """This process's CUDA context broke while it ran a candidate: an illegal memory access is
    sticky, so nothing more runs in the process."""


# The note of a candidate whose run broke its process's CUDA context, and the note of one that a
# process broke so was never run: the `Compiler` runs it again in a fresh process.
LOST = "CUDA context lost: "
UNTRIED = "untried: its worker's CUDA context was lost"
RESTARTS = 3


def cuda_alive(device: str) -> bool:
    """Whether this process can still run work on `device`."""
    if not str(device).startswith("cuda"):
        return True
    try:
        torch.ones(1, device=device).add_(1)
        timing.synchronize(device)
    except Exception:  # noqa: BLE001 -- any failure here means the context is gone
        return False
    return True


def _run_both(shape: Shape, config: KernelConfig, device: str) -> list[torch.Tensor]:
    """`config`'s fw output and fwbw gradients at `shape`, on fresh inputs."""
    inputs = make_inputs(shape, device)
    return outputs(shape, inputs, config, "fw") + outputs(shape, inputs, config, "fwbw")


@functools.lru_cache(maxsize=2)
def _default_result(small: Shape, device: str) -> list[torch.Tensor]:
    """The default config's result at a compile shape, once per worker process and shape."""
    return _run_both(small, small.default(), device)


def _compile_one(args: tuple[Shape, KernelConfig, str, bool]) -> str:
    """Worker: run `config` once (fw and fwbw) at the compile shape, where its output and gradients
    must be within `TOLERANCE` of the default config's there; or, with the job's last field (`full`),
    once at the tuned shape itself, unchecked (`Compiler.run`). '' or why not: the error's last line
    (after `LOST` where the run broke the process's CUDA context); `UNTRIED` in a broken process."""
    shape, config, device, full = args
    if not cuda_alive(device):
        return UNTRIED
    note = _attempt(shape, config, device, full)
    if str(device).startswith("cuda") and cuda_alive(device):
        torch.cuda.empty_cache()  # what the run cached goes back to the tuning process and the other workers
    return note


def _attempt(shape: Shape, config: KernelConfig, device: str, full: bool) -> str:
    try:
        if full:
            _run_both(shape, config, device)
            timing.synchronize(device)
            return ""
        small = shape.small()
        err = rel_rms(_run_both(small, config, device), _default_result(small, device))
        timing.synchronize(device)
        if not err <= TOLERANCE:
            return f"{err:.2e} from the default config's result at the compile shape"
        return ""
    except Exception as exc:  # a candidate that does not compile or run is rejected, not fatal
        traceback.print_exc()
        lines = str(exc).strip().splitlines() or [""]
        if cuda_alive(device):  # Triton's compile errors end with what went wrong
            return f"{type(exc).__name__}: {lines[-1]}"
        return f"{LOST}{type(exc).__name__}: {lines[0]}"  # CUDA's errors start with it


def probes_at_once(processes: int, need_bytes: int, device: str) -> int:
    """How many full-shape runs of `need_bytes` each the workers make side by side: as many as
    `PROBE_MEMORY_SHARE` of the GPU's free memory holds, with `WORKER_BYTES` for each worker's own."""
    if not str(device).startswith("cuda"):
        return max(1, processes)
    free, _ = torch.cuda.mem_get_info(device)
    return max(1, min(processes, int(PROBE_MEMORY_SHARE * free) // (need_bytes + WORKER_BYTES)))


class Compiler:
    """Runs candidates in `processes` worker processes started by spawning at the first use and kept
    until the `with` block ends (0: in this process): each once at the compile shape, checked against
    the default config's result there (`_compile_one`), and those that pass once at the tuned shape,
    so the tuning process runs only a candidate that ran there in a worker first. A candidate that
    breaks its worker's CUDA context (an illegal memory access in a kernel that Triton miscompiled: it
    happened at some limit_chunk tile settings on an H200, at the compile shape and at the tuned
    shape) is rejected; the workers are then started anew and the candidates a broken worker left
    untried run in them."""

    def __init__(self, processes: int) -> None:
        self.processes = processes
        self._pool: Pool | None = None

    def __enter__(self) -> Compiler:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()

    def _stop(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None

    def _map(self, jobs: list[tuple[Shape, KernelConfig, str, bool]]) -> list[str]:
        if self.processes <= 0:
            return [_compile_one(job) for job in jobs]
        if self._pool is None:
            self._pool = multiprocessing.get_context("spawn").Pool(self.processes)
        return self._pool.map(_compile_one, jobs, chunksize=1)

    def run(
        self, shape: Shape, configs: list[KernelConfig], device: str, need_bytes: int | None = None
    ) -> list[str]:
        """Every config once at `shape`'s compile shape; then, given `need_bytes` (the GPU memory one
        call at `shape` takes) and worker processes, those that passed once at `shape` itself, as many
        at a time as `probes_at_once` allows: '' or why not, per config."""
        errors = self._jobs(shape, configs, device, False)
        if need_bytes is None or self.processes <= 0:
            return errors
        passed = [i for i, error in enumerate(errors) if not error]
        at_once = probes_at_once(self.processes, need_bytes, device)
        for start in range(0, len(passed), at_once):
            batch = passed[start : start + at_once]
            for i, error in zip(
                batch, self._jobs(shape, [configs[i] for i in batch], device, True), strict=True
            ):
                errors[i] = error
        return errors

    def _jobs(self, shape: Shape, configs: list[KernelConfig], device: str, full: bool) -> list[str]:
        jobs = [(shape, config, device, full) for config in configs]
        errors = [UNTRIED] * len(jobs)
        for _ in range(1 + RESTARTS):
            left = [i for i, error in enumerate(errors) if error == UNTRIED]
            if not left:
                break
            found = self._map([jobs[i] for i in left])
            for i, error in zip(left, found, strict=True):
                errors[i] = error
            broken = [i for i in left if errors[i].startswith(LOST)]
            if self.processes <= 0 and broken:  # this process is the one broken
                note = errors[broken[0]].removeprefix(LOST)
                raise _lost(shape, configs[broken[0]], "compiled", note)
            if any(error == UNTRIED or error.startswith(LOST) for error in found):
                self._stop()
        return errors


def time_call(call: Callable[[], Any], device: str, rule: timing.StopRule) -> float:
    """The suite's median (ms) of `call` (`timing.time_standalone` after 3 warm-up calls)."""
    return timing.time_standalone(call, device, rule=rule, warmup_calls=3, warmup_s=0.0).median_ms


def tune(
    shape: Shape,
    *,
    device: str = "cuda",
    compiler: Compiler | None = None,
    groups: tuple[str, ...] = ("bwd", "state", "fwd"),
    rule: timing.StopRule | None = None,
    on_trial: Callable[[Trial], None] | None = None,
    inputs: list[torch.Tensor] | None = None,
    start: KernelConfig | None = None,
    stages: tuple[str, ...] = ("states16", "tma"),
) -> Search:
    """Coordinate search over `groups` (module docstring) from `start` (default: the default config),
    on `inputs` (default: `make_inputs(shape, device)`), compiling in `compiler` (default:
    `DEFAULT_PROCESSES` worker processes for this search alone); then the 16-bit-state and the TMA
    stages of `stages`."""
    if compiler is None:
        with Compiler(DEFAULT_PROCESSES) as own:
            return tune(
                shape,
                device=device,
                compiler=own,
                groups=groups,
                rule=rule,
                on_trial=on_trial,
                inputs=inputs,
                start=start,
                stages=stages,
            )
    rule = rule or timing.StopRule(rel_ci=0.005, budget_s=1.0, min_reps=10)
    best = start or shape.default()
    cuda = str(device).startswith("cuda")
    held = torch.cuda.memory_allocated(device) if cuda else 0
    inputs = inputs if inputs is not None else make_inputs(shape, device)
    references = {mode: outputs(shape, inputs, best, mode) for mode in ("fw", "fwbw")}
    # the peak of this process since its start, or of these calls: no less than one call takes
    need = torch.cuda.max_memory_allocated(device) - held if cuda else None
    search = Search(best, [])
    tma = shape.kernel == "tfla" and tma_available(device) and kconfig.tma_supported()
    for group in groups:
        configs, tried, stage = candidates(shape, best, group, tma), set(), "grid"
        for _ in range(1 + STEP_ROUNDS):
            round_trials = _round(
                shape, inputs, references, group, configs, stage, compiler, device, rule, search, need
            )
            _record(search, [trial for trial in round_trials if trial.config not in tried], on_trial)
            tried.update(configs)
            winner = _fastest(round_trials, best)
            if stage == "step" and winner == best:
                break
            best, stage = winner, "step"
            configs = [best, *(c for c in steps(shape, best, group) if c not in tried)]
            if len(configs) == 1:
                break
    if "states16" in stages and kconfig.float32_states(shape.kernel, shape.gate, shape.head_dim_qk, best):
        found = _states16(shape, inputs, best, compiler, device, rule, need)
        _record(search, found, on_trial)
        best = _fastest(found, best)
    if "tma" in stages and tma:
        found = _tma(shape, inputs, best, compiler, device, rule, need, search)
        _record(search, found, on_trial)
        best = _fastest(found, best)
    search.best = best
    return search


def _record(search: Search, trials: list[Trial], on_trial: Callable[[Trial], None] | None) -> None:
    search.trials.extend(trials)
    for trial in trials if on_trial is not None else ():
        on_trial(trial)


def _fastest(trials: list[Trial], fallback: KernelConfig) -> KernelConfig:
    """The config of the fastest timed trial, or `fallback` where none was timed."""
    timed = [trial for trial in trials if trial.median_ms is not None]
    return min(timed, key=lambda trial: trial.median_ms).config if timed else fallback


def _states16(
    shape: Shape,
    inputs: list[torch.Tensor],
    best: KernelConfig,
    compiler: Compiler,
    device: str,
    rule: timing.StopRule,
    need_bytes: int | None,
) -> list[Trial]:
    """`best` with 16-bit chunk states, checked against `best`'s float32-state result; where it
    agrees, both timed in fwbw, side by side (module docstring)."""
    candidate = dataclasses.replace(best, states16=True)

    def rejected(err: float | None, note: str) -> list[Trial]:
        return [Trial("state", candidate, None, err, note, stage="states16")]

    (error,) = compiler.run(shape, [candidate], device, need_bytes)
    if error:
        return rejected(None, error)
    try:
        narrow, wide = (
            outputs(shape, inputs, c, "fw") + outputs(shape, inputs, c, "fwbw") for c in (candidate, best)
        )
        # h, dq, dk, dv; then the gate gradients
        err, gates = rel_rms(narrow[:4], wide[:4]), rel_rms(narrow[4:], wide[4:])
        if not (err <= STATES_MATCH and gates <= GATES_MATCH):
            return rejected(
                err, f"{err:.2e} ({gates:.2e} in the gate gradients) from the float32 states' result"
            )
        timed = {c: time_call(make_call(shape, inputs, c, "fwbw"), device, rule) for c in (best, candidate)}
        return [Trial("state", c, timed[c], e, stage="states16") for c, e in ((best, 0.0), (candidate, err))]
    except Exception as exc:  # noqa: BLE001 -- a failure here rejects the candidate like any other
        _check_context(shape, candidate, device, exc)
        return rejected(None, _why(exc))


def tma_available(device: str) -> bool:
    """Whether `device` loads through tensor descriptors (TMA): a CUDA GPU of sm90 or later."""
    return str(device).startswith("cuda") and torch.cuda.get_device_capability(device) >= (9, 0)


def _tma(
    shape: Shape,
    inputs: list[torch.Tensor],
    best: KernelConfig,
    compiler: Compiler,
    device: str,
    rule: timing.StopRule,
    need_bytes: int | None,
    search: Search,
) -> list[Trial]:
    """`best` with every other setting of `tma` and `bwd_tma` that `check_config` takes, each held to
    `best`'s result and, where it agrees, timed in fwbw beside `best` (module docstring); the seconds
    it takes go to `search`'s."""
    settings = [dataclasses.replace(best, tma=fw, bwd_tma=bw) for fw in (False, True) for bw in (False, True)]
    candidates = [c for c in settings if c != best and runs(shape, c)]
    started = time.monotonic()
    errors = compiler.run(shape, candidates, device, need_bytes)
    compiled = time.monotonic()
    search.seconds["compile"] += compiled - started
    trials = []
    try:
        want = outputs(shape, inputs, best, "fw") + outputs(shape, inputs, best, "fwbw")
        timed = time_call(make_call(shape, inputs, best, "fwbw"), device, rule)
        trials.append(Trial("bwd", best, timed, 0.0, stage="tma"))
    except Exception as exc:
        _check_context(shape, best, device, exc)
        raise
    for candidate, error in zip(candidates, errors, strict=True):
        trial = Trial("bwd", candidate, None, None, error, stage="tma")
        if not error:
            try:
                err = rel_rms(
                    outputs(shape, inputs, candidate, "fw") + outputs(shape, inputs, candidate, "fwbw"), want
                )
                if err <= TMA_MATCH:
                    median = time_call(make_call(shape, inputs, candidate, "fwbw"), device, rule)
                    trial = dataclasses.replace(trial, median_ms=median, rel_err=err)
                else:
                    trial = dataclasses.replace(
                        trial, rel_err=err, error=f"{err:.2e} from the result without them"
                    )
            except Exception as exc:  # noqa: BLE001 -- a failure here rejects the candidate like any other
                _check_context(shape, candidate, device, exc)
                trial = dataclasses.replace(trial, error=_why(exc))
        trials.append(trial)
    search.seconds["time"] += time.monotonic() - compiled
    return trials


def _round(
    shape: Shape,
    inputs: list[torch.Tensor],
    references: dict[str, list[torch.Tensor]],
    group: str,
    configs: list[KernelConfig],
    stage: str,
    compiler: Compiler,
    device: str,
    rule: timing.StopRule,
    search: Search,
    need_bytes: int | None,
) -> list[Trial]:
    """Compile and run `configs` in `compiler`'s workers (`Compiler.run`), then check and screen each
    here and time the finalists in full (module docstring)."""
    mode = GROUP_MODE[group]
    started = time.monotonic()
    errors = compiler.run(shape, configs, device, need_bytes)
    compiled = time.monotonic()
    screened = [
        _screen(shape, inputs, references[mode], group, config, mode, error, device, stage)
        for config, error in zip(configs, errors, strict=True)
    ]
    ranked = sorted((t for t in screened if t.screen_ms is not None), key=lambda t: t.screen_ms)
    finalists = [
        t.config for t in ranked[:FINALISTS] if t.screen_ms <= ranked[0].screen_ms * (1 + SCREEN_MARGIN)
    ]
    trials = [
        _final(shape, inputs, trial, mode, device, rule) if trial.config in finalists else trial
        for trial in screened
    ]
    search.seconds["compile"] += compiled - started
    search.seconds["time"] += time.monotonic() - compiled
    return trials


def _screen(
    shape: Shape,
    inputs: list[torch.Tensor],
    reference: list[torch.Tensor],
    group: str,
    config: KernelConfig,
    mode: str,
    error: str,
    device: str,
    stage: str,
) -> Trial:
    """A candidate checked against the default config's result and screened (`SCREEN_RULE`)."""
    if error:
        return Trial(group, config, None, None, error, stage=stage)
    try:
        err = rel_rms(outputs(shape, inputs, config, mode), reference)
        if not err <= TOLERANCE:
            return Trial(group, config, None, err, f"{err:.2e} from the default config's result", stage=stage)
        screen = time_call(make_call(shape, inputs, config, mode), device, SCREEN_RULE)
        return Trial(group, config, None, err, screen_ms=screen, stage=stage)
    except Exception as exc:  # out of resources at the full shape, for instance
        _check_context(shape, config, device, exc)
        return Trial(group, config, None, None, _why(exc), stage=stage)


def _final(
    shape: Shape, inputs: list[torch.Tensor], trial: Trial, mode: str, device: str, rule: timing.StopRule
) -> Trial:
    """A screened candidate timed in full with `rule`."""
    try:
        median = time_call(make_call(shape, inputs, trial.config, mode), device, rule)
        return dataclasses.replace(trial, median_ms=median)
    except Exception as exc:  # noqa: BLE001 -- a failure here rejects the candidate like any other
        _check_context(shape, trial.config, device, exc)
        return dataclasses.replace(trial, error=_why(exc))


def _check_context(shape: Shape, config: KernelConfig, device: str, exc: Exception) -> None:
    """Raise `ContextLost` where the failure of `config` broke this process's CUDA context."""
    if not cuda_alive(device):
        raise _lost(shape, config, "ran", _why(exc)[:120]) from exc


def _lost(shape: Shape, config: KernelConfig, doing: str, note: str) -> ContextLost:
    return ContextLost(
        f"the CUDA context broke while {shape.label()} {doing} a candidate "
        f"({changed_fields(config, shape.default())}: {note}); this process can run no more kernels"
    )


def _why(exc: Exception) -> str:
    """A rejected candidate's note, on one line: the exception's type and the start of its message."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"


def changed_fields(config: KernelConfig, base: KernelConfig) -> str:
    """`field=value` for every field where `config` differs from `base` ('default' when none)."""
    changes = [
        f"{field.name}={getattr(config, field.name)}"
        for field in dataclasses.fields(KernelConfig)
        if getattr(config, field.name) != getattr(base, field.name)
    ]
    return " ".join(changes) or "default"


def markdown(shape: Shape, search: Search, base: KernelConfig, gpu: str) -> str:
    """The trials as a table, fastest first within each group, after the search's seconds."""
    lines = [
        f"Config search for {shape.label()} {str(shape.dtype).removeprefix('torch.')} on {gpu}: "
        f"{len(search.trials)} candidates, {search.seconds['compile']:.0f} s compiling, "
        f"{search.seconds['time']:.0f} s checking and timing "
        f"(`screen ms`: a few calls; `median ms`: the finalists in full, in the group's mode; "
        f"`rel err`: relative RMS vs the default config's result; `stage`: grid, a step past it, the "
        f"winner with float32 then 16-bit chunk states, `rel err` then vs the float32 states' result, or "
        f"the winner with TMA loads, `rel err` then vs the winner's own result)",
        "",
        "| group | mode | stage | config (vs default) | median ms | screen ms | rel err | note |",
        "|---|---|---|---|---:|---:|---:|---|",
    ]

    def order(trial: Trial) -> tuple:
        return (
            trial.median_ms is None,
            trial.median_ms or 0.0,
            trial.screen_ms is None,
            trial.screen_ms or 0.0,
        )

    for group in GROUPS:
        for trial in sorted((t for t in search.trials if t.group == group), key=order):
            ms = f"{trial.median_ms:.3f}" if trial.median_ms is not None else ""
            screen = f"{trial.screen_ms:.3f}" if trial.screen_ms is not None else ""
            err = f"{trial.rel_err:.1e}" if trial.rel_err is not None else ""
            lines.append(
                f"| {group} | {GROUP_MODE[group]} | {trial.stage} | {changed_fields(trial.config, base)} | "
                f"{ms} | {screen} | {err} | {trial.error[:120]} |"
            )
    return "\n".join(lines) + "\n"


def tune_entry(
    shape: Shape,
    target: str,
    gpu: str,
    compiler: Compiler,
    on_trial: Callable[[Trial], None] | None = None,
    device: str = "cuda",
    tma_only: bool = False,
    groups: tuple[str, ...] = (),
) -> tuple[dict, str]:
    """Search one shape on `device`; the tuned-config entry for `target` (with the default's and the
    winner's fw and fwbw medians, measured side by side, and the search's seconds) and the markdown
    table of the search. With `tma_only`, only the TMA stage; with `groups`, only those groups of
    fields and then the stages; both from the config `device` takes now at the shape
    (`config.config_for`)."""
    started = time.monotonic()
    base = shape.default()
    inputs = make_inputs(shape, device)
    start, only = base, {}
    if tma_only or groups:
        key = (shape.kernel, shape.head_dim_qk, shape.head_dim_v, shape.chunk_size, shape.dtype, shape.gate)
        start = kconfig.config_for(*key, kconfig.gpu_target(torch.device(device)))
        only = {"groups": (), "stages": ("tma",)} if tma_only else {"groups": groups}
    search = tune(
        shape, device=device, compiler=compiler, on_trial=on_trial, inputs=inputs, start=start, **only
    )
    best = search.best
    try:
        errors = {
            label: reference_error(shape, config, device)
            for label, config in (("default", base), ("tuned", best))
        }
        if not errors["tuned"] <= REFERENCE_SLACK * errors["default"]:  # the search's start stays
            best = start
            errors["tuned"] = errors["default"] if start == base else reference_error(shape, start, device)
        rule = timing.StopRule(rel_ci=0.005, budget_s=2.0, min_reps=20)
        facts: dict[str, object] = {
            f"{label}_reference_rel_err": float(f"{err:.3g}") for label, err in errors.items()
        }
        for mode in ("fw", "fwbw"):
            for label, config in (("default", base), ("tuned", best)):
                call = make_call(shape, inputs, config, mode)
                facts[f"{label}_{mode}_ms"] = round(time_call(call, device, rule), 4)
    except Exception as exc:
        _check_context(shape, best, device, exc)
        raise
    facts.update(gpu=gpu, batch=shape.batch, heads=shape.heads, seq_len=shape.seq_len)
    facts.update(torch=torch.__version__, triton=triton.__version__)
    facts.update(candidates=len(search.trials), search_s=round(time.monotonic() - started, 1))
    facts.update(compile_s=round(search.seconds["compile"], 1))
    entry = kconfig.tuned_entry(shape.config_key(target), best, **facts)
    return entry, markdown(shape, search, base, gpu)


def shape_of(case: Case) -> Shape | None:
    """The shape to tune for a case of our kernels in bf16 or fp16; None for any other case."""
    adapter = registry.find(case.kernel)
    kernel = getattr(adapter, "config_kernel", None)
    if adapter is None or kernel not in KERNELS or case.dtype not in TUNED_DTYPES:
        return None
    dims = (case.batch, case.num_heads, case.seq_len, case.head_dim_qk, case.head_dim_v)
    return Shape(kernel, adapter.gate, *dims, adapter.chunk(case), getattr(torch, case.dtype))


def untuned(cases: list[Case], gpu: tuple[str, str]) -> list[Shape]:
    """The shapes to tune before measuring `cases` on a GPU (`config.gpu_target`): one per config key
    without an entry for the GPU's name or architecture, at the key's largest case (B*NH*T; among
    equally large ones, as in a sweep at constant tokens, the longest sequence)."""

    def size(shape: Shape) -> tuple[int, int]:
        return shape.batch * shape.heads * shape.seq_len, shape.seq_len

    largest: dict[tuple, Shape] = {}
    for shape in filter(None, map(shape_of, cases)):
        key = shape.config_key("")[1:]
        if kconfig.has_entry(key, gpu):
            continue
        if key not in largest or size(shape) > size(largest[key]):
            largest[key] = shape
    return list(largest.values())


def tune_missing(cases: list[Case], device: str, processes: int, say: Callable[[str], None]) -> list[dict]:
    """Tune every shape of `cases` without an entry for this GPU (`untuned`), on its architecture,
    into the user's tuned-config file, which the workers started afterwards load; the new entries."""
    if not any(map(shape_of, cases)):
        return []
    gpu = kconfig.gpu_target(torch.device(device))
    shapes = untuned(cases, gpu)
    path = kconfig.user_tuned_file()
    entries = []
    with Compiler(processes) as compiler:
        for number, shape in enumerate(shapes, 1):
            say(f"tuning {number}/{len(shapes)}: {shape.label()} on {gpu[1]}")
            try:
                entry, _ = tune_entry(shape, gpu[0], gpu[1], compiler, device=device)
            except ContextLost as exc:  # the sweep's workers measure with the configs it has
                say(f"  {exc}; the {len(shapes) - number + 1} shape(s) left run untuned")
                break
            kconfig.save_entry(path, entry)
            entries.append(entry)
            gain = entry["default_fwbw_ms"] / entry["tuned_fwbw_ms"]
            say(
                f"  fwbw {entry['default_fwbw_ms']:.3f} -> {entry['tuned_fwbw_ms']:.3f} ms ({gain:.2f}x); "
                f"{entry['candidates']} candidates in {entry['search_s']:.0f} s"
            )
    return entries


def tune_at_first_use(enabled: bool = True, processes: int | None = None) -> None:
    """From now on (until called with False), the first call of `mlstm_tfla` or `mlstm_limit_chunk`
    on a GPU at a shape without a tuned config for it (bf16 or fp16, no `config` given) tunes that
    shape first, at the call's batch, heads and length, saves the winner in the user's tuned-config
    file and uses it; later calls, and later processes, look it up. A search takes about a minute;
    `processes` compile its candidates side by side (default: one per CPU, at most 16), started by
    spawning, so a script that opts in keeps its own work under `if __name__ == "__main__":`."""
    workers = processes or min(16, multiprocessing.cpu_count())
    kconfig.set_first_use_tuner(functools.partial(_tune_shape, processes=workers) if enabled else None)


def _tune_shape(
    kernel: str, gate: str, dims: tuple[int, ...], dtype: torch.dtype, device: torch.device, processes: int
) -> None:
    """The search of `tune_at_first_use`: one shape (`dims` = B, NH, T, Dqk, Dv, L), saved and registered."""
    shape = Shape(kernel, gate, *dims, dtype)
    arch, name = kconfig.gpu_target(device)
    with Compiler(processes) as compiler:
        entry, _ = tune_entry(shape, arch, name, compiler, device=str(device))
    kconfig.save_entry(kconfig.user_tuned_file(), entry)
    kconfig.register_tuned(*shape.config_key(arch), KernelConfig(**entry["config"]))
