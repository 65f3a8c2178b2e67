"""FLOP and byte counts of the baseline families (tfla_bench.model.families) against hand-worked values."""

import pytest

from tfla_bench.errors import UserError
from tfla_bench.model import families
from tfla_bench.model.counts import ChunkTerms


def test_simple_gla_flops_hand_worked():
    # K=2, V=3, Fc=0.5: quadratic 0.5*(4+6+3)=6.5; linear 4*6+2*2+2*3+4=38; constant 2*6+1=13.
    terms = families.simple_gla_flop_terms(head_dim_qk=2, head_dim_v=3, causal_factor=0.5)
    assert terms == ChunkTerms(quadratic=6.5, linear=38.0, constant=13.0)
    # T=8, L=4: 2 chunks of 6.5*16 + 38*4 + 13 = 269.
    assert terms.total(8, 4) == pytest.approx(538.0)


def test_gla_flops_hand_worked():
    # K=2, V=3, Fc=0.5, c=16: quadratic 0.5*(4+6+1)=5.5; linear 24+(12+40)*2+6=134; constant 12+2=14.
    terms = families.gla_flop_terms(head_dim_qk=2, head_dim_v=3, causal_factor=0.5, sub_chunk=16)
    assert terms == ChunkTerms(quadratic=5.5, linear=134.0, constant=14.0)


@pytest.mark.parametrize("head_dim", [16, 64, 256])
def test_per_channel_gla_gate_costs_more_than_the_scalar_gate(head_dim):
    gla = families.gla_flop_terms(head_dim_qk=head_dim, head_dim_v=head_dim)
    simple = families.simple_gla_flop_terms(head_dim_qk=head_dim, head_dim_v=head_dim)
    # Linear term: the per-channel gate adds (10 + 5*Fc*c)*K - 4 FLOPs per token ...
    assert gla.linear - simple.linear == pytest.approx((10 + 5 * 0.5 * 16) * head_dim - 4)
    # ... K exps for the chunk-state decay instead of 1; the scalar L x L decay mask (2 per pair) is gone.
    assert gla.constant - simple.constant == head_dim - 1
    assert simple.quadratic - gla.quadratic == pytest.approx(0.5 * 2)
    # Bytes: gate traffic K * (b_g + 16) against b_g + 12 per token, plus the fp32 L x L scores.
    gla_bytes = families.gla_byte_terms(head_dim_qk=head_dim, head_dim_v=head_dim)
    simple_bytes = families.simple_gla_byte_terms(head_dim_qk=head_dim, head_dim_v=head_dim)
    assert gla_bytes.linear - simple_bytes.linear == pytest.approx(2 * head_dim + 18 * head_dim - 14)
    assert (gla_bytes.quadratic, simple_bytes.quadratic) == (8.0, 0.0)


def test_byte_terms_hand_worked():
    # Simple GLA, K=2, V=3, 2-byte everything: linear 2*(6+9)+2+12=44; constant 2*6*2=24.
    assert families.simple_gla_byte_terms(head_dim_qk=2, head_dim_v=3) == ChunkTerms(0.0, 44.0, 24.0)
    # GLA: quadratic 8; linear 2*(8+9)+2*(2+16)=70; constant 24.
    assert families.gla_byte_terms(head_dim_qk=2, head_dim_v=3) == ChunkTerms(8.0, 70.0, 24.0)
    # Mamba2, N=2, P=3, r=1: quadratic 8; linear 2*(9+8+1)+24=60; constant 6*(8+4)=72.
    assert families.mamba2_byte_terms(state_dim=2, head_dim=3) == ChunkTerms(8.0, 60.0, 72.0)
    # LightningAttention-2, K=V=64: two 32-column programs each load q and k: 2*(2*64*2+2*64)=768.
    assert families.lightning_byte_terms(head_dim_qk=64, head_dim_v=64) == ChunkTerms(0.0, 768.0, 0.0)


def test_mamba2_flops_hand_worked():
    # N=2, P=3, Fc=0.5, r=0.5: quadratic 0.5*(2*2*0.5+6+5)=6.5; linear 4*6+2+6+6=38; constant 13.
    terms = families.mamba2_flop_terms(state_dim=2, head_dim=3, causal_factor=0.5, groups_per_head=0.5)
    assert terms == ChunkTerms(quadratic=6.5, linear=38.0, constant=13.0)


def test_lightning_flops_hand_worked():
    # K=V=2, Fc=1: quadratic 2*2+2*2+1=9; linear 4*4+2+4=22; constant 8.
    terms = families.lightning_flop_terms(head_dim_qk=2, head_dim_v=2, causal_factor=1.0)
    assert terms == ChunkTerms(quadratic=9.0, linear=22.0, constant=8.0)


def test_selective_scan_and_conv_counts():
    # T=2, D=3, N=4: 2*3*(7*4+8)=216 FLOPs; bytes 2*2*(4*3+2*4) + 4*3*(4+1) = 80 + 60.
    assert families.selective_scan_flops(seq_len=2, channels=3, state_dim=4) == 216.0
    assert families.selective_scan_bytes(seq_len=2, channels=3, state_dim=4) == 140.0
    # Conv width 4: 2*3*(2*4+5)=78 FLOPs; 2*2*3*2=24 bytes.
    assert families.causal_conv1d_flops(seq_len=2, channels=3, width=4) == 78.0
    assert families.causal_conv1d_bytes(seq_len=2, channels=3) == 24.0


def test_causal_factor_scales_only_the_quadratic_term():
    full = families.lightning_flop_terms(head_dim_qk=64, head_dim_v=64, causal_factor=1.0)
    half = families.lightning_flop_terms(head_dim_qk=64, head_dim_v=64, causal_factor=0.5)
    assert half.quadratic == full.quadratic / 2
    assert (half.linear, half.constant) == (full.linear, full.constant)


@pytest.mark.parametrize(
    "call",
    [
        lambda: families.simple_gla_flop_terms(head_dim_qk=0, head_dim_v=3),
        lambda: families.gla_flop_terms(head_dim_qk=2, head_dim_v=3, causal_factor=1.5),
        lambda: families.mamba2_flop_terms(state_dim=2, head_dim=3, groups_per_head=0),
        lambda: families.lightning_byte_terms(head_dim_qk=64, head_dim_v=-1),
        lambda: families.selective_scan_flops(seq_len=0, channels=3, state_dim=4),
    ],
)
def test_invalid_arguments_are_user_errors(call):
    with pytest.raises(UserError):
        call()
