"""`KernelConfig`: the tile sizes and launch settings of our mLSTM kernels, and where they come from.

One frozen dataclass serves both kernels, `"tfla"` (`mlstm_tfla`) and `"limit_chunk"`
(`mlstm_limit_chunk`). `config_for` resolves the config of one call: a tuned config registered for
the GPU's architecture (or its name) and the shape (`register_tuned`), else the nearest tuned shape
that can run this one (`adapted`), else `default_config`. Both are cached per shape key, so a call
pays one dictionary lookup. A shape is tuned inside a call only where the user opted in
(`set_first_use_tuner`): at its first call, before anything is launched.

TFLA defaults, chosen from per-kernel timings on an H100 80GB HBM3 (bf16, Dqk 128, Dv 256, L 128,
8 sequences x 16 heads of 8192 steps, fwbw):
- forward output kernel: `seq_q x seq_kv` = `min(L, 128) x min(L, 64)`, 8 warps, 2 stages; float32
  inputs keep `min(L, 64)` tiles (twice the shared memory per element);
- head-dim blocks `qk`, `v` (also `bwd_qk`, `bwd_v`): the largest power of two dividing the head dim,
  at most 128 (64 for float32);
- backward dQ/dK/dV kernels: `min(L, 32) x min(L, 64)` tiles, 4 warps, 2 stages;
- recurrent kernels: the state is split into `state_qk x state_v` = 32 x 128 blocks (largest powers of
  two dividing the head dims, at most those); each program walks a chunk `state_seq` (`min(L, 64)`)
  steps at a time, with 4 warps.

limit_chunk keeps a whole chunk in one tile: its sequence tiles are `L`, and its recurrent kernels
take a chunk per step (`state_one_tile`; a smaller `state_seq` without it).
Its head-dim blocks follow the on-chip rule. A program of its parallel kernels keeps, with `e` bytes
per input element and the head-dim blocks `B_dqk`, `B_dhv` of its loops:

- output kernel: the float32 scores and their gated copy in the input dtype, `(4 + e) L^2`, the
  float32 output block `4 L B_dhv`, the `Q, K, V` tiles `e (2 L B_dqk + L B_dhv)` and one state block
  loaded in float32 and cast, `(4 + e) B_dqk B_dhv`;
- gradient kernel: `P` and `dP` in the input dtype plus one float32 `L x L` accumulator,
  `(4 + 2e) L^2`, the float32 `dQ, dK` blocks `8 L B_dqk`, their operand tiles
  `e (2 L B_dqk + 2 L B_dhv)` and two state blocks `2 (4 + e) B_dqk B_dhv`.

Both must fit the 228 KiB of shared memory of an H100 SM (which is also below its 256 KiB register
file). The default halves each kernel's head-dim blocks (from `BLOCK_CAPS`) until its program fits; a
chunk for which even 16 x 16 blocks do not fit is unsupported (`unsupported_reason`). The head dims
themselves never hit the limit (the kernels loop over them), so for 16-bit inputs chunk sizes 16 to
128 run at any head dims (Dqk/Dv = 128/256 and 256/512 included) and 256 needs 512 KiB for its
`L x L` tiles alone; for float32 inputs the largest chunk is 64.
"""

import dataclasses
import importlib.metadata
import json
import math
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path

import torch

from tfla_bench.kernels.contract import is_power_of_two

KERNELS = ("tfla", "limit_chunk")
SRAM_BYTES = 228 * 1024  # shared memory of one H100 (sm90) streaming multiprocessor
MIN_BLOCK = 16  # tl.dot's smallest operand dimension
MIN_FILL_BLOCK = 32  # `filled_state_blocks` halves no state block below this
# dK and dV in one kernel keep both accumulators, [B_Lkv, Dqk] and [B_Lkv, Dv], on chip
FUSED_KV_DIMS = 512
# The largest head-dim blocks (B_dqk, B_dhv) each limit_chunk kernel starts from, by input element
# size. The gradient kernel loads two state blocks and two tiles per loop step beside its L x L
# tiles, so its d_hv block starts smaller.
BLOCK_CAPS = {"output": {2: (64, 128), 4: (32, 64)}, "gradient": {2: (64, 64), 4: (32, 32)}}


@dataclass(frozen=True)
class KernelConfig:
    """Tile sizes (powers of two >= 16) and launch settings of the mLSTM kernels.

    Attributes:
        seq_q, seq_kv: `B_Lhq`, `B_Lkv`, query- and key/value-row tiles of the forward output kernel.
        qk, v: `B_dqk`, `B_dhv`, head-dim blocks of the forward output kernel (dividing `Dqk`, `Dv`).
        num_warps, num_stages: warps and software-pipelining stages of the forward output kernel.
        bwd_seq_q, bwd_seq_kv, bwd_qk, bwd_v, bwd_num_warps, bwd_num_stages: the same for the
            parallel gradient kernels (dQ, dK, dV).
        state_seq: steps per tile of the recurrent state kernels.
        state_qk, state_v: state rows and columns per recurrent-kernel program (dividing `Dqk`, `Dv`).
        state_num_warps, state_num_stages: warps and stages of the recurrent kernels.
        state_one_tile: the recurrent kernels take a whole chunk per step (`state_seq` = `L`) with no
            inner loop over its tiles, so their pipeline prefetches the next chunk's tiles.
        bwd_fused_kv: TFLA computes dK and dV in one kernel over the whole head dims, building each
            gate matrix once for both (head dims powers of two, `Dqk + Dv` at most `FUSED_KV_DIMS`);
            else one kernel per gradient and `bwd_qk` / `bwd_v` block.
        tma, bwd_tma: TFLA's forward output kernel (`tma`), its dQ kernel and its dK and dV kernels
            (`bwd_tma`; not the fused one) load their tiles and state blocks through Hopper tensor
            descriptors (TMA, sm90 and later) instead of pointers. `bwd_tma` needs `bwd_seq_q <=
            bwd_seq_kv`, so that every query tile of the dK and dV kernels ends within its chunk. A
            call whose inputs' addresses are not multiples of 16 bytes loads through pointers.
        states16: the chunk states (and their gradients, which overwrite them) stay in the 16-bit
            input dtype where `float32_states` would widen them. Set only by a tuning search, where the
            16-bit-state kernels gave the float32-state result at this config and shape on the GPU
            (`tfla_bench.measure.tuning`); `adapted` drops it, and so does `load_tuned` for an entry
            tuned under another Triton version.
    """

    seq_q: int
    seq_kv: int
    qk: int
    v: int
    bwd_seq_q: int
    bwd_seq_kv: int
    bwd_qk: int
    bwd_v: int
    state_seq: int
    state_qk: int
    state_v: int
    num_warps: int = 4
    num_stages: int = 2
    bwd_num_warps: int = 4
    bwd_num_stages: int = 2
    state_num_warps: int = 4
    state_num_stages: int = 3
    state_one_tile: bool = False
    bwd_fused_kv: bool = False
    states16: bool = False
    tma: bool = False
    bwd_tma: bool = False


def largest_pow2_divisor(n: int, cap: int) -> int:
    return min(n & -n, cap)


def element_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def on_chip_bytes(kernel: str, chunk_size: int, block_qk: int, block_v: int, element_bytes: int) -> int:
    """Bytes one program of a limit_chunk parallel kernel keeps on chip (module docstring: the rule).

    Args:
        kernel: `"output"` (the forward output kernel) or `"gradient"` (the dQ/dK/dV kernel).
        chunk_size: `L`.
        block_qk: `B_dqk`.
        block_v: `B_dhv`.
        element_bytes: bytes per input element (2 for bfloat16/float16, 4 for float32).
    """
    L, bk, bv, e = chunk_size, block_qk, block_v, element_bytes
    if kernel == "output":
        return (4 + e) * L * L + 4 * L * bv + e * (2 * L * bk + L * bv) + (4 + e) * bk * bv
    return (4 + 2 * e) * L * L + 8 * L * bk + e * (2 * L * bk + 2 * L * bv) + 2 * (4 + e) * bk * bv


def _fitting_blocks(
    kernel: str, chunk_size: int, head_dim_qk: int, head_dim_v: int, element_bytes: int
) -> tuple[int, int]:
    """The largest head-dim blocks (from `BLOCK_CAPS`, halving the larger) that fit `SRAM_BYTES`."""
    cap_qk, cap_v = BLOCK_CAPS[kernel][element_bytes]
    qk = largest_pow2_divisor(head_dim_qk, cap_qk)
    v = largest_pow2_divisor(head_dim_v, cap_v)
    while on_chip_bytes(kernel, chunk_size, qk, v, element_bytes) > SRAM_BYTES and max(qk, v) > MIN_BLOCK:
        if v >= qk:
            v //= 2
        else:
            qk //= 2
    return qk, v


def _needed_bytes(chunk_size: int, head_dim_qk: int, head_dim_v: int, element_bytes: int) -> int:
    """On-chip bytes of the larger of limit_chunk's two parallel kernels, each with its fitting blocks."""
    needed = 0
    for kernel in BLOCK_CAPS:
        blocks = _fitting_blocks(kernel, chunk_size, head_dim_qk, head_dim_v, element_bytes)
        needed = max(needed, on_chip_bytes(kernel, chunk_size, *blocks, element_bytes))
    return needed


def max_chunk_size(head_dim_qk: int, head_dim_v: int, dtype: torch.dtype) -> int:
    """limit_chunk's largest power-of-two chunk size within the on-chip rule (128 for 16-bit inputs, 64
    for float32).

    Args:
        head_dim_qk: `Dqk` (a multiple of 16).
        head_dim_v: `Dv` (a multiple of 16).
        dtype: the input dtype.
    """
    e = element_bytes(dtype)
    chunk = MIN_BLOCK
    while _needed_bytes(2 * chunk, head_dim_qk, head_dim_v, e) <= SRAM_BYTES:
        chunk *= 2
    return chunk


def unsupported_reason(chunk_size: int, head_dim_qk: int, head_dim_v: int, dtype: torch.dtype) -> str | None:
    """Why limit_chunk cannot run this chunk size (its on-chip limit), or None.

    Args:
        chunk_size: `L`, a power of two >= 16.
        head_dim_qk: `Dqk` (a multiple of 16).
        head_dim_v: `Dv` (a multiple of 16).
        dtype: the input dtype.
    """
    e = element_bytes(dtype)
    needed = _needed_bytes(chunk_size, head_dim_qk, head_dim_v, e)
    if needed <= SRAM_BYTES:
        return None
    tiles_kib = (4 + 2 * e) * chunk_size * chunk_size // 1024
    return (
        f"limit_chunk keeps one whole L x L intra-chunk tile per program: chunk_size {chunk_size} "
        f"with {str(dtype).removeprefix('torch.')} inputs needs {needed // 1024} KiB on chip "
        f"({tiles_kib} KiB for the L x L tiles alone) > {SRAM_BYTES // 1024} KiB of shared memory of an "
        f"H100 SM; the largest chunk_size that fits is {max_chunk_size(head_dim_qk, head_dim_v, dtype)} "
        "(the TFLA kernel tiles the chunk and has no such limit)"
    )


def _tfla_default(head_dim_qk: int, head_dim_v: int, chunk_size: int, dtype: torch.dtype, gate: str):
    wide = dtype != torch.float32
    dim_cap = 128 if wide else 64
    seq = min(chunk_size, 64)
    qk = largest_pow2_divisor(head_dim_qk, dim_cap)
    v = largest_pow2_divisor(head_dim_v, dim_cap)
    # mLSTMexp at Dqk 256: one d_qk block, so its chunk states stay 16-bit (`float32_states`). H100,
    # B8 NH8 T8192 Dv512, L256: fw 4.50 ms and fwbw 13.94 ms, where two blocks with float32 states took
    # 5.78 and 18.90 ms; a second stage of its 128-row query tiles does not fit in shared memory.
    one_block = gate == "exp" and wide and head_dim_qk == 2 * dim_cap
    bwd_qk = qk  # at most 128: one block of 256 made mLSTMexp's dK kernel move 2.8 GB more (ncu, H100)
    if one_block:
        qk = head_dim_qk
    return KernelConfig(
        seq_q=min(chunk_size, 128) if wide else seq,
        seq_kv=seq,
        qk=qk,
        v=v,
        num_warps=8 if seq * max(qk, v) >= 64 * 128 else 4,
        num_stages=1 if one_block and chunk_size >= 128 else 2,
        bwd_seq_q=min(chunk_size, 32),
        bwd_seq_kv=seq,
        bwd_qk=bwd_qk,
        bwd_v=v,
        bwd_num_warps=4,
        bwd_num_stages=2,
        state_seq=seq,
        # 32 x 128 state blocks also at few heads: at 2 x 16 heads of 32768 steps they took 8.70 ms fwbw
        # against 10.04 ms with 32 x 32 blocks (H100), though they leave fewer programs.
        state_qk=largest_pow2_divisor(head_dim_qk, 32),
        state_v=largest_pow2_divisor(head_dim_v, 128),
        state_num_warps=4,
    )


def _limit_chunk_default(head_dim_qk: int, head_dim_v: int, chunk_size: int, dtype: torch.dtype):
    e = element_bytes(dtype)
    qk, v = _fitting_blocks("output", chunk_size, head_dim_qk, head_dim_v, e)
    bwd_qk, bwd_v = _fitting_blocks("gradient", chunk_size, head_dim_qk, head_dim_v, e)
    L = chunk_size
    return KernelConfig(
        seq_q=L,
        seq_kv=L,
        qk=qk,
        v=v,
        # H100, bf16, 128/256, L 64: the output kernel took 1.71 ms with 4 warps against 2.38 ms with 8.
        num_warps=4 if L <= 64 else 8,
        # A second buffer of the loop operands (Q, K and a float32 state block) fits beside the
        # L x L tiles up to L = 64; the gradient kernel's loops load two state blocks and two tiles
        # per step, which would double its shared memory, and run only a few steps anyway.
        num_stages=2 if L <= 64 else 1,
        bwd_seq_q=L,
        bwd_seq_kv=L,
        bwd_qk=bwd_qk,
        bwd_v=bwd_v,
        bwd_num_warps=4 if L <= 32 else 8,
        bwd_num_stages=1,
        state_seq=L,
        state_qk=largest_pow2_divisor(head_dim_qk, 64),
        state_v=largest_pow2_divisor(head_dim_v, 64),
        state_num_warps=4,
        state_one_tile=True,
    )


@lru_cache(maxsize=256)
def default_config(
    kernel: str, head_dim_qk: int, head_dim_v: int, chunk_size: int, dtype: torch.dtype, gate: str = "exp"
) -> KernelConfig:
    """The default config of a kernel at a shape (module docstring); head dims are multiples of 16.

    Args:
        kernel: `"tfla"` or `"limit_chunk"`.
        head_dim_qk: `Dqk`.
        head_dim_v: `Dv`.
        chunk_size: `L`.
        dtype: input dtype (float32 tiles are smaller).
        gate: `"exp"` or `"sig"` (TFLA's forward kv tile differs; limit_chunk is mLSTMexp only).
    """
    if kernel == "tfla":
        return _tfla_default(head_dim_qk, head_dim_v, chunk_size, dtype, gate)
    if kernel == "limit_chunk":
        return _limit_chunk_default(head_dim_qk, head_dim_v, chunk_size, dtype)
    raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")


# Tuned configs by (target, kernel, Dqk, Dv, L, dtype, gate), where the target is a GPU architecture
# (`sm90`: every Hopper GPU) or, for an entry that serves one GPU model only, its name. Filled by an
# offline tuning run (`tfla_bench.measure.tuning`) through `register_tuned`, never inside a timed
# call; `TUNED_FILE` and the user's file (`user_tuned_file`) are loaded on import.
TUNED_CONFIGS: dict[tuple[str, str, int, int, int, torch.dtype, str], KernelConfig] = {}
KEY_FIELDS = ("target", "kernel", "head_dim_qk", "head_dim_v", "chunk_size", "dtype", "gate")
TUNED_FILE = Path(__file__).with_name("tuned_configs.json")
TUNED_FILE_ENV = "TFLA_BENCH_TUNED_CONFIGS"
# A chunk size other than the tuned one changes every sequence tile; a head dim only the head-dim
# blocks, which the kernels loop over. So a tuned shape's distance counts a chunk step as four.
CHUNK_STEP_WEIGHT = 4


def register_tuned(
    target: str,
    kernel: str, head_dim_qk: int, head_dim_v: int, chunk_size: int, dtype: torch.dtype, gate: str,
    config: KernelConfig,
) -> None:  # fmt: skip
    """Use `config` for this kernel and shape on the GPUs of `target`: an architecture (`sm90`) or
    a GPU's name (`torch.cuda.get_device_name`), which wins over its architecture."""
    check_config(kernel, config, head_dim_qk, head_dim_v, chunk_size)
    TUNED_CONFIGS[(target, kernel, head_dim_qk, head_dim_v, chunk_size, dtype, gate)] = config
    config_for.cache_clear()


@lru_cache(maxsize=16)
def gpu_target(device: torch.device) -> tuple[str, str]:
    """A CUDA device's architecture and name, `("sm90", "NVIDIA H200")`: what `config_for` looks
    tuned configs up by; `("", "")` for any other device."""
    if device.type != "cuda":
        return "", ""
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm{major}{minor}", torch.cuda.get_device_name(device)


def adapted(
    kernel: str, config: KernelConfig, head_dim_qk: int, head_dim_v: int, chunk_size: int, dtype: torch.dtype
) -> KernelConfig | None:
    """A config tuned at another shape carried over to this one, or None where it cannot run here:
    sequence tiles at most the chunk (the whole chunk for limit_chunk), head-dim blocks the largest
    powers of two that divide the head dims and are at most the tuned blocks."""
    whole_chunk = kernel == "limit_chunk"
    seq = {
        name: chunk_size if whole_chunk else min(getattr(config, name), chunk_size)
        for name in ("seq_q", "seq_kv", "bwd_seq_q", "bwd_seq_kv")
    }
    state_seq = chunk_size if config.state_one_tile else min(config.state_seq, chunk_size)
    dims = {
        name: largest_pow2_divisor(head_dim_v if name.endswith("v") else head_dim_qk, getattr(config, name))
        for name in ("qk", "v", "bwd_qk", "bwd_v", "state_qk", "state_v")
    }
    # 16-bit states were checked at the tuned shape's own compiled kernels only; TMA loads were timed
    # there only (and land in shared memory, which other head dims may fill up)
    candidate = dataclasses.replace(
        config, **seq, **dims, state_seq=state_seq, states16=False, tma=False, bwd_tma=False
    )
    try:
        check_config(kernel, candidate, head_dim_qk, head_dim_v, chunk_size)
    except ValueError:
        return None
    e = element_bytes(dtype)
    on_chip = (
        on_chip_bytes("output", chunk_size, candidate.qk, candidate.v, e),
        on_chip_bytes("gradient", chunk_size, candidate.bwd_qk, candidate.bwd_v, e),
    )
    if whole_chunk and max(on_chip) > SRAM_BYTES:
        return None
    return candidate


def _distance(key: tuple, head_dim_qk: int, head_dim_v: int, chunk_size: int) -> float:
    _, _, dqk, dv, chunk, _, _ = key
    steps = abs(math.log2(dqk / head_dim_qk)) + abs(math.log2(dv / head_dim_v))
    return steps + CHUNK_STEP_WEIGHT * abs(math.log2(chunk / chunk_size))


def _shortfall(key: tuple, head_dim_qk: int, head_dim_v: int) -> float:
    """How far the tuned shape's head dims fall below these (doublings): `adapted` cuts head-dim
    blocks to fit but never widens them, so an entry tuned at smaller head dims brings blocks
    smaller than these dims need (for mLSTMexp a d_qk block below the head dim also turns on float32
    states). Among equally near shapes the one with the least shortfall wins."""
    _, _, dqk, dv, _, _, _ = key
    return max(0.0, math.log2(head_dim_qk / dqk)) + max(0.0, math.log2(head_dim_v / dv))


@lru_cache(maxsize=256)
def config_for(
    kernel: str, head_dim_qk: int, head_dim_v: int, chunk_size: int, dtype: torch.dtype, gate: str,
    gpu: tuple[str, str],
) -> KernelConfig:  # fmt: skip
    """The config of one call on a GPU (`gpu_target`): the entry tuned for this GPU's name at this
    shape, else the entry for its architecture, else the nearest tuned shape of the same kernel,
    gate and dtype on this GPU or architecture that can run here (`adapted`; among equally near ones,
    the one tuned at head dims no smaller than these, `_shortfall`), else `default_config`.
    """
    arch, name = gpu
    shape = (kernel, head_dim_qk, head_dim_v, chunk_size, dtype, gate)
    for target in (name, arch):
        if target and (target, *shape) in TUNED_CONFIGS:
            return TUNED_CONFIGS[(target, *shape)]
    nearby = sorted(
        (
            (
                _distance(key, head_dim_qk, head_dim_v, chunk_size),
                _shortfall(key, head_dim_qk, head_dim_v),
                key[0] != name,
                str(key),
                config,
            )
            for key, config in TUNED_CONFIGS.items()
            if key[0] in (name, arch) and key[0] and (key[1], key[5], key[6]) == (kernel, dtype, gate)
        ),
        key=lambda item: item[:4],
    )
    for *_, config in nearby:
        carried = adapted(kernel, config, head_dim_qk, head_dim_v, chunk_size, dtype)
        if carried is not None:
            return carried
    return default_config(kernel, head_dim_qk, head_dim_v, chunk_size, dtype, gate)


def filled_state_blocks(config: KernelConfig, heads: int, head_dim_qk: int, head_dim_v: int, sms: int):
    """`config` with its recurrent kernels' state blocks halved, the key block first, then the value
    block, none below `MIN_FILL_BLOCK`, while their grid, `heads` (B x NH) times the blocks of a
    state, would leave more than half of the `sms` SMs without a program.

    Each program walks all chunks of its sequence one after the other, so a call of few heads leaves
    SMs idle: B 1 x NH 16 with 64 x 128 blocks is 64 programs on 132 SMs. At Fig. 5's T 65,536 on an
    H100, 32 x 128 blocks (128 programs) took the fwbw from 7.03 to 6.52 ms (mLSTMsig) and from 7.36 to
    6.79 ms (mLSTMexp), more than 64 x 64; at T 32,768 (128 programs of 64 x 128) every split was
    slower, so the rule stops at half the SMs (`experiments/state_blocks.py`,
    `results/kernels/state-blocks-h100.csv`; on an H200, `docs/results-h200.md`). Halving a block
    reads the other operand once more, and the reductions run over the chunk's steps: h, dq, dk and
    dv are the same at any blocks."""
    qk, v = config.state_qk, config.state_v
    programs = heads * (head_dim_qk // qk) * (head_dim_v // v)
    while 2 * programs <= sms and max(qk, v) >= 2 * MIN_FILL_BLOCK:
        programs *= 2
        if qk >= 2 * MIN_FILL_BLOCK:
            qk //= 2
        else:
            v //= 2
    if (qk, v) == (config.state_qk, config.state_v):
        return config
    return dataclasses.replace(config, state_qk=qk, state_v=v)


@lru_cache(maxsize=16)
def sm_count(device: torch.device) -> int:
    """The SMs of a CUDA device, 0 elsewhere (the interpreter fills no grid)."""
    if device.type != "cuda":
        return 0
    return torch.cuda.get_device_properties(device).multi_processor_count


def has_entry(shape: tuple, gpu: tuple[str, str]) -> bool:
    """Whether an entry was tuned at exactly `shape` (a key of `TUNED_CONFIGS` without its target:
    kernel, head dims, chunk, dtype, gate) for this GPU's name or architecture (`gpu_target`)."""
    return any(target and (target, *shape) in TUNED_CONFIGS for target in gpu)


# Run at the first call of a shape without a tuned config for its GPU (`tune_first_use`): called with
# the kernel, the gate, (B, NH, T, Dqk, Dv, L), the dtype and the device; it registers the winner.
FirstUseTuner = Callable[[str, str, tuple[int, ...], torch.dtype, torch.device], None]
FIRST_USE_DTYPES = (torch.bfloat16, torch.float16)
_first_use: list[FirstUseTuner] = []


def set_first_use_tuner(tuner: FirstUseTuner | None) -> None:
    """Tune each new shape at its first call with `tuner` (`tfla_bench.measure.tuning.tune_at_first_use`
    sets the suite's search), or, with None, never."""
    _first_use[:] = [tuner] if tuner is not None else []


def tune_first_use(
    kernel: str, gate: str, dims: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> None:
    """Where a first-use tuner is set, the call is on a GPU in bf16 or fp16 and no entry was tuned at
    this shape (`dims` = B, NH, T, Dqk, Dv, L) for the GPU: tune it now. A search that fails leaves
    the config as `config_for` picks it, with a warning."""
    gpu = gpu_target(device)
    shape = (kernel, *dims[3:], dtype, gate)
    if not _first_use or not gpu[0] or dtype not in FIRST_USE_DTYPES or has_entry(shape, gpu):
        return
    try:
        _first_use[0](kernel, gate, dims, dtype, device)
    except Exception as exc:  # noqa: BLE001 -- a user's call goes on with the config it had
        warnings.warn(f"tuning {kernel} {gate} at {dims} failed, its config is kept: {exc}", stacklevel=3)


def float32_states(kernel: str, gate: str, head_dim_qk: int, config: KernelConfig) -> bool:
    """Whether the kernel keeps its chunk states in float32 in HBM; else in the 16-bit input dtype,
    which its readers cast them to anyway (`tfla_bench.kernels.common`).

    Float32 where 16-bit states met a Triton 3.6 miscompile on an H100 (`experiments/state_dtype_check.py`,
    `results/kernels/state-dtype-check-h100.md`): the output kernel fed 16-bit state blocks straight
    into its products returned h 9-25x further from the float32 reference (2.1e-2 to 6e-2 against
    2.4e-3 relative RMS) at limit_chunk's default config for Dqk = Dv = 512 and at the mLSTMexp TFLA
    default config for Dqk 256 (two d_qk blocks), while the same configs with float32 states, and at
    every swept config the mLSTMsig kernel and the single-block mLSTMexp kernel with 16-bit states,
    agreed with the float32-state result (h, dq, dk, dv to the bit; the gate gradients, whose chunk
    sums read the rounded states, within 5.7e-7). So: limit_chunk always, mLSTMexp TFLA whenever its
    output kernel loops over more than one d_qk block; unless the config is a tuned one whose 16-bit
    states were checked on the GPU (`KernelConfig.states16`).
    """
    if config.states16:
        return False
    return kernel == "limit_chunk" or (gate == "exp" and head_dim_qk > config.qk)


def check_config(
    kernel: str, config: KernelConfig, head_dim_qk: int, head_dim_v: int, chunk_size: int
) -> None:
    """Raise ValueError unless `config` runs `kernel` at these head dims and chunk size."""
    if not isinstance(config, KernelConfig):
        raise ValueError(f"config must be a KernelConfig, got {type(config).__name__}")
    whole_chunk = ("seq_q", "seq_kv", "bwd_seq_q", "bwd_seq_kv") if kernel == "limit_chunk" else ()
    for name in whole_chunk:
        if getattr(config, name) != chunk_size:
            raise ValueError(
                f"config.{name} must be chunk_size={chunk_size} (limit_chunk keeps the whole chunk in one "
                f"tile), got {getattr(config, name)}"
            )
    if config.bwd_fused_kv and not (
        kernel == "tfla"
        and is_power_of_two(head_dim_qk)
        and is_power_of_two(head_dim_v)
        and head_dim_qk + head_dim_v <= FUSED_KV_DIMS
    ):
        raise ValueError(
            f"config.bwd_fused_kv needs the TFLA kernel and head dims that are powers of two with Dqk + Dv "
            f"<= {FUSED_KV_DIMS}, got {kernel} Dqk {head_dim_qk} Dv {head_dim_v}"
        )
    if (config.tma or config.bwd_tma) and kernel != "tfla":
        raise ValueError(f"config.tma and config.bwd_tma are options of the TFLA kernel, not of {kernel}")
    if (config.tma or config.bwd_tma) and not tma_supported():
        raise ValueError(
            "config.tma and config.bwd_tma need tensor descriptors (triton.tools.tensor_descriptor), "
            f"which Triton {_triton_version()} lacks"
        )
    if config.bwd_tma and config.bwd_seq_q > config.bwd_seq_kv:
        raise ValueError(
            f"config.bwd_tma needs bwd_seq_q <= bwd_seq_kv, got {config.bwd_seq_q} > {config.bwd_seq_kv}"
        )
    if config.state_one_tile and config.state_seq != chunk_size:
        raise ValueError(
            f"config.state_seq must be chunk_size={chunk_size} with state_one_tile, got {config.state_seq}"
        )
    for name in ("seq_q", "seq_kv", "bwd_seq_q", "bwd_seq_kv", "state_seq"):
        size = getattr(config, name)
        if not (is_power_of_two(size) and MIN_BLOCK <= size <= chunk_size):
            raise ValueError(
                f"config.{name} must be a power of two in [16, chunk_size={chunk_size}], got {size}"
            )
    for name in ("qk", "v", "bwd_qk", "bwd_v", "state_qk", "state_v"):
        dim = head_dim_v if name.endswith("v") else head_dim_qk
        size = getattr(config, name)
        if not (is_power_of_two(size) and size >= MIN_BLOCK and dim % size == 0):
            raise ValueError(
                f"config.{name} must be a power of two >= 16 dividing the head dim {dim}, got {size}"
            )
    for field in fields(KernelConfig):
        value = getattr(config, field.name)
        if field.name.endswith("num_warps") and not is_power_of_two(value):
            raise ValueError(f"config.{field.name} must be a power of two, got {value}")
        if field.name.endswith("num_stages") and value < 1:
            raise ValueError(f"config.{field.name} must be at least 1, got {value}")


def tuned_entry(key: tuple, config: KernelConfig, **facts: object) -> dict:
    """One entry of a tuned-config file: `key` (a key of `TUNED_CONFIGS`, in the order of `KEY_FIELDS`),
    the config, and `facts` (timings, versions) kept for the reader."""
    entry = dict(zip(KEY_FIELDS, key, strict=True))
    entry["dtype"] = str(entry["dtype"]).removeprefix("torch.")
    return {**entry, "config": dataclasses.asdict(config), **facts}


def load_tuned(path: Path) -> int:
    """Register every entry of a tuned-config file (a JSON list of `tuned_entry`); returns how many.

    Raises:
        ValueError: the file is not such a list, or an entry's config does not run its shape.
    """
    try:
        entries = json.loads(Path(path).read_text(encoding="utf-8-sig"))
        for entry in entries:
            key = [getattr(torch, entry[name]) if name == "dtype" else entry[name] for name in KEY_FIELDS]
            config = KernelConfig(**entry["config"])
            if config.states16 and entry.get("triton") != _triton_version():
                config = dataclasses.replace(config, states16=False)  # checked with another compiler
            if not tma_supported():
                config = dataclasses.replace(config, tma=False, bwd_tma=False)
            register_tuned(*key, config)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path}: not a tuned-config file ({exc})") from None
    return len(entries)


@lru_cache(maxsize=1)
def tma_supported() -> bool:
    """Whether this Triton builds tensor descriptors on the host (`triton.tools.tensor_descriptor`);
    entries tuned with TMA loads take pointer loads where it does not (`load_tuned`)."""
    import importlib.util

    return importlib.util.find_spec("triton.tools.tensor_descriptor") is not None


@lru_cache(maxsize=1)
def _triton_version() -> str | None:
    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return None


def save_entry(path: Path, entry: dict) -> None:
    """Put `entry` (a `tuned_entry`) into the tuned-config file at `path`, replacing the entry of the
    same key. Processes started afterwards load it (`tuned_files`)."""
    entries = json.loads(path.read_text(encoding="utf-8-sig")) if path.exists() else []
    key = [entry[name] for name in KEY_FIELDS]
    _write_entries(path, [e for e in entries if [e.get(name) for name in KEY_FIELDS] != key] + [entry])


def merge_entries(path: Path, entries: list[dict]) -> int:
    """Add to the tuned-config file at `path` each of `entries` whose key it lacks, keeping its own
    entries where the keys meet; how many it added."""
    have = json.loads(path.read_text(encoding="utf-8-sig")) if path.exists() else []
    keys = {tuple(e.get(name) for name in KEY_FIELDS) for e in have}
    added = [e for e in entries if tuple(e.get(name) for name in KEY_FIELDS) not in keys]
    if added:
        _write_entries(path, have + added)
    return len(added)


def _write_entries(path: Path, entries: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Whole or not at all: a file cut short would leave every entry of it unused.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(entries, indent=1) + "\n")
    os.replace(tmp, path)


def user_tuned_file() -> Path:
    """Where `tfla-bench tune` keeps the entries it adds, loaded after (and over) `TUNED_FILE`:
    `$TFLA_BENCH_TUNED_CONFIGS`, else `tfla-bench/tuned_configs.json` in the user's cache folder."""
    override = os.environ.get(TUNED_FILE_ENV)
    if override:
        return Path(override)
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "tfla-bench" / "tuned_configs.json"


def tuned_files() -> list[Path]:
    """The tuned-config files loaded on import, in order: the shipped table, then the user's."""
    return [path for path in (TUNED_FILE, user_tuned_file()) if path.exists()]


def tuned_source() -> dict:
    """For env.json: the tuned-config files loaded on import and the configs registered."""
    return {
        "files": [str(path) for path in tuned_files()],
        "entries": len(TUNED_CONFIGS),
        **({"unreadable": TUNED_FILE_PROBLEMS} if TUNED_FILE_PROBLEMS else {}),
    }


# A user's file that cannot be read (a hand edit, a copy cut short) must not stop every command that
# imports the kernels: its configs are left out, with a warning here and its reason in `tuned_source`.
TUNED_FILE_PROBLEMS: list[str] = []
for _path in tuned_files():
    try:
        load_tuned(_path)
    except ValueError as _exc:
        if _path == TUNED_FILE:
            raise
        TUNED_FILE_PROBLEMS.append(str(_exc))
        print(f"warning: {_exc}; its configs are not used (repair or remove it)", file=sys.stderr)
