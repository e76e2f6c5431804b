"""Megatron-Core's expert-parallel overlap: a forward and a backward of two micro-batches run
together, each one's all-to-alls behind the other's compute.

With ``--overlap-moe-expert-parallel-comm`` (Megatron-Core ``combined_1f1b.py``, since core_v0.14.0)
the 1F1B steady state merges the forward of one micro-batch with the backward of another, layer
by layer, on two streams: "EP A2A in forward step is hidden by the attention/mlp computation in
the backward step, and vice versa" (``combined_1f1b_schedule_for_no_pipelining``; the interleaved
schedule merges its steady-state chunk steps the same way, and Megatron-Core asserts virtual
stages whenever pp > 1). The first forward and, under pipelining, the warm-up forwards and the
cool-down backwards have no partner.

So on a rank whose per-micro-batch exposed EP time is e (forward and backward all-to-alls, the
expert-tp collectives with them) and whose compute is C, a merged pair hides min(e, C) of it;
the kernels of the hidden all-to-alls take SMs from the compute they run beside, slowing it by
σ = ``Assumptions.overlap_slowdown`` of the hidden time (``overlap``), so a pair saves
(1 − σ)·min(e, C). Pairs, in micro-batches: m − 1 without pipelining (Megatron's phases 1 to
m − 1); with pp ranks of v chunks, the m·v chunk steps less rank 0's (v + 1)·pp − 2 warm-up
forwards (Narayanan et al. SC'21, Sec. 2.2: 2(pp − 1) + (v − 1)·pp), over v. Rank 0 has the most
warm-up, so the count holds on every rank. Activations: a merged pair runs forward layer i of the
new micro-batch beside the backward of the old one's last unfinished layer (``model_chunk_
schedule_plan.py``: ``f_schedule_plan.get_layer(i)`` with ``b_schedule_plan.pop_layer()``), so
as one micro-batch's layers are freed the other's are stored: the peak holds one layer more than
the schedule's in-flight count (``merged_extra_layers``).
"""

from __future__ import annotations

from .pipeline import PassTimes


def overlapped_pairs(pp: int, v: int, m: int) -> float:
    """Merged forward-and-backward pairs per step, in micro-batches (module docstring)."""
    warmup = max(1, (v + 1) * pp - 2)
    return max(0, m * v - warmup) / v


def most_overlapped_pairs(pp: int, m: int) -> float:
    """The most ``overlapped_pairs`` over every number of virtual stages: m − 1 without pipelining,
    m − pp with it ((m·v − (v + 1)·pp + 2)/v = m − pp − (pp − 2)/v rises towards it with v)."""
    return float(max(0, m - 1)) if pp == 1 else float(max(0, m - pp))


def ep_overlap_hidden_s(passes: PassTimes, *, pp: int, v: int, m: int, slowdown: float) -> float:
    """Seconds the merged pairs take off a rank's step: pairs · (1 − σ) · min(e, C), with e the
    rank's exposed EP time per micro-batch (``PassTimes.ep_comm_s``) and C its compute (``compute_s``)."""
    return overlapped_pairs(pp, v, m) * (1 - slowdown) * min(passes.ep_comm_s, passes.compute_s)


def merged_extra_layers(ep_comm_overlap: bool) -> int:
    """Layers of one micro-batch's activations a rank holds beyond its schedule's in-flight count:
    one under the overlap (the merged forward's layer beside its partner's backward), none without."""
    return 1 if ep_comm_overlap else 0
