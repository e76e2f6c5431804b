"""Lower bounds on step time for the search (``planner.search.solve``): cheap, never above what
``CostModel.estimate`` reports for a layout they cover (up to float rounding, which the search's
``BOUND_SLACK`` absorbs).

``assemble`` sums T = m·t_crit + bubble(F, B, W of every rank) − hidden(crit) + max_i tail_i +
overhead. Rank i's per-micro-batch time t_i is its core c_i (compute, recomputation, TP/CP/EP,
pipeline p2p; ``rank_time.rank_core_times``) plus the per-micro-batch data-parallel time d_i and,
for a runtime that keeps 16-bit gradients, their copy g_i; tail_i is its per-step data-parallel,
optimizer and offload time; t_crit is the largest t_i and hidden(crit) what DualPipe's overlapped
pairs hide on that rank (0 for the other schedules). Three facts give the bounds:

1. Every bubble form of ``pipeline.schedule_bubble_s`` is non-decreasing in each rank's F and B:
   (Σ_i g_i − max_j g_j) rises by at least 0 when one g_i rises (its count is at least 1), and
   each per-rank term g (total, F + B − W floored at 0, max(B, 2(B − W)), F + 2B − W) is
   non-decreasing in F and B. How model states are held adds d_i + g_i to B (``RankTimes.passes``:
   B is whatever is neither forward nor W) and never touches F or W. So, with m·t_crit >=
   m·max_i c_i + m·min_i d_i, T >= m·max_i c_i + bubble(c) − hidden + m·min_i d_i + max_i tail_i
   + overhead, for every schedule. (The state floor once failed for interleaved layouts: it was
   memoised by v and split without the placement, so a V placement's ranks, whose first rank also
   holds the head, lent their larger tail to the looped placement of the same v; the memo keys
   below hold every input.)
2. Exposed communication (``overlap.exposed_comm_s``) is piecewise linear in the compute C it hides
   behind, with one kink: slope −η(1 − σ) while η·C is below the communication, 0 past it (η =
   ``overlap_fraction``, σ = ``overlap_slowdown``). So over all C >= 0 it is least as C -> ∞ when
   σ <= 1 and at C = 0 when σ > 1. Evaluating d_i and tail_i at that end bounds them for every
   micro-batch size, schedule and recomputation mode: they then depend only on the mesh, how
   model states are held and which layers a rank holds.
3. What DualPipe hides (``pipeline.dualpipe_overlap_s``) and what Megatron's EP overlap hides
   (``moe_overlap.ep_overlap_hidden_s``) read a rank's EP (and PP) time and its compute, which
   the states change only through g_i; the bound subtracts the most any rank's core hides, and
   g_i adds m·g_i to m·t_i against at most (m − 1)·g_i more hidden.

The core is summed from memoised pieces (one layer of each kind, the pipeline ends, the p2p
messages), each computed once by the function ``estimate`` uses and keyed by every layout field
that function may read (``_reads``: all fields but those named as not read), so a term added to
those functions, or a field added to ``Layout``, keeps the bounds admissible.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from operator import attrgetter
from typing import TYPE_CHECKING, Callable

from .assemble import pair_hidden_s
from .assignment import layer_key, placement, rank_groups, rank_params, recomputed_layers
from .layout import Layout
from .memo import memoised
from .moe_overlap import most_overlapped_pairs
from .pipeline import DUALPIPE, ZERO_BUBBLE, PassTimes, chunks_per_rank, schedule_bubble_s
from .rank_memory import rank_buffer_bytes
from .ranks import RankLayers, RankTimes
from .rank_time import (add_data_parallel, add_ends, add_grad_copy, add_optimizer, add_pipeline,
                        one_direction, add_layer_kind)

if TYPE_CHECKING:
    from .context import CostContext as CostModel  # what the terms read; estimate.CostModel adds the verbs

NO_COMPUTE_S, ALL_COMPUTE_S = 0.0, 1e300
"""The two ends of the compute a collective can hide behind (fact 2); 1e300 stays finite, so an
overlap fraction of 0 hides nothing instead of giving 0 · ∞."""


def _reads(*not_read: str) -> Callable[[Layout], tuple]:
    """The values of every ``Layout`` field except ``not_read``: a memo key that grows with the layout."""
    return attrgetter(*(f.name for f in fields(Layout) if f.name not in not_read))


_PLACEMENT = ("schedule", "virtual_stages", "layers_per_chunk")
"""Fields that say which layers a rank holds (its ``RankLayers``) and how its chunks are scheduled."""
_STATES = ("zero_stage", "hsdp_shard_degree", "optimizer_offload")
"""Fields that say how model states are held."""
_MICRO_BATCHING = ("micro_batch_size", "num_microbatches", "recompute", "recompute_num_layers",
                   "sequence_parallel")
"""Fields of micro-batching and recomputation."""

_LAYER_READS = _reads("dp", "pp", "num_microbatches", "recompute_num_layers", "ep_comm_overlap", *_STATES,
                      *_PLACEMENT)
"""What one layer's per-micro-batch time may read (``add_layer_kind``; m only scales its traffic;
the recomputed share of full recomputation is passed in)."""
_CORE_READS = _reads("num_microbatches", "schedule", "layers_per_chunk", "ep_comm_overlap", *_STATES)
"""What a rank's core may read besides its layers (``rank_core_times``; the schedule only through
DualPipe's halving and the chunks a rank sends, keyed apart; the EP overlap acts on the step, not
on a rank's core, ``assemble.pair_hidden_s``)."""
_STATE_READS = _reads(*_PLACEMENT, *_MICRO_BATCHING, "tp_comm_overlap")
"""What a rank's data-parallel and optimizer terms may read besides its parameters, layer count
and compute (``add_data_parallel``, ``add_grad_copy``, ``add_optimizer``; m keyed apart where
the tail grows with it). TP overlap only changes a layer's TP time and the buffers
(``assignment.layer_key``, ``rank_memory.rank_buffer_bytes``), so the two overlap twins share them."""
_EDGE_READS = _reads("dp", "pp", "num_microbatches", "recompute_num_layers", "tp_comm_overlap", "ep_comm_overlap",
                     *_STATES, *_PLACEMENT)
"""``_LAYER_READS`` without TP overlap: what the pipeline's ends without MTP blocks and its p2p may
read (``add_ends``, ``add_pipeline``; only a layer's TP time reads the overlap)."""

_VECTOR = ("per_microbatch_s", "forward_s", "input_grad_s", "weight_grad_s", "hideable_s", "compute_s",
           "fwd_compute_s", "bwd_compute_s", "ep_comm_s")
"""What the bounds read of a rank's core: its time, its passes (``RankTimes.passes``) and the compute
its data-parallel traffic hides behind. Each is linear in the core's terms, so a rank's vector is
the sum of its pieces' vectors weighted by their counts."""


@dataclass(frozen=True, slots=True)
class Core:
    """A rank's core (``rank_time.rank_core_times``) as the bounds read it."""

    per_microbatch_s: float
    fwd_compute_s: float
    bwd_compute_s: float
    passes: PassTimes


def pipeline_floor_s(cm: "CostModel", layout: Layout) -> float:
    """m·max_i c_i + bubble(c) − hidden (seconds): the step time without data-parallel, optimizer
    and offload time, a lower bound for every way of holding model states (facts 1 and 3)."""
    ranks = _ranks(cm, layout)
    return (layout.num_microbatches * ranks.most_s
            + schedule_bubble_s(layout.schedule, layout.pp, layout.virtual_stages, ranks.passes, ranks.counts)
            - (max(_hidden_s(cm, layout, p) for p in ranks.passes) if _pairs_hide(layout) else 0.0))


@dataclass(frozen=True, slots=True)
class _Ranks:
    """A layout's rank groups (``assignment.rank_groups``) with their cores."""

    ranks: list[RankLayers]
    counts: list[int]
    cores: list[Core]
    passes: list[PassTimes]
    most_s: float
    """The largest core per micro-batch."""


def _ranks(cm: "CostModel", layout: Layout) -> _Ranks:
    """The rank groups of ``layout`` with their cores, memoised by what both read."""
    key = ("ranks", placement(layout), layout.layers_per_chunk, chunks_per_rank(layout.schedule, layout.virtual_stages),
           layout.schedule == "dualpipe", _CORE_READS(layout))

    def compute() -> _Ranks:
        groups = rank_groups(cm, layout)
        cores = [_core(vector) for vector in _rank_vectors(cm, layout, [rank for rank, _ in groups])]
        return _Ranks(ranks=[rank for rank, _ in groups], counts=[n for _, n in groups], cores=cores,
                      passes=[core.passes for core in cores], most_s=max(core.per_microbatch_s for core in cores))

    return memoised(cm.bound_memo, key, compute)


def mean_floor_s(cm: "CostModel", layout: Layout) -> float:
    """m·Σ_i c_i / pp − DualPipe's most hidden (seconds) for ``layout`` without recomputation and
    without p2p time, from the layer and end pieces and the ranks' layer counts alone: at most
    ``pipeline_floor_s`` of every layout that differs from ``layout`` only in recomputation and
    placement (schedule, v, split), with the same DualPipe schedule or none (or any schedule where
    no rank has EP time, which is all DualPipe may hide of a core without p2p; a MoE layer has it
    under ep > 1 or tp > 1, ``layer_costs._add_ep``). For such a layout L:
    - recomputation only adds to each rank's core (``planner.search.solve._schedule_groups``);
    - every rank sends and receives the same (``_rank_vectors``), so leaving that p2p time out of each
      c_i and each h_j below lowers m·max_i c_i by m times it and the hidden time by at most as much;
    - m·max_i c_i >= m·Σ_i c_i / pp, and without p2p Σ_i c_i is the same for every placement: each
      layer sits on one chunk and each end on one rank (DualPipe holds both directions' copies and
      halves them);
    - every bubble form of ``pipeline`` is >= 0 (Σ − max over ranks, or (pp/2 − 1)·max);
    - what DualPipe hides on rank j, ``dualpipe_overlap_s`` of min(h_j, compute_j) with h_j its EP
      and PP time, is at most that of the largest h_j, which L shares with ``layout``."""
    if layout.recompute != "none":
        layout = replace(layout, recompute="none")
    if _hides_ep(cm, layout):
        key = ("mean", layout.schedule, layout.layers_per_chunk, layout.num_microbatches, layout.ep_comm_overlap,
               _CORE_READS(layout))
        return memoised(cm.bound_memo, key, lambda: _mean_floor_s(cm, layout))
    # otherwise a core without p2p hides nothing under DualPipe
    return layout.num_microbatches * core_sums(cm, layout).total_s / layout.pp


def context_parallel_floor_s(cm: "CostModel", layout: Layout) -> float:
    """m·L·e/pp (seconds), e = ``LayerCosts.cp_floor_s`` of one of the L layers: at most
    ``mean_floor_s`` of a dense model's ``layout``, and of every layout that differs from it only in
    recomputation, placement (schedule, v, split), SP and TP overlap, from the CP collectives alone.
    A dense model's mean floor is m·Σ_i c_i/pp (its cores have no EP time for pairs to hide), each
    layer sits on one rank once (DualPipe halves both directions' copies: the same sum), and a
    rank's core holds at least e per layer (the ends, p2p and recomputation add to it), so
    Σ_i c_i >= L·e; e reads the micro-batch size, the CP degree and tp alone."""
    return layout.num_microbatches * cm.model.num_layers * cm.layers.cp_floor_s(layer_key(cm, layout, False)) / layout.pp


def _mean_floor_s(cm: "CostModel", layout: Layout) -> float:
    sums = core_sums(cm, layout)
    mean_s = layout.num_microbatches * sums.total_s / layout.pp
    if layout.ep_comm_overlap:  # the most pairs of any v, each hiding at most a rank's largest EP time
        pairs = most_overlapped_pairs(layout.pp, layout.num_microbatches)
        return mean_s - pairs * (1 - cm.assumptions.overlap_slowdown) * sums.ep_s
    most = PassTimes(forward_s=0.0, input_grad_s=0.0, weight_grad_s=0.0, hideable_s=sums.hideable_s,
                     compute_s=sums.hideable_s)
    return mean_s - _hidden_s(cm, layout, most)


def bubble_floor_s(cm: "CostModel", layout: Layout) -> float:
    """``mean_floor_s`` raised by a floor on the bubble (seconds), for every schedule but DualPipe
    and a DualPipeV that may hide EP time (``_hides_ep``), which keep the mean floor: at most
    ``pipeline_floor_s`` of every layout that differs from ``layout`` only in recomputation, the
    split (``layers_per_chunk``) and GPipe against 1F1B. For such a layout L, with c_i, F_i, B_i,
    W_i its ranks' core and passes:
    - without p2p and recomputation each is no larger (both add only to F and B: ``mean_floor_s``),
      and m·max_i c_i plus the bubble is non-decreasing in each rank's F and B (fact 1, and
      c_i = F_i + B_i + W_i); the sums over the ranks of those cores, S = Σ_i c_i, ΣF, ΣB, ΣW, are
      those of every split and placement (``core_sums``). DualPipeV's hidden time, with no EP
      time, is what the pairs hide of the p2p time P of a rank: at most (2m − pp − 2)/2·P <= m·P,
      which leaving P out of every core takes off m·max_i c_i. So it suffices to bound
      m·max_i c_i + bubble for the cores without p2p;
    - each bubble form of ``pipeline.schedule_bubble_s`` but DualPipe's is (Σ_i g_i − max_j g_j)/u
      (u = v for the flush and zero-bubble forms, 1 for ZB-V's and DualPipeV's), whose per-rank term
      lies between a linear l_i and c_i: g = c for the flush forms; g = max(0, F + B − W) >=
      F + B − W for zero bubble; g = max(B, 2(B − W))/2 >= B/2 for ZB-V (g <= B <= c where B >= 0,
      g = B/2 < c where not); g = (F + 2B − W)/2 for DualPipeV (<= c: F, W >= 0);
    - so with max_j g_j <= max_j c_j and m >= 1/u, the floor is at least
      (m − 1/u)·max_j c_j + Σ_i l_i / u >= (m − 1/u)·S/pp + Σ_i l_i / u (max_j c_j >= S/pp over the
      pp ranks), which for the flush forms is the familiar (m + (pp − 1)/v)·S/pp (Narayanan et al.
      SC'21, eq. 2).
    The larger of that and the mean floor is returned."""
    if layout.recompute != "none":
        layout = replace(layout, recompute="none")
    if _hides_ep(cm, layout):
        return mean_floor_s(cm, layout)
    return bubble_floor_from_sums(core_sums(cm, layout), layout.num_microbatches, layout.pp, layout.virtual_stages,
                                  layout.schedule)


def bubble_floor_from_sums(sums: CoreSums, m: int, pp: int, v: int, schedule: str) -> float:
    """``bubble_floor_s`` (seconds) of a layout whose ranks' cores have no EP time for pairs to hide
    (``_hides_ep``), from their sums (``core_sums``) and its m, pp, v and schedule alone: the mean
    floor m·S/pp for pp = 1 and DualPipe, else the larger of it and the bubble floor."""
    mean_s = m * sums.total_s / pp  # ``mean_floor_s`` where nothing is hidden
    if pp == 1 or schedule == "dualpipe":
        return mean_s
    if schedule in ZERO_BUBBLE:
        u, linear_s = v, sums.forward_s + sums.input_grad_s - sums.weight_grad_s
    elif schedule == "zb-v":
        u, linear_s = 1, sums.input_grad_s / 2
    elif schedule == "dualpipe-v":
        u, linear_s = 1, (sums.forward_s + 2 * sums.input_grad_s - sums.weight_grad_s) / 2
    else:
        u, linear_s = v, sums.total_s
    return max(mean_s, (m - 1 / u) * sums.total_s / pp + linear_s / u)


def _hides_ep(cm: "CostModel", layout: Layout) -> bool:
    """Whether ``layout`` overlaps pairs (DualPipe('s V), or Megatron's EP overlap) and a core without
    p2p has EP time for them to hide (the time ``layer_costs._add_ep`` adds: the all-to-all under
    EP, the expert-tp collectives of a MoE block under tp)."""
    return _pairs_hide(layout) and (layout.ep > 1 or layout.tp > 1) and cm.model.moe is not None


def _pairs_hide(layout: Layout) -> bool:
    """Whether ``layout``'s schedule overlaps forward-and-backward pairs (``assemble.pair_hidden_s``)."""
    return layout.schedule in DUALPIPE or layout.ep_comm_overlap


@dataclass(frozen=True, slots=True)
class CoreSums:
    """Sums over the ranks of their cores without p2p and recomputation (seconds), and the most a
    rank's core may hide under DualPipe."""

    total_s: float
    """Σ_i c_i."""
    forward_s: float
    """Σ_i F_i."""
    input_grad_s: float
    """Σ_i B_i."""
    weight_grad_s: float
    """Σ_i W_i."""
    hideable_s: float
    """The most any rank's core may hide under DualPipe: the largest ``PassTimes.hideable_s``."""
    ep_s: float
    """The most EP time any rank's core has for the EP overlap to hide: the largest ``PassTimes.ep_comm_s``."""


def core_sums(cm: "CostModel", layout: Layout) -> CoreSums:
    """``CoreSums`` of ``layout`` without recomputation. Except under DualPipe (whose halved pieces
    are keyed with pp) the sums read neither dp, m, pp nor the placement: each layer is on one rank
    once, and the ends' terms add (``add_ends``: the embedding's on the first rank, the head's on
    the last, whether or not one rank holds both), so they are keyed by the layer pieces' inputs alone."""
    halved = layout.schedule == "dualpipe"
    key = ("core sums", halved, layout.pp if halved else 0, _LAYER_READS(layout))
    return memoised(cm.bound_memo, key, lambda: _sum_cores(cm, layout))


def _sum_cores(cm: "CostModel", layout: Layout) -> CoreSums:
    groups = rank_groups(cm, layout)
    dense = _layer_piece(cm, layout, False, 0.0) if any(rank.num_dense for rank, _ in groups) else None
    moe = _layer_piece(cm, layout, True, 0.0) if any(rank.num_moe for rank, _ in groups) else None
    sums = [0.0] * 4  # per micro-batch, F, B, W: ``_VECTOR``'s first four
    hideable_s = ep_s = 0.0
    for rank, n in groups:
        parts = [(count, piece) for count, piece in ((rank.num_dense, dense), (rank.num_moe, moe)) if count]
        if rank.first or rank.last:
            parts.append((1, _ends_piece(cm, layout, rank)))
        for k in range(4):
            sums[k] += n * sum(count * piece[k] for count, piece in parts)
        hideable_s = max(hideable_s, sum(count * piece[4] for count, piece in parts))
        ep_s = max(ep_s, sum(count * piece[8] for count, piece in parts))
    return CoreSums(total_s=sums[0], forward_s=sums[1], input_grad_s=sums[2], weight_grad_s=sums[3],
                     hideable_s=hideable_s, ep_s=ep_s)


def state_floor_s(cm: "CostModel", layout: Layout) -> tuple[float, float]:
    """(min_i d_i, max_i tail_i + overhead) in seconds, each at its least over compute (fact 2):
    the data-parallel time per micro-batch and the per-step time ``layout``'s way of holding model
    states adds to ``pipeline_floor_s``. Independent of micro-batch size and recomputation; the
    placement of the chunks, v and the split set which layers each rank holds, so they are the key."""
    key = ("state", _STATE_READS(layout), placement(layout), layout.virtual_stages, layout.layers_per_chunk)
    return memoised(cm.bound_memo, key, lambda: _state_floor_s(cm, layout))


def _state_floor_s(cm: "CostModel", layout: Layout) -> tuple[float, float]:
    per_mb, tail = [], []
    for rank, _ in rank_groups(cm, layout):
        rank_per_mb, rank_tail = _rank_state_floor_s(cm, layout, rank)
        per_mb.append(rank_per_mb)
        tail.append(rank_tail)
    return min(per_mb), max(tail) + cm.assumptions.step_overhead_s


def _rank_state_floor_s(cm: "CostModel", layout: Layout, rank: RankLayers) -> tuple[float, float]:
    """One rank's (d_i, tail_i) at their least over compute."""
    compute_s = ALL_COMPUTE_S if cm.assumptions.overlap_slowdown <= 1 else NO_COMPUTE_S
    # FSDP2's offload copies each shard over the host link once per gather, so its tail grows
    # with the micro-batches: one micro-batch gives the least (``rank_time._fsdp2_host_link_bytes``)
    least = replace(layout, num_microbatches=1) if _tail_grows_with_microbatches(cm, layout) else layout
    per_mb_s, tail_s, _ = _state_times(cm, least, rank, compute_s, compute_s)
    return per_mb_s, tail_s


def _tail_grows_with_microbatches(cm: "CostModel", layout: Layout) -> bool:
    return layout.optimizer_offload and cm.convention.offload_holds_all_states


def _state_times(cm: "CostModel", layout: Layout, rank: RankLayers, fwd_compute_s: float,
                 bwd_compute_s: float) -> tuple[float, float, float]:
    """(d_i, tail_i, g_i) in seconds of one rank whose forward and backward compute take these
    times: data-parallel time per micro-batch, per-step tail, and the 16-bit gradient copy per
    micro-batch (memoised: the recomputation modes and schedules of one micro-batch size share them)."""
    params = rank_params(cm, layout, rank)
    m = layout.num_microbatches if _tail_grows_with_microbatches(cm, layout) else 0
    key = ("state times", _STATE_READS(layout), m, params, rank.num_layers, fwd_compute_s, bwd_compute_s)

    def compute() -> tuple[float, float, float]:
        t = RankTimes(fwd_compute_s=fwd_compute_s, bwd_compute_s=bwd_compute_s)
        add_data_parallel(cm, t, layout, params, rank)
        add_grad_copy(cm, t, params)  # after the data-parallel term, as in ``rank_times``
        add_optimizer(cm, t, layout, params)
        return t.dp_mb_s, t.tail_s, t.compute_s

    return memoised(cm.bound_memo, key, compute)


def step_time_s(cm: "CostModel", layout: Layout) -> float:
    """The step time ``estimate`` reports, summed in another order (equal up to rounding), without
    memory, traffic or sources: what the search checks before it costs a layout in full. Each rank
    is its core plus its states: d_i + g_i in B, g_i in compute (``rank_time.rank_times``)."""
    ranks = _ranks(cm, layout)
    per_mb, passes, tails = [], [], []
    for rank, core in zip(ranks.ranks, ranks.cores):
        rank_passes = core.passes
        d_s, tail_s, g_s = _state_times(cm, layout, rank, core.fwd_compute_s, core.bwd_compute_s)
        per_mb.append(core.per_microbatch_s + d_s + g_s)
        passes.append(PassTimes(forward_s=rank_passes.forward_s, input_grad_s=rank_passes.input_grad_s + d_s + g_s,
                                weight_grad_s=rank_passes.weight_grad_s, hideable_s=rank_passes.hideable_s,
                                compute_s=rank_passes.compute_s + g_s,  # not ``replace``: once per rank and pair
                                ep_comm_s=rank_passes.ep_comm_s)
                      if d_s or g_s else rank_passes)
        tails.append(tail_s)
    crit = max(range(len(per_mb)), key=per_mb.__getitem__)
    return (layout.num_microbatches * per_mb[crit]
            + schedule_bubble_s(layout.schedule, layout.pp, layout.virtual_stages, passes, ranks.counts)
            - _hidden_s(cm, layout, passes[crit]) + max(tails) + cm.assumptions.step_overhead_s)


def tp_overlap_sign(cm: "CostModel", layout: Layout) -> int:
    """+1 where TP overlap (``Layout.tp_comm_overlap``) leaves every layer kind of the model at least
    the TP time ``tp_s`` it has without overlap, −1 where at most that (and not +1), 0 where the
    kinds disagree or there is no overlap twin (tp = 1 or no SP); the layout's own overlap is ignored.

    The two overlap twins (layouts equal but in ``tp_comm_overlap``) then order by
    ``pipeline_floor_s``: the overlap changes only a layer's forward ``tp_s``
    (``layer_costs._tp_overlapped_s``; traffic, compute and memory-bound terms stay), which a rank's
    core adds with non-negative weights (per micro-batch (2 + recomputed share [+ 1/2 under op
    SAC])·tp_s, in F tp_s, in B the rest; W, compute and what DualPipe may hide stay;
    ``rank_time._add_layers``, ``_add_recompute``, ``add_ends`` for MTP blocks; halved alike under
    DualPipe). So each rank's c_i, F and B move the same way, and by fact 1 the twin with the larger
    tp_s has the larger or equal pipeline floor (whose DualPipe term reads each rank's hideable
    time and compute alone)."""
    if layout.tp == 1 or not layout.sequence_parallel:
        return 0
    key = ("overlap sign", layout.micro_batch_size, layout.tp, layout.cp, layout.ep, layout.expert_tp)

    def compute() -> int:
        signs = set()
        for moe in (False, True) if cm.model.moe is not None else (False,):
            key = layer_key(cm, layout, moe)  # with tp > 1 and SP, its tp_overlap is the layout's overlap
            plain = cm.layers.tp_s(replace(key, tp_overlap=False))
            overlapped = cm.layers.tp_s(replace(key, tp_overlap=True))
            signs.add(1 if overlapped >= plain else -1)
        return signs.pop() if len(signs) == 1 else 0

    return memoised(cm.bound_memo, key, compute)


def tp_overlap_extra_bytes(cm: "CostModel", layout: Layout) -> float:
    """Bytes TP overlap adds to every rank's memory total, so to the peak: the userbuffers in place
    of the one gathered TP block, or the symmetric workspace beside it (``rank_memory.tp_buffer_bytes``;
    block = s·b/cp·h·B, the same on every rank) with the allocator's fragmentation on them (``rank_memory.stage_memory``: the
    overhead is a reserve plus ``allocator_fragmentation``·(activations + buffers)). Nothing else a
    rank holds reads the overlap (``rank_memory.rank_static``)."""
    key = ("overlap bytes", layout.micro_batch_size, layout.cp, layout.tp)

    def compute() -> float:
        rank = rank_groups(cm, layout)[0][0]
        params = rank_params(cm, layout, rank)
        on, off = (rank_buffer_bytes(cm, replace(layout, tp_comm_overlap=value), rank, params)
                   for value in (True, False))
        return (on - off) * (1 + cm.assumptions.allocator_fragmentation)

    return memoised(cm.bound_memo, key, compute)


def _hidden_s(cm: "CostModel", layout: Layout, passes: PassTimes) -> float:
    """What the overlapped pairs hide on a rank with these passes (``assemble.pair_hidden_s``)."""
    return pair_hidden_s(layout, passes, cm.assumptions.overlap_slowdown)


def _core(v: list[float]) -> Core:
    """``rank_time.rank_core_times`` without traffic or sources, from a rank's ``_VECTOR`` (not
    memoised apart: ``_ranks`` holds it, and a rank's core is seldom shared by two of its keys)."""
    passes = PassTimes(forward_s=v[1], input_grad_s=v[2], weight_grad_s=v[3], hideable_s=v[4], compute_s=v[5],
                       ep_comm_s=v[8])
    return Core(per_microbatch_s=v[0], fwd_compute_s=v[6], bwd_compute_s=v[7], passes=passes)


def _rank_vectors(cm: "CostModel", layout: Layout, ranks: list[RankLayers]) -> list[list[float]]:
    """``_VECTOR`` of each rank's core: each layer kind, the ends it holds and its p2p, by count. The
    pieces' memo keys are built once per layout (they read its fields, not the rank's), and a layer
    piece once per recomputed share."""
    layer_reads, edge_reads = _LAYER_READS(layout), _EDGE_READS(layout)
    p2p = _p2p_piece(cm, layout, edge_reads) if layout.pp > 1 else None
    layers: dict[tuple[bool, float], tuple[float, ...]] = {}
    out = []
    for rank in ranks:
        share = recomputed_layers(cm, layout, rank.num_layers) / max(rank.num_layers, 1)
        parts = []
        for moe, n in ((False, rank.num_dense), (True, rank.num_moe)):
            if n:
                piece = layers.get((moe, share))
                if piece is None:
                    piece = layers[moe, share] = _layer_piece(cm, layout, moe, share, layer_reads)
                parts.append((n, piece))
        if rank.first or rank.last:
            parts.append((1, _ends_piece(cm, layout, rank, edge_reads)))
        if p2p is not None:
            parts.append((1, p2p))
        vector = [0.0] * len(_VECTOR)
        for n, piece in parts:
            vector = [a + n * x for a, x in zip(vector, piece)]
        out.append(vector)
    return out


def _vector(cm: "CostModel", layout: Layout, add: Callable[[RankTimes], None]) -> tuple[float, ...]:
    """``_VECTOR`` of the core terms ``add`` puts in an empty ``RankTimes`` (halved for DualPipe,
    ``rank_time.one_direction``, which is linear)."""
    t = RankTimes()
    add(t)
    t.compute_s = t.fwd_compute_s + t.bwd_compute_s
    if layout.schedule == "dualpipe":
        t = one_direction(t)
    p = t.passes()
    return (t.per_microbatch_s, p.forward_s, p.input_grad_s, p.weight_grad_s, p.hideable_s, p.compute_s,
            t.fwd_compute_s, t.bwd_compute_s, p.ep_comm_s)


def _layer_piece(cm: "CostModel", layout: Layout, moe: bool, share: float,
                 reads: tuple | None = None) -> tuple[float, ...]:
    """One layer: forward, backward, its recomputed share, TP/CP/EP (``add_layer_kind``); ``reads``:
    ``_LAYER_READS(layout)`` where the caller has it."""
    key = ("layer", moe, share, layout.schedule == "dualpipe", reads or _LAYER_READS(layout))
    return memoised(cm.bound_memo, key, lambda: _vector(cm, layout, lambda t: add_layer_kind(
        cm, t, cm.layers.forward(layer_key(cm, layout, moe)), layout, 1, share)))


def _ends_piece(cm: "CostModel", layout: Layout, rank: RankLayers, reads: tuple | None = None) -> tuple[float, ...]:
    """The embedding and the output head with its loss, on the first and last rank (``add_ends``);
    ``reads``: ``_EDGE_READS(layout)`` where the caller has it."""
    mtp = rank.last and cm.model.num_mtp_layers > 0  # the MTP blocks are layers: their TP time reads the overlap
    key = ("ends", rank.first, rank.last, layout.schedule == "dualpipe", reads or _EDGE_READS(layout),
           mtp and layout.tp_comm_overlap)
    return memoised(cm.bound_memo, key, lambda: _vector(cm, layout, lambda t: add_ends(cm, t, layout, rank)))


def _p2p_piece(cm: "CostModel", layout: Layout, reads: tuple) -> tuple[float, ...]:
    """Pipeline sends and receives of one micro-batch on one rank (``add_pipeline``); ``reads``:
    ``_EDGE_READS(layout)``."""
    key = ("p2p", chunks_per_rank(layout.schedule, layout.virtual_stages), layout.schedule == "dualpipe", layout.dp,
           layout.pp, reads)
    return memoised(cm.bound_memo, key, lambda: _vector(cm, layout, lambda t: add_pipeline(cm, t, layout)))
