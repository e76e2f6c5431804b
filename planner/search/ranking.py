"""How candidates are ordered: one total order shared by every solver, so results are exact and
deterministic (ties in step time go to less memory, then to the layout's fields in order); and
which plans the model cannot tell apart (within the measured tie band, ``costmodels.tie_band``)
and which of them is picked (``tie_key``)."""

from __future__ import annotations

from costmodels.bands import Band, memory_risk
from costmodels.breakdown import CostBreakdown
from costmodels.layout import Layout
from costmodels.tie_band import TieBand, num_uncertain, shipped_tie_band


_FIELDS = tuple(Layout.__dataclass_fields__)


def layout_key(layout: Layout) -> tuple:
    """The layout's fields in declaration order, for tie-breaking."""
    return tuple(getattr(layout, name) for name in _FIELDS)


def rank_key(breakdown: CostBreakdown) -> tuple:
    """Faster first; then lower peak memory; then the layout's fields."""
    return (round(breakdown.step_time_s, 12), round(breakdown.peak_memory_bytes), layout_key(breakdown.layout))


def mesh_of(layout: Layout) -> tuple[int, int, int, int, int]:
    """The parallel degrees (dp, tp, pp, cp, ep): alternatives are the best plan of distinct meshes."""
    return (layout.dp, layout.tp, layout.pp, layout.cp, layout.ep)


def tie_band(runtime: str = "") -> TieBand:
    """The relative step-time band within which layouts count as tied: the cost model's measured
    between-layout error (``costmodels.tie_band``, read once on first use), with which mechanisms
    are uncertain on ``runtime`` (empty: over every runtime's pairs). Among tied layouts the least
    risky is picked (``tie_key``)."""
    return shipped_tie_band(runtime=runtime)


RECOMPUTE_ORDER = {"none": 0, "selective": 1, "op-sac": 2, "full": 3}
"""Recomputation modes, simplest first."""


SCHEDULE_ORDER = {"gpipe": 0, "1f1b": 0, "interleaved": 1, "zb-h1": 2, "interleaved-zb": 2, "zb-v": 2,
                  "dualpipe-v": 3, "dualpipe": 4}
"""How unusual a pipeline schedule is, for ``simplicity_class`` (GPipe and 1F1B are split later)."""


def simplicity_class(layout: Layout, standard_zero_stage: int = 0) -> tuple:
    """What makes one layout simpler than another, least first, for breaking ties inside the band:

    1. how many of context parallel, expert parallel and optimizer offload it uses (each only when needed);
    2. how many parallel axes (dp, tp, pp, cp, ep) have degree > 1;
    3. the pipeline schedule: 1F1B/GPipe, interleaved, the zero-bubble family, DualPipeV, then
       DualPipe (two parameter copies, and not in torch 2.13, so ``launch`` cannot run it);
    4. the ZeRO stage's distance from the runtime's standard one (``standard_zero_stage``, what its
       published recipes run: Megatron's distributed optimizer, torchtitan's FSDP; 0 where none is);
    5. the number of micro-batches;
    6. recomputation: none, then selective, then full;
    7. the virtual stages per pipeline rank (1 = a plain schedule);
    8. TP communication overlap off before on (it needs Transformer Engine or torch.compile);
    9. EP communication overlap off before on (it holds one more layer of activations and needs
       CUDA_DEVICE_MAX_CONNECTIONS above 1)."""
    exotic = (layout.cp > 1) + (layout.ep > 1) + bool(layout.optimizer_offload)
    axes = sum(d > 1 for d in (layout.dp, layout.tp, layout.pp, layout.cp, layout.ep))
    return (exotic, axes, SCHEDULE_ORDER[layout.schedule], abs(layout.zero_stage - standard_zero_stage),
            layout.num_microbatches, RECOMPUTE_ORDER[layout.recompute], layout.virtual_stages, layout.tp_comm_overlap,
            layout.ep_comm_overlap)


def simplicity_key(layout: Layout, standard_zero_stage: int = 0) -> tuple:
    """``simplicity_class``, then 1F1B before GPipe, sequence parallelism on before off, the alltoall
    dispatcher before a flex backend and whole NVLink domains before a partial placement, then
    ``layout_key`` so the order is total and deterministic. GPipe never beats its 1F1B twin and,
    without a measured profile, a layout never beats its sequence-parallel twin (``search.
    _undominated``); a flex dispatcher or a placement the search skips costs what its twin costs
    (``search.space._placed_meshes``): so each kept twin is the simpler one too, and a solver that
    skips the other picks what a solver that costs it picks."""
    return simplicity_class(layout, standard_zero_stage) + (
        layout.schedule == "gpipe", not layout.sequence_parallel, layout.moe_dispatcher != "alltoall",
        layout.gpus_per_nvlink_domain != 0, layout_key(layout))


def tie_key(breakdown: CostBreakdown, memory_band: Band | None, band: TieBand) -> tuple:
    """How tied plans are ordered, least risky first: a plan whose memory band stays under the cap
    before one whose band crosses it (``costmodels.bands.memory_risk``; callers pass the job's
    ``shipped_memory_band(runtime)``, read once per ranking: an out-of-memory crash costs more than
    a tie may give up); then fewer mechanisms in use whose between-layout error is large or unmeasured
    (``costmodels.tie_band.num_uncertain``: the model's word on them is weakest); then
    ``simplicity_key``. Twins a solver skips (GPipe, no sequence parallelism) use the same
    mechanisms as the twin it keeps, so the order between them is still ``simplicity_key``'s."""
    risky = memory_risk(breakdown.peak_memory_bytes, breakdown.memory_usable_bytes, memory_band)
    return (risky, num_uncertain(breakdown.layout, band)) + simplicity_key(breakdown.layout, band.standard_zero_stage)


TIE_REASONS = ("memory band under the cap", "fewest uncertain mechanisms", "simplest layout")
"""Why the pick won its tie, by the first ``tie_key`` part where it beats the runner-up."""


def tie_reason(pick: CostBreakdown, tied: list[CostBreakdown], memory_band: Band | None, band: TieBand) -> str:
    """One line on why ``pick`` won among ``tied``: the ``tie_key`` part that separates it from the
    next in that order, and whether its own memory band crosses the cap. With no other mesh tied,
    the pick is its mesh's least risky layout (``MeshBand.simplest``)."""
    risky = memory_risk(pick.peak_memory_bytes, pick.memory_usable_bytes, memory_band)
    risk = "its memory band crosses the cap (every tied layout's does)" if risky else "no memory risk"
    others = [b for b in tied if b is not pick]
    if not others:
        return f"least risky of the layouts tied in its own mesh; {risk}"
    key = tie_key(pick, memory_band, band)
    runner_plan = min(others, key=lambda b: tie_key(b, memory_band, band))
    runner = tie_key(runner_plan, memory_band, band)
    part = next(i for i, (a, b) in enumerate(zip(key, runner)) if a != b)
    if part == 1:
        theirs = [m for m in band.in_use(runner_plan.layout) if band.uncertain(m) and m not in band.in_use(pick.layout)]
        named = f": the runner-up's {', '.join(theirs)}" if theirs else ""
        why = f"fewest uncertain mechanisms ({key[1]} against {runner[1]}{named})"
    else:
        why = TIE_REASONS[min(part, 2)]
    return f"{why}; {risk}"


class MeshBand:
    """One mesh's fastest plan (by ``rank_key``) and its plans within ``band`` of it, as plans arrive."""

    def __init__(self, band: TieBand, memory_band: Band | None) -> None:
        """``memory_band``: the job's (``shipped_memory_band(runtime)``; None: no band)."""
        self.tie_band = band
        self.memory_band = memory_band
        self.band = band.band_rel
        self.fastest: CostBreakdown | None = None
        self.fastest_key: tuple = ()
        self.plans: list[CostBreakdown] = []

    def offer(self, breakdown: CostBreakdown) -> None:
        key = rank_key(breakdown)
        if self.fastest is None or key < self.fastest_key:
            self.fastest, self.fastest_key = breakdown, key
            self.plans = [b for b in self.plans if b.step_time_s <= self.limit_s()]
        if breakdown.step_time_s <= self.limit_s():
            self.plans.append(breakdown)

    def limit_s(self) -> float:
        assert self.fastest is not None
        return self.fastest.step_time_s * (1 + self.band)

    def simplest(self) -> tuple[CostBreakdown, int]:
        """The simplest plan within the band, and how many simplicity classes the band holds."""
        pick = min(self.plans, key=lambda b: tie_key(b, self.memory_band, self.tie_band))
        return pick, len({simplicity_class(b.layout, self.tie_band.standard_zero_stage) for b in self.plans})


def prefer_simplest(ranked: tuple[CostBreakdown, ...], band: TieBand, *, memory_band: Band | None,
                    tied_in_mesh: dict[tuple, int] | None = None) -> tuple[tuple[CostBreakdown, ...], int, str]:
    """``ranked`` (fastest first) with the least risky plan within ``band`` of the fastest
    (``tie_key``) moved to the front; how many layouts were within the band (each tied plan counts
    the simplicity classes its mesh had within the band: ``tied_in_mesh``, by ``mesh_of``; 1 where
    not given); and why the pick won (``tie_reason``; empty when nothing tied). ``memory_band``:
    the job's (``shipped_memory_band(runtime)``; None: no band)."""
    if not ranked:
        return ranked, 0, ""
    limit_s = ranked[0].step_time_s * (1 + band.band_rel)
    tied = [b for b in ranked if b.step_time_s <= limit_s]
    pick = min(tied, key=lambda b: tie_key(b, memory_band, band))
    counts = tied_in_mesh or {}
    num_tied = sum(counts.get(mesh_of(b.layout), 1) for b in tied)
    reason = tie_reason(pick, tied, memory_band, band) if num_tied > 1 else ""
    return (pick,) + tuple(b for b in ranked if b is not pick), num_tied, reason


def ranked_plans(bands: dict, top_k: int, band: TieBand) -> tuple[tuple[CostBreakdown, ...], dict[tuple, int]]:
    """The K fastest meshes (by ``rank_key`` of their fastest plan), and every other mesh whose
    fastest plan is within ``band`` of the fastest of all (tied with it, so compared for the
    pick whatever K is), each as its simplest plan within the band, ordered by that plan's
    ``rank_key``; and per mesh how many simplicity classes its band held. Shared by both solvers."""
    order = sorted(bands.values(), key=lambda band: band.fastest_key)
    tied_s = order[0].fastest.step_time_s * (1 + band.band_rel) if order else 0.0
    fastest = order[:top_k] + [band for band in order[top_k:] if band.fastest.step_time_s <= tied_s]
    picks = [band.simplest() for band in fastest]
    ranked = tuple(sorted((plan for plan, _ in picks), key=rank_key))
    return ranked, {mesh_of(plan.layout): n for plan, n in picks}
