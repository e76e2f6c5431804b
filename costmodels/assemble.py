"""Assembly: the step time by term, memory by rank, traffic, FLOPs and sources of one layout.

The step is m·max_i t_i + bubble (``pipeline.schedule_bubble_s``) + the slowest rank's tail:
data-parallel gradient reduction not hidden behind the last backward, parameter all-gather not
hidden behind the first forward (ZeRO-1/2), and the optimizer step. DualPipe and DualPipeV hide
EP all-to-all and PP send/recv behind their overlapped pairs (``pipeline.dualpipe_overlap_s``),
Megatron's EP overlap the EP all-to-all behind its merged 1F1B pairs (``moe_overlap``): that time
comes off the exposed EP, then PP, communication.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from .breakdown import CostBreakdown, StageMemory
from .compute import DATASHEET, merge_source
from .flops import model_flops_per_token
from .goodput import goodput
from .layout import Layout
from .moe_overlap import ep_overlap_hidden_s
from .op_sac import op_sac_recompute_flops
from .pipeline import DUALPIPE, PassTimes, dualpipe_overlap_s, schedule_bubble_s
from .process_groups import Placement, describe
from .ranks import RankTimes

if TYPE_CHECKING:
    from .context import CostContext as CostModel  # what the terms read; estimate.CostModel adds the verbs


def assemble(cm: "CostModel", layout: Layout, memory: tuple[StageMemory, ...], times: list[RankTimes]) -> CostBreakdown:
    m = layout.num_microbatches
    per_mb = [t.per_microbatch_s for t in times]
    crit = times[max(range(len(times)), key=per_mb.__getitem__)]
    tail = times[max(range(len(times)), key=lambda i: times[i].tail_s)]
    model_flops = model_flops_per_token(cm.model, cm.training.seq_len, cm.training.is_lora) \
        * cm.training.tokens_per_step
    hidden = overlap_hidden_s(layout, [crit], cm.assumptions.overlap_slowdown)
    ep_hidden = min(hidden, m * crit.ep_s)
    breakdown = CostBreakdown(
        layout=layout, stages=memory, memory_capacity_bytes=cm.capacity_bytes,
        compute_s=m * crit.compute_s, recompute_s=m * crit.recompute_s, tp_comm_s=m * crit.tp_s,
        cp_comm_s=m * crit.cp_s, ep_comm_s=m * crit.ep_s - ep_hidden,
        dp_comm_s=m * crit.dp_mb_s + tail.dp_tail_s, pp_comm_s=m * crit.pp_s - (hidden - ep_hidden),
        bubble_s=bubble_s(layout, times), optimizer_s=tail.optimizer_s,
        offload_s=tail.offload_s, overhead_s=cm.assumptions.step_overhead_s,
        comm_bytes_per_gpu=dict(crit.comm_bytes),
        model_flops_per_step=model_flops,
        hardware_flops_per_step=model_flops + recompute_flops(cm, layout),
        tokens_per_step=cm.training.tokens_per_step, num_gpus=layout.world_size,
        peak_flops_per_gpu=cm.rates.mfu_peak, low_precision_peak_flops_per_gpu=cm.rates.low_precision_peak,
        sources=term_sources(cm, layout, times),
        host_memory_capacity_bytes=cm.cluster.node.host_memory_bytes,
        memory_band_upper=cm.assumptions.memory_band_upper_for(cm.training.runtime),
        ranks_per_node=min(cm.cluster.gpus_per_node, layout.world_size),
    )
    plan = goodput(cm.checkpoint_bytes, cm.cluster, num_gpus=layout.world_size,
                   step_time_s=breakdown.step_time_s, tokens_per_s=breakdown.tokens_per_s)
    return replace(breakdown, goodput=plan, placement=rack_placement(cm, layout))


def rack_placement(cm: "CostModel", layout: Layout) -> Placement | None:
    """Where the ranks sit on the NVLink domains (``process_groups.describe``), where a domain spans
    several nodes (GB200/GB300 NVL72 racks); None where each node is its own domain."""
    if cm.cluster.node.nodes_per_nvlink_domain == 1:
        return None
    return describe(cm.cluster, dp=layout.dp, tp=layout.tp, pp=layout.pp, cp=layout.cp, ep=layout.ep, etp=layout.etp,
                    gathers_sequence=cm.convention.moe_gathers_sequence)


def bubble_s(layout: Layout, times: list[RankTimes], counts: list[int] | None = None) -> float:
    """The schedule's bubble from each rank's F, B and W (``pipeline.schedule_bubble_s``)."""
    return schedule_bubble_s(layout.schedule, layout.pp, layout.virtual_stages, [t.passes() for t in times], counts)


def overlap_hidden_s(layout: Layout, times: list[RankTimes], slowdown: float) -> float:
    """Communication the overlapped forward-and-backward pairs hide, the most over ``times``
    (``pair_hidden_s``; ``slowdown``: ``Assumptions.overlap_slowdown``)."""
    return max(pair_hidden_s(layout, t.passes(), slowdown) for t in times)


def pair_hidden_s(layout: Layout, passes: PassTimes, slowdown: float) -> float:
    """What a rank with these passes hides in overlapped pairs: Megatron's EP overlap
    (``moe_overlap.ep_overlap_hidden_s``), DualPipe's (``pipeline.dualpipe_overlap_s``), else 0."""
    if layout.ep_comm_overlap:
        return ep_overlap_hidden_s(passes, pp=layout.pp, v=layout.virtual_stages, m=layout.num_microbatches,
                                   slowdown=slowdown)
    if layout.schedule not in DUALPIPE or layout.pp == 1:
        return 0.0
    return dualpipe_overlap_s(passes, layout.pp, layout.num_microbatches, layout.schedule)


def recompute_flops(cm: "CostModel", layout: Layout) -> float:
    """Extra FLOPs of recomputation over the whole step: full reruns the forward of the
    recomputed layers (2N + 4·L·(a·d)·s per token, a third of the model FLOPs); selective reruns
    the attention core (4·L·(a·d)·s per token); op-sac the GEMMs whose outputs it drops."""
    tokens, s, model = cm.training.tokens_per_step, cm.training.seq_len, cm.model
    attention = 4.0 * model.num_layers * model.q_dim * s * tokens
    if layout.recompute == "selective":
        return attention
    if layout.recompute == "op-sac":
        return op_sac_recompute_flops(model, tokens)
    if layout.recompute != "full":
        return 0.0
    share = 1.0 if layout.recompute_num_layers == 0 else \
        min(1.0, layout.recompute_num_layers * layout.num_chunks / model.num_layers)
    forward = model_flops_per_token(cm.model, s, cm.training.is_lora) / 3 * tokens
    return share * forward


def term_sources(cm: "CostModel", layout: Layout, times: list[RankTimes]) -> dict[str, str]:
    """Where each term's rate came from, over every rank of this layout: a term is ``profile``
    if any rate it used was measured. Communication terms only for axes of degree > 1."""
    merged: dict[str, str] = {}
    for t in {id(t): t for t in times}.values():  # ranks of one signature share their times
        for term, source in t.sources.items():
            merge_source(merged, term, source)
    sources = {"compute": merged.get("compute", DATASHEET), "attention": merged.get("attention", DATASHEET),
               "memory_bound": cm.rates.memory_bound_source}
    degrees = {"tp": layout.tp, "cp": layout.cp, "ep": layout.ep, "dp": layout.dp * layout.cp, "pp": layout.pp}
    sources.update({term: merged[term] for term in sorted(merged)
                    if term.endswith("_comm") and degrees.get(term[:-len("_comm")], 1) > 1})
    return sources
