"""`gla`: fla's chunkwise GLA, `fla.ops.gla.chunk_gla(q, k, v, g)`: a log forget gate per token, head
and key channel, `g` `[B, T, H, Dqk]`. fla fixes its chunk size to min(64, max(16, next_pow2(T)))."""

from tfla_bench.adapters.registry import PlotStyle, PublishedSeries, register
from tfla_bench.adapters.workloads import Case
from tfla_bench.baselines._gla import FlaAdapter
from tfla_bench.model.families import gla_byte_terms, gla_flop_terms


def gla_chunk_size(seq_len: int) -> int:
    """The chunk size `chunk_gla` picks for `seq_len`: min(64, max(16, next power of two of T))."""
    return min(64, max(16, 1 << (seq_len - 1).bit_length()))


@register
class Gla(FlaAdapter):
    """fla's chunkwise GLA (per-channel log forget gates)."""

    name = "gla"
    module = "fla.ops.gla"
    function = "chunk_gla"
    per_channel_gate = True
    constraints = (
        "no head-dim limit (fla tiles K and V); chunk size fixed by fla (64); first call autotunes long"
    )
    published = PublishedSeries("chunk_gla", note="fla chunk_gla (GLA, per-channel gate)")
    plot_style = PlotStyle("#238b45")
    flop_terms = staticmethod(gla_flop_terms)
    byte_terms = staticmethod(gla_byte_terms)

    def fla_chunk(self, case: Case) -> int:
        return min(gla_chunk_size(case.seq_len), case.seq_len)
