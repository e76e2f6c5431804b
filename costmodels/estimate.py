"""``estimate(job, layout)``: memory, step time and traffic of one layout, by pipeline rank.

Built from layer-to-rank assignment (``assignment``), per-rank memory (``rank_memory``), per-rank
time (``rank_time``) and ``assemble``; each is a function of the job, the layout and the rank.
``CostModel`` is the memo those functions share (``context.CostContext``), keyed by their inputs,
with the verbs that put the terms together.
"""

from __future__ import annotations

from dataclasses import replace

from .assemble import assemble
from .assignment import placement, rank_groups, rank_layers, rank_params
from .breakdown import CostBreakdown
from .context import CostContext
from .job import Job
from .layout import Layout
from .memo import memoised
from .pipeline import in_flight_microbatches
from .rank_memory import held_states, rank_static, shard_degrees, stage_memory
from .rank_time import rank_times
from .ranks import RankLayers, RankStatic, RankTimes


PLACEMENT_FREE_MEMOS = ("placed_memo", "ranks_memo", "groups_memo", "params_memo", "activation_memo", "extremes_memo")
"""Memos whose values read no collective (layer assignment, parameters, activations), so the placed
memos of one job share them (``CostModel.placed``)."""


class CostModel(CostContext):
    """The memo of one job's per-term costs (``context.CostContext``); ``estimate`` any layout."""

    def placed(self, gpus_per_nvlink_domain: int) -> "CostModel":
        """The memo of this job with its ranks filling ``gpus_per_nvlink_domain`` GPUs of each NVLink
        domain (``Layout.gpus_per_nvlink_domain``; 0: all of each): collectives are placed on that
        cluster (``ClusterSpec.placed``), nothing else changes. One memo per value, shared by all, which
        share the memos that read no collective (``PLACEMENT_FREE_MEMOS``)."""
        known = self.placed_memo.get(gpus_per_nvlink_domain)
        if known is None:
            known = CostModel(replace(self.job, cluster=self.cluster.placed(gpus_per_nvlink_domain)))
            for name in PLACEMENT_FREE_MEMOS:
                setattr(known, name, getattr(self, name))
            self.placed_memo[gpus_per_nvlink_domain] = known
            self.placed_models.append(known)
        return known  # type: ignore[return-value]

    def estimate(self, layout: Layout) -> CostBreakdown:
        """Memory per rank, step time by term and traffic for ``layout`` (assumed valid), on the
        cluster placed as the layout says (``placed``).

        Ranks with the same layer counts and ends share their times and state memory; only the
        micro-batches in flight (and so activation memory) differ between them."""
        if layout.gpus_per_nvlink_domain != self.cluster.gpus_per_nvlink_domain:
            return self.placed(layout.gpus_per_nvlink_domain).estimate(layout)
        shared: dict[tuple, tuple[RankTimes, RankStatic]] = {}
        memory, times = [], []
        for index, rank in enumerate(rank_layers(self, layout)):
            if rank.signature not in shared:
                shared[rank.signature] = (rank_times(self, layout, rank), rank_static(self, layout, rank))
            rank_time, static = shared[rank.signature]
            times.append(rank_time)
            memory.append(stage_memory(self, layout, index, static))
        return assemble(self, layout, tuple(memory), times)

    def peak_memory_bytes(self, layout: Layout) -> float:
        """The ``peak_memory_bytes`` that ``estimate`` would report, without costing time.

        A rank's total is affine in its in-flight micro-batches (``rank_memory.stage_memory``), so
        among ranks of one signature the peak is on the one holding the most or the fewest."""
        peak = 0.0
        for rank, indices in self.in_flight_extremes(layout):
            static = rank_static(self, layout, rank)
            for index in indices:
                peak = max(peak, stage_memory(self, layout, index, static).total_bytes)
        return peak

    def in_flight_extremes(self, layout: Layout) -> list[tuple[RankLayers, tuple[int, ...]]]:
        """Per rank signature, one rank and the indices of its ranks with the most and the fewest
        micro-batches in flight (memoised by what ``in_flight_microbatches`` reads)."""
        key = (layout.schedule, layout.pp, layout.num_microbatches, layout.virtual_stages, layout.layers_per_chunk)

        def compute() -> list[tuple[RankLayers, tuple[int, ...]]]:
            found: dict[tuple, tuple[RankLayers, list[tuple[int, int]]]] = {}
            for index, rank in enumerate(rank_layers(self, layout)):
                flight = in_flight_microbatches(layout.schedule, layout.pp, index, layout.num_microbatches,
                                                layout.virtual_stages)
                found.setdefault(rank.signature, (rank, []))[1].append((flight, index))
            return [(rank, tuple(sorted({min(ranks)[1], max(ranks)[1]}))) for rank, ranks in found.values()]

        return memoised(self.extremes_memo, key, compute)

    def model_state_peak_bytes(self, layout: Layout) -> float:
        """Largest params + grads + optimizer bytes over the ranks: a memory lower bound that the
        micro-batch, schedule and recomputation choices cannot lower. Memoised by what it reads: the
        ranks' layers (``rank_groups``), their parameters (``rank_params``) and how they are held
        (``held_states``: the ZeRO stage, offload and shard degrees, not dp and cp apart), so the
        meshes that differ only in those share it."""
        z, z_e = shard_degrees(self, layout)
        key = ("model states", placement(layout), layout.pp, layout.virtual_stages, layout.layers_per_chunk,
               layout.tp, layout.ep, layout.expert_tp, layout.zero_stage, layout.optimizer_offload, z, z_e)
        return memoised(self.params_memo, key, lambda: max(
            sum(held_states(self, layout, rank_params(self, layout, rank))) for rank, _ in rank_groups(self, layout)))


def estimate(job: Job, layout: Layout, memo: CostModel | None = None) -> CostBreakdown:
    """Memory per rank, step time by term and traffic of ``layout`` (assumed valid,
    ``layout.check_layout``) for ``job``. ``memo`` (``CostModel(job)``) keeps the per-term values
    of earlier calls, keyed by their inputs, so a search that costs many layouts of one job pays
    for each term once; the result does not depend on it."""
    return (memo if memo is not None else CostModel(job)).estimate(layout)
