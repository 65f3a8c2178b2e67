"""The host side that `mlstm_tfla` and `mlstm_limit_chunk` share: input checks, the per-call settings,
the launches of the gate and chunk-state kernels (`common`), and the autograd glue.

Both turn the gate pre-activations into log gates and their chunk sums (`common.fwd_kernel_gates`)
and run the same chunk-state kernels before their output kernel. Each kernel module supplies a
`KernelOps` pair: `forward(q, k, v, log_i, gates, C, n, m, h, m_row, denom, settings)` on contiguous
`[B, NH, T, D]` tensors (the kernels index them as `[BH, T, D]`; `log_i` is `[BH, T]`), the output
kernel on the forward states, writing `h` and, where the gate has them, the per-row max state
`m_row` and denominator `denom` (else None), and `backward(q, k, v, dh, log_i, gates, C, m, m_row,
denom, dC_final, initial_grad, settings)` on `[BH, T, D]` tensors, returning
`(dq, dk, dv, row_dots, dg, dC0)`: the row dot products (`RowDots`) and the chunk-sum
gradients (from `states_backward`) from which `common.bwd_kernel_gates` forms the gate gradients,
and `dC0` the initial state's gradient (float32 `[BH, Dqk, Dv]` when `initial_grad`, else None).
`backward` may overwrite the forward states `C` (TFLA writes the state gradients into them); a
second backward through the same graph recomputes them. A call that needs no gradient skips
autograd (`apply`).

Gradient conventions of the initial and final states (TFLA paper, appendix B.3): the returned
final `n` and `m` get no gradient, and the initial `n_0` gets a zero gradient; the initial `m_0`
gets `sum(dC_0 * C_0)`, its exact gradient, since the memory is `C_0 exp(m_0)`. Passing a final
state on as the next call's initial state therefore chains gradients exactly.
"""

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import torch

from tfla_bench.kernels.common import (
    bwd_kernel_dstates,
    bwd_kernel_gates,
    fwd_kernel_gates,
    fwd_kernel_states,
)
from tfla_bench.kernels.config import (
    KernelConfig,
    check_config,
    config_for,
    filled_state_blocks,
    gpu_target,
    sm_count,
    tune_first_use,
)
from tfla_bench.kernels.contract import chunk_reason, head_dim_reason
from tfla_bench.kernels.gates import GATES, num_chunks
from tfla_bench.kernels.launch import INTERPRETED, Launches
from tfla_bench.kernels.reference import state_names

INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MAX_SIGNATURES = 256  # call signatures whose settings `settings_of` keeps (then it starts again)


@dataclass(frozen=True)
class Settings:
    """What one call fixes for all its kernels: the gate, `L`, `eps`, mLSTMsig's normalizer, the config."""

    gate: str
    chunk_size: int
    eps: float
    normalize: bool
    config: KernelConfig
    final_state: bool = False  # the call returns the final state (and may get its gradient)
    float32_states: bool = False  # chunk states in float32 in HBM (`config.float32_states`)
    # The forward kernels compiled for this instance's call signature (`settings_of`); a copy made
    # with `replace` starts empty.
    launches: Launches = field(default_factory=Launches, init=False, compare=False, repr=False)

    @property
    def use_max_state(self) -> bool:
        return self.gate == "exp"

    @property
    def has_n(self) -> bool:
        """Whether there is a normalizer `n` and a per-row denominator."""
        return self.gate == "exp" or self.normalize


def dot_precision(dtype: torch.dtype) -> str:
    # Full-precision float32 products (the CPU tests compare against float64); bf16/fp16 use tensor cores.
    return "ieee" if dtype == torch.float32 else "tf32"


def pointer_or(x: torch.Tensor | None, stand_in: torch.Tensor) -> torch.Tensor:
    """`x`, or for an absent tensor `stand_in`: the kernels skip the loads and stores of absent tensors
    (constexpr flags), so any pointer fills the slot."""
    return stand_in if x is None else x


def tma_rows(x: torch.Tensor, rows: int, columns: int):
    """The Hopper tensor descriptor of a contiguous `[..., T, D]` tensor as `[BH, T, D]`, with blocks
    `[1, rows, columns]` (`common.load_tile`): rows past `T` come back as zeros, never another head's."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    major, minor = torch.cuda.get_device_capability(x.device) if x.is_cuda else (9, 0)
    if major < 9:
        raise ValueError(
            f"config.tma and config.bwd_tma need a GPU with TMA (sm90 or later), got sm{major}{minor}"
        )
    x = x.view(-1, *x.shape[-2:])
    return TensorDescriptor(x, list(x.shape), list(x.stride()), [1, rows, columns])


def tma_aligned(*tensors: torch.Tensor) -> bool:
    """Whether a descriptor can take each of `tensors`: its address a multiple of 16 bytes. A call whose
    inputs are not (a view a few elements into a buffer) loads through pointers instead."""
    return all(x.data_ptr() % 16 == 0 for x in tensors)


def tma_states(C: torch.Tensor, rows: int, columns: int):
    """The descriptor of the chunk states `[BH, NC + 1, Dqk, Dv]` as `[BH * (NC + 1), Dqk, Dv]`, with
    `[1, rows, columns]` blocks (`common.load_state`)."""
    return tma_rows(C.view(-1, *C.shape[2:]), rows, columns)


class ChunkSums(NamedTuple):
    """The cumulative log gates the kernels read (`gates.ChunkGates` without `a`), float32: `b`
    `[BH, T]`, `g` and `a_max` `[BH, NC]`; where the output kernel reads it (`KernelOps.row_max`: TFLA's
    mLSTMexp) also `row_max` `[BH, T]`, the within-chunk prefix max of `log_i - b`
    (`common.fwd_kernel_gates`), else None (limit_chunk's output kernel takes its rows' max from the
    whole chunk tile, and the backward pass needs none)."""

    b: torch.Tensor
    g: torch.Tensor
    a_max: torch.Tensor
    row_max: torch.Tensor | None = None


class RowDots(NamedTuple):
    """The backward kernels' row dot products `q . dq`, `k . dk` and `k . dk_inter` (the inter-chunk
    part of dk), each `[N, BH, T]` float32 in `N` head-dim slices that `gates_backward` sums."""

    qdq: torch.Tensor
    kdk: torch.Tensor
    kdk_inter: torch.Tensor


def float32_rows(count: int, rows: int, columns: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """`count` float32 `[rows, columns]` buffers from one allocation (they live and die together)."""
    return torch.empty(count, rows, columns, dtype=torch.float32, device=device).unbind()


def gates_forward(
    i: torch.Tensor, f: torch.Tensor, s: Settings, row_max: bool = False, out: tuple | None = None
) -> tuple[torch.Tensor, ChunkSums]:
    """Run `fwd_kernel_gates` on the gate pre-activations (`[BH, T]`, or `[B, NH, T]` contiguous): the
    log input gates `[BH, T]` and the sums, with `row_max` (mLSTMexp only) also `ChunkSums.row_max`.
    `out`: the float32 `[BH, T]` buffers of `log_i` and `b`, else allocated here."""
    seq_len = i.shape[-1]
    bh = i.numel() // seq_len
    nc = num_chunks(seq_len, s.chunk_size)
    log_i, b = out if out is not None else float32_rows(2, bh, seq_len, i.device)
    g, a_max = float32_rows(2, bh, nc, i.device)
    prefix_max = torch.empty_like(log_i) if row_max and s.use_max_state else None
    s.launches(
        f"gates{prefix_max is not None:d}", fwd_kernel_gates, bh * nc,
        (i, f, log_i, b, g, a_max, pointer_or(prefix_max, b), seq_len, nc),
        lambda: dict(L=s.chunk_size, SIG_INPUT=s.gate == "sig", ROW_MAX=prefix_max is not None, num_warps=4),
    )  # fmt: skip
    return log_i, ChunkSums(b, g, a_max, prefix_max)


def gates_backward(i, f, dots: RowDots, dg: torch.Tensor, s: Settings) -> tuple[torch.Tensor, torch.Tensor]:
    """Run `bwd_kernel_gates`: the gradients of the gate pre-activations `i, f` `[BH, T]` (their dtypes)."""
    bh, seq_len = i.shape
    nc = dg.shape[-1]
    di, df = torch.empty_like(i), torch.empty_like(f)
    bwd_kernel_gates[(bh * nc,)](
        i, f, dots.qdq, dots.kdk, dots.kdk_inter, dg, di, df, seq_len, nc, bh,
        L=s.chunk_size, N_ROW_BLOCKS=dots.qdq.shape[0], N_STATE_BLOCKS=dg.shape[0], SIG_INPUT=s.gate == "sig",
        num_warps=4,
    )  # fmt: skip
    return di, df


def states_forward(k, v, gates: ChunkSums, log_i, C0, n0, m0, s: Settings, with_n: bool):
    """Run `fwd_kernel_states` on `k, v` (`[BH, T, D]`, or `[B, NH, T, D]` contiguous) from the initial
    state `C0, n0, m0` (contiguous float32, or all None: the empty memory): the states before every
    chunk and the final one, `C` in the input dtype (float32 with `s.float32_states`), `n` and `m` in
    float32, and with `s.final_state` the final `C` in float32 (else None)."""
    bh, seq_len = log_i.shape
    dqk = k.shape[-1]
    dv = v.shape[-1]
    nc = gates.g.shape[-1]
    cfg = s.config
    state_dtype = torch.float32 if s.float32_states else k.dtype
    C = torch.empty(bh, nc + 1, dqk, dv, dtype=state_dtype, device=k.device)
    n = torch.empty(bh, nc + 1, dqk, dtype=torch.float32, device=k.device) if with_n else None
    m = torch.empty(bh, nc + 1, dtype=torch.float32, device=k.device) if s.use_max_state else None
    C_final = torch.empty(bh, dqk, dv, dtype=torch.float32, device=k.device) if s.final_state else None
    grid = bh * (dqk // cfg.state_qk) * (dv // cfg.state_v)
    initial = (pointer_or(C0, C), pointer_or(n0, C), pointer_or(m0, C))
    outputs = (C, pointer_or(n, C), pointer_or(m, C), pointer_or(C_final, C))
    s.launches(
        f"states{with_n:d}{C0 is not None:d}", fwd_kernel_states, grid,
        (k, v, gates.b, log_i, gates.g, gates.a_max, *initial, *outputs, seq_len, nc),
        lambda: dict(
            DQK=dqk, DV=dv, L=s.chunk_size, BLOCK_T=cfg.state_seq, BLOCK_DQK=cfg.state_qk,
            BLOCK_DV=cfg.state_v, USE_MAX_STATE=s.use_max_state, HAS_N=with_n, HAS_INITIAL=C0 is not None,
            STORE_FINAL=s.final_state, ONE_TILE=cfg.state_one_tile, DOT_PRECISION=dot_precision(k.dtype),
            num_warps=cfg.state_num_warps, num_stages=cfg.state_num_stages,
        ),
    )  # fmt: skip
    return C, n, m, C_final


def states_backward(
    q, dh, gates: ChunkSums, m, m_row, denom, C, dC, dC_final, s: Settings, initial_grad: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run `bwd_kernel_dstates` into `dC` (`dC` may be `C`) from the final state's gradient `dC_final`
    (float32, None: zero). Returns each chunk's gate-sum gradient `g_bar_k sum(C_{k-1} * dC_k)` per
    state block, `[N_blocks, BH, NC]`, and with `initial_grad` the initial state's gradient in float32
    (else None)."""
    bh, seq_len, dqk = q.shape
    dv = dh.shape[-1]
    nc = gates.g.shape[-1]
    cfg = s.config
    n_state_blocks = (dqk // cfg.state_qk) * (dv // cfg.state_v)
    dg = torch.empty(n_state_blocks, bh, nc, dtype=torch.float32, device=q.device)
    dC0 = torch.empty(bh, dqk, dv, dtype=torch.float32, device=q.device) if initial_grad else None
    if dC_final is not None:
        dC_final = dC_final.reshape(bh, dqk, dv).float().contiguous()
    bwd_kernel_dstates[(bh * n_state_blocks,)](
        q, dh, gates.b, gates.g, pointer_or(m_row, gates.b), pointer_or(denom, gates.b),
        pointer_or(m, gates.g), C, dC, pointer_or(dC_final, dg), pointer_or(dC0, dg), dg,
        seq_len, nc, bh, dqk**-0.5,
        DQK=dqk, DV=dv, L=s.chunk_size, BLOCK_T=cfg.state_seq, BLOCK_DQK=cfg.state_qk, BLOCK_DV=cfg.state_v,
        USE_MAX_STATE=s.use_max_state, HAS_DENOM=s.has_n, HAS_FINAL_GRAD=dC_final is not None,
        STORE_INITIAL_GRAD=initial_grad, ONE_TILE=cfg.state_one_tile, DOT_PRECISION=dot_precision(q.dtype),
        num_warps=cfg.state_num_warps, num_stages=cfg.state_num_stages,
    )  # fmt: skip
    return dg, dC0


class KernelOps(NamedTuple):
    """The forward and backward passes of one kernel (module docstring)."""

    forward: Callable
    backward: Callable
    row_max: bool = False  # `forward` reads `ChunkSums.row_max` (mLSTMexp)


def forward_pass(ops: KernelOps, q, k, v, i, f, C0, n0, m0, s: Settings):
    """The forward pass on contiguous `[B, NH, T, D]` inputs and gate pre-activations `[B, NH, T]`:
    the gate kernel, the state kernel and `ops.forward`, which take them as they are (the kernels
    index `[BH, T, D]` from the pointers; `log_i` has the shape `[BH, T]`). Returns `h`, the final
    state `(C_T, n_T, m_T)` (None each without `s.final_state`) and what the backward pass needs."""
    batch, heads, seq_len, dqk = q.shape
    dv = v.shape[-1]
    bh = batch * heads
    # log_i and b, then the output kernel's m_row and denom where it writes them: the backward pass
    # keeps all of them
    rows = float32_rows(2 + s.use_max_state + s.has_n, bh, seq_len, q.device)
    log_i, gates = gates_forward(i, f, s, ops.row_max, out=rows[:2])
    C, n, m, C_final = states_forward(k, v, gates, log_i, C0, n0, m0, s, with_n=s.has_n)
    h = torch.empty_like(v)
    m_row = rows[2] if s.use_max_state else None
    denom = rows[-1] if s.has_n else None
    ops.forward(q, k, v, log_i, gates, C, n, m, h, m_row, denom, s)
    final = (None, None, None)
    if s.final_state:
        nc = gates.g.shape[-1]
        final = (
            C_final.reshape(batch, heads, dqk, dv),
            n[:, nc].clone().reshape(batch, heads, dqk) if n is not None else None,
            m[:, nc].clone().reshape(batch, heads) if m is not None else None,
        )
    saved = (log_i, gates, C, m, m_row, denom)
    return h, final, saved


class ChunkwiseFunction(torch.autograd.Function):
    """Autograd glue of `forward_pass` and the backward kernels (the gate activations included)."""

    @staticmethod
    def forward(ctx, ops: KernelOps, q, k, v, i, f, C0, n0, m0, s: Settings):
        h, (C_T, n_T, m_T), saved = forward_pass(ops, q, k, v, i, f, C0, n0, m0, s)
        log_i, gates, C, m, m_row, denom = saved
        gates = gates._replace(row_max=None)  # the backward pass needs no prefix max
        ctx.save_for_backward(q, k, v, i, f, log_i, C0, m0)
        # Kept outside save_for_backward: the backward pass may overwrite the states with their gradients.
        ctx.states = C
        ctx.fwd = (gates, m, m_row, denom)
        ctx.ops = ops
        ctx.settings = s
        ctx.shape = (*q.shape, v.shape[-1])
        ctx.has_n0 = n0 is not None
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(*(x for x in (n_T, m_T) if x is not None))
        return h, C_T, n_T, m_T

    @staticmethod
    def backward(ctx, dh, dC_T, dn_T, dm_T):
        q, k, v, i, f, log_i, C0, m0 = ctx.saved_tensors
        gates, m, m_row, denom = ctx.fwd
        s = ctx.settings
        batch, heads, seq_len, dqk, dv = ctx.shape
        bh = batch * heads
        q, k, v = (x.reshape(bh, seq_len, -1) for x in (q, k, v))
        i, f = i.reshape(bh, seq_len), f.reshape(bh, seq_len)
        C = ctx.states
        ctx.states = None
        if C is None:  # a second backward through the same graph: recompute the forward states
            without_final = replace(s, final_state=False)
            C, _, _, _ = states_forward(k, v, gates, log_i, C0, None, m0, without_final, False)
        dh = torch.zeros_like(v) if dh is None else dh.reshape(v.shape).contiguous()
        dq, dk, dvv, dots, dg, dC0_flat = ctx.ops.backward(
            q, k, v, dh, log_i, gates, C, m, m_row, denom, dC_T, C0 is not None, s
        )
        di, df = gates_backward(i, f, dots, dg, s)
        dC0 = dn0 = dm0 = None
        if C0 is not None:
            dC0 = dC0_flat.reshape(C0.shape)
            if m0 is not None:
                dm0 = (dC0 * C0).sum((-1, -2))
        if ctx.has_n0:
            dn0 = torch.zeros(batch, heads, dqk, dtype=C0.dtype, device=q.device)
        rows = (batch, heads, seq_len)
        return (
            None,
            dq.reshape(*rows, dqk),
            dk.reshape(*rows, dqk),
            dvv.reshape(*rows, dv),
            di.reshape(rows),
            df.reshape(rows),
            dC0,
            dn0,
            dm0,
            None,
        )


def check_inputs(q, k, v, i, f, gate, chunk_size, seq_len_padded, eps):
    """Raise ValueError unless the tensors, the gate, `chunk_size` and `eps` suit the kernels."""
    for name, x in (("q", q), ("k", k), ("v", v), ("i", i), ("f", f)):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if gate not in GATES:
        raise ValueError(f"gate must be one of {GATES}, got {gate!r}")
    if q.dim() != 4:
        raise ValueError(f"q must have shape [B, NH, T, Dqk], got {tuple(q.shape)}")
    batch, heads, seq_len, dqk = q.shape
    if k.shape != q.shape:
        raise ValueError(f"k must have the shape of q {tuple(q.shape)}, got {tuple(k.shape)}")
    if v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(
            f"v must have shape [B, NH, T, Dv] = [{batch}, {heads}, {seq_len}, Dv], got {tuple(v.shape)}"
        )
    for name, x in (("i", i), ("f", f)):
        if x.shape != q.shape[:3]:
            raise ValueError(
                f"{name} must have shape [B, NH, T] = {tuple(q.shape[:3])}, got {tuple(x.shape)}"
            )
        if not x.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got {x.dtype}")
    if q.dtype not in INPUT_DTYPES:
        raise ValueError(f"q must be bfloat16, float16 or float32, got {q.dtype}")
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise ValueError(f"{name} must have the dtype of q ({q.dtype}), got {x.dtype}")
    for name, x in (("k", k), ("v", v), ("i", i), ("f", f)):
        if x.device != q.device:
            raise ValueError(f"{name} must be on the device of q ({q.device}), got {x.device}")
    if q.device.type != "cuda" and not INTERPRETED:
        raise ValueError(f"q must be a CUDA tensor (or set TRITON_INTERPRET=1 before import), got {q.device}")
    for name, dim in (("Dqk (q.shape[-1])", dqk), ("Dv (v.shape[-1])", v.shape[-1])):
        reason = head_dim_reason(f"head dim {name}", dim)
        if reason is not None:
            raise ValueError(reason)
    reason = chunk_reason(chunk_size)
    if reason is not None:
        raise ValueError(reason)
    if chunk_size > seq_len_padded:
        raise ValueError(
            f"chunk_size must be at most the sequence length T={seq_len_padded}, got {chunk_size}"
        )
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")


def check_state(initial_state, gate, normalize, q, dv) -> dict[str, torch.Tensor]:
    """The initial state by name (`C`, `n`, `m`); raise ValueError unless it fits the gate and `q`."""
    batch, heads, _, dqk = q.shape
    shapes = {"C": (batch, heads, dqk, dv), "n": (batch, heads, dqk), "m": (batch, heads)}
    names = state_names(gate, normalize)
    if isinstance(initial_state, torch.Tensor) and names == ("C",):
        initial_state = (initial_state,)
    if not isinstance(initial_state, tuple | list) or len(initial_state) != len(names):
        raise ValueError(f"initial_state must be a tuple {names} for gate={gate!r}, normalize={normalize}")
    for name, x in zip(names, initial_state, strict=True):
        if not isinstance(x, torch.Tensor) or tuple(x.shape) != shapes[name]:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"initial_state {name} must have shape {list(shapes[name])}, got {got}")
        if x.device != q.device:
            raise ValueError(f"initial_state {name} must be on the device of q ({q.device}), got {x.device}")
        if not x.is_floating_point():
            raise ValueError(f"initial_state {name} must be a floating-point tensor, got {x.dtype}")
    return dict(zip(names, initial_state, strict=True))


def resolve_config(
    kernel: str, config: KernelConfig | None, q: torch.Tensor, dv: int, chunk_size: int, gate: str
):
    """The caller's `config` once checked, else the cached config for this GPU and shape (`config_for`),
    tuned first where the user opted in (`tune_first_use`), its state blocks split where this call's
    batch and heads would leave half the GPU's SMs idle (`filled_state_blocks`)."""
    dqk = q.shape[-1]
    if config is None:
        tune_first_use(kernel, gate, (*q.shape[:3], dqk, dv, chunk_size), q.dtype, q.device)
        chosen = config_for(kernel, dqk, dv, chunk_size, q.dtype, gate, gpu_target(q.device))
        return filled_state_blocks(chosen, q.shape[0] * q.shape[1], dqk, dv, sm_count(q.device))
    check_config(kernel, config, dqk, dv, chunk_size)
    return config


def settings_of(options: tuple, tensors: tuple, make: Callable[[], Settings]) -> Settings:
    """The `Settings` of a call: `make()`, which checks the call (raising ValueError), on the first
    call of a signature, and the same instance on later ones, whose `launches` then call the compiled
    forward kernels directly (`launch`).

    The signature is `options` (every argument that is not a tensor, the kernel's name first) and
    each of `tensors`' shape, dtype, device index (-1 on the CPU) and 16-byte alignment: the tensors
    the forward kernels get, contiguous. A call whose arguments are no tensors, or whose options
    cannot be hashed, gets `make()` (which says what is wrong).
    """
    try:
        key = (options, *[(x.shape, x.dtype, x.get_device(), x.data_ptr() % 16) for x in tensors])
        settings = _SIGNATURES.get(key)
    except (AttributeError, TypeError):
        return make()
    if settings is None:
        settings = make()
        if len(_SIGNATURES) >= MAX_SIGNATURES:
            _SIGNATURES.clear()
        _SIGNATURES[key] = settings
    return settings


_SIGNATURES: dict[tuple, Settings] = {}


def prepare_call(options: tuple, make: Callable[[], Settings], q, k, v, i, f, initial_state, gate, normalize):
    """What an entry point (`mlstm_tfla`, `mlstm_limit_chunk`) runs `apply` with: its `Settings`
    (`settings_of`), the inputs made contiguous and the initial state by name (`check_state`, float32,
    contiguous; {} for none). `make()` checks the inputs before the state is checked.

    Returns:
        `(settings, (q, k, v, i, f), state)`.
    """
    if initial_state is not None:
        make()
        state = check_state(initial_state, gate, normalize, q, v.shape[-1])
        state = {name: x.float().contiguous() for name, x in state.items()}
    else:
        state = {}
    try:
        q, k, v, i, f = q.contiguous(), k.contiguous(), v.contiguous(), i.contiguous(), f.contiguous()
    except AttributeError:
        pass  # not tensors: `make` says which
    return settings_of(options, (q, k, v, i, f, *state.values()), make), (q, k, v, i, f), state


def apply(ops: KernelOps, q, k, v, i, f, state: dict[str, torch.Tensor], s: Settings):
    """Run `ops` on contiguous `[B, NH, T, D]` inputs and gate pre-activations `[B, NH, T]`, through
    autograd where a gradient is wanted (else without its bookkeeping; a call without the final state
    then replays the launches of the signature's first such call, `launch.Replay`); returns `h` and,
    with `s.final_state`, the final state (the tuple of `reference.state_names`, float32; else ())."""
    C0, n0, m0 = (state[name].float() if name in state else None for name in ("C", "n", "m"))
    tensors = (q, k, v, i, f, C0, n0, m0)
    if torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in tensors):
        h, C_T, n_T, m_T = ChunkwiseFunction.apply(ops, *tensors, s)
        return h, tuple(x for x in (C_T, n_T, m_T) if x is not None)
    # The forward kernels alone, their launches replayed where a call of this signature was recorded
    # (`launch.Launches.keep_replay`; not a call that returns the final state, which the workspace
    # would hold); `known`: the tensors a replay takes addresses from, in order.
    known = tuple(x for x in tensors if x is not None)
    launches = s.launches
    if launches.replay is not None:
        h = torch.empty_like(v)
        if launches.replay((*known, h)):
            return h, ()
    launches.trace = None if s.final_state else []
    try:
        h, final, _ = forward_pass(ops, *tensors, s)
        launches.keep_replay((*known, h))
    finally:
        launches.trace = None
    return h, tuple(x for x in final if x is not None)
