"""Score the cost model on published runs, per family, and cross-validate a fit by family.

``score(rows, evaluate_fn)`` maps every row (``runs.map_row``), merges rows that repeat one
configuration (NeMo tables across container versions: the group's median measurement is scored
once), calls ``evaluate_fn(run) -> CostBreakdown`` on each configuration and returns one
``FamilyScore`` per family. Throughput error is signed ``predicted / measured - 1`` on tokens/s per
GPU; "absolute" is its magnitude. A calibration passes its own ``evaluate_fn``;
``cross_validate_by_family`` fits on all families but one and scores the one left out.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from functools import lru_cache

from costmodels.breakdown import TIME_TERMS, CostBreakdown
from hardware_specs import NodeSpec, load_node
from autoplan_base.errors import AutoplanError
from hardware_specs.units import GIB

from .runs import MappedRun, Unexpressible, map_row
from .stats import kendall_tau, median, percentile

ALLOCATOR_MEMORY_FAMILIES = frozenset({"torchtitan", "gpu_truth"})
"""Families whose peak memory is the caching allocator's peak reserved bytes, not the device's:
torchtitan logs ``torch.cuda.memory_stats()["reserved_bytes.all.peak"]`` (``DeviceMemoryMonitor``,
pytorch/torchtitan ``torchtitan/tools/metrics.py``) and ``benchmarks/gpu_truth.py`` records
``torch.cuda.max_memory_reserved`` (its rows' ``extra.memory_basis``); both leave out what lives outside the
allocator, the CUDA context and NCCL's buffers. Others (the BLOOM sweep) read the device's
used memory (``nvidia-smi``), which counts everything."""
OUTSIDE_ALLOCATOR = ("cuda_context", "nccl_buffers")
"""``StageMemory.overhead_parts`` that live outside the caching allocator."""
MERGED_FAMILIES = frozenset({"nemo_megatron_bridge_perf"})
"""Vendor tables that repeat a configuration across container versions (the development set's
README, ``shared/published_runs/README.md``, Caveats)."""

EvaluateFn = Callable[[MappedRun], CostBreakdown]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    """One scored configuration (one row, or several rows that repeat it)."""

    row_ids: tuple[str, ...]
    family: str
    run: MappedRun
    measured_tokens_per_s_per_gpu: float | None
    """Median over the rows of the group; None for an out-of-memory cell."""
    predicted_tokens_per_s_per_gpu: float
    predicted_fits: bool
    predicted_peak_memory_gib: float
    predicted_mfu: float
    predicted_peak_memory_as_measured_gib: float = 0.0
    """The predicted peak as the family measures it (``ALLOCATOR_MEMORY_FAMILIES``)."""
    time_fractions: dict[str, float]
    """Each step-time term over the step time."""

    @property
    def signed_error(self) -> float | None:
        """predicted / measured - 1 (positive = predicted too fast)."""
        if self.measured_tokens_per_s_per_gpu is None:
            return None
        return self.predicted_tokens_per_s_per_gpu / self.measured_tokens_per_s_per_gpu - 1

    @property
    def memory_error(self) -> float | None:
        """Predicted / measured peak memory - 1, where the source measured it."""
        measured = self.run.measured_peak_memory_gib
        return None if not measured else self.predicted_peak_memory_as_measured_gib / measured - 1


@dataclass(frozen=True, slots=True, kw_only=True)
class FamilyScore:
    """The figures of one family (all ratios as fractions, not percent)."""

    family: str
    num_rows: int
    num_evaluated: int
    """Configurations scored (after merging repeats)."""
    not_expressible: dict[str, int]
    """Rows the model cannot express yet, by reason."""
    signed_median: float | None
    signed_p90: float | None
    abs_median: float | None
    abs_p90: float | None
    oom_right: tuple[int, int]
    """(right, total) of fits vs the recorded ok / oom status."""
    oom_cells_predicted: tuple[int, int]
    """(predicted out of memory, total) over the recorded out-of-memory cells."""
    memory_abs_median: float | None
    memory_signed_median: float | None
    num_memory: int
    kendall_tau: float | None
    """Pair-weighted mean of tau-b over the family's sweeps (2+ distinct layouts each)."""
    num_sweeps: int
    results: tuple[RunResult, ...] = field(default=(), repr=False)

    def to_dict(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k != "results"}
        out["runs"] = [_result_dict(r) for r in self.results]
        return out


@lru_cache(maxsize=None)
def _node(name: str) -> NodeSpec:
    return load_node(name)


def default_evaluate(run: MappedRun) -> CostBreakdown:
    """The shipped cost model through the public API."""
    import planner

    return planner.evaluate(**run.evaluate_kwargs())


@dataclass(frozen=True, slots=True)
class MappedRows:
    """Rows mapped once (``mapped_rows``), to be scored under many evaluate functions: a grid
    search scores the same rows at every point, and mapping them costs more than costing them."""

    groups: tuple[tuple[MappedRun, ...], ...]
    """Runs scored together (``_groups``)."""
    unexpressible: dict[str, dict[str, int]]
    """Per family, the rows not yet expressible, by reason."""
    rows_per_family: dict[str, int]


def mapped_rows(rows: Iterable[dict]) -> MappedRows:
    rows = list(rows)
    mapped, reasons = map_rows(rows)
    counts: dict[str, int] = defaultdict(int)
    for row in rows:
        counts[row["source_family"]] += 1
    return MappedRows(groups=tuple(tuple(g) for g in _groups(mapped)),
                      unexpressible={f: dict(r) for f, r in reasons.items()}, rows_per_family=dict(counts))


def score(rows: Iterable[dict], evaluate_fn: EvaluateFn = default_evaluate) -> list[FamilyScore]:
    """One ``FamilyScore`` per family in ``rows``, sorted by family name."""
    return score_mapped(mapped_rows(rows), evaluate_fn)


def score_mapped(rows: MappedRows, evaluate_fn: EvaluateFn = default_evaluate) -> list[FamilyScore]:
    """``score`` of rows mapped beforehand."""
    reasons = {f: dict(r) for f, r in rows.unexpressible.items()}
    results: dict[str, list[RunResult]] = defaultdict(list)
    for group in rows.groups:
        try:
            results[group[0].family].append(_evaluate_group(list(group), evaluate_fn))
        except AutoplanError:
            family = reasons.setdefault(group[0].family, {})
            family["layout rejected"] = family.get("layout rejected", 0) + len(group)
    return [_family_score(f, n, results.get(f, []), reasons.get(f, {})) for f, n in sorted(rows.rows_per_family.items())]


def map_rows(rows: list[dict]) -> tuple[list[MappedRun], dict[str, dict[str, int]]]:
    """Mapped runs, and per family the count of rows not yet expressible, by reason."""
    mapped: list[MappedRun] = []
    reasons: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for row in rows:
        try:
            mapped.append(map_row(row, _node))
        except Unexpressible as err:
            reasons[row["source_family"]][err.reason] += 1
    return mapped, reasons


def assumption_counts(rows: list[dict]) -> dict[str, tuple[int, int]]:
    """Per assumed default (``MappedRun.assumed`` key): (rows that depend on it, families)."""
    mapped, _ = map_rows(rows)
    rows_by: dict[str, int] = {}
    families: dict[str, set[str]] = {}
    for run in mapped:
        for key in set(run.assumed):
            rows_by[key] = rows_by.get(key, 0) + 1
            families.setdefault(key, set()).add(run.family)
    return {k: (rows_by[k], len(families[k])) for k in sorted(rows_by, key=lambda k: (-rows_by[k], k))}


def overall_median(scores: list[FamilyScore]) -> float | None:
    """Median over families of each family's median absolute throughput error."""
    values = [s.abs_median for s in scores if s.abs_median is not None]
    return median(values) if values else None


def cross_validate_by_family(rows: list[dict], fit: Callable[[list[dict]], EvaluateFn]) -> list[FamilyScore]:
    """Leave-one-family-out: for each family, ``fit`` on the other rows, score the held-out family."""
    families = sorted({row["source_family"] for row in rows})
    held_out = []
    for family in families:
        evaluate_fn = fit([row for row in rows if row["source_family"] != family])
        held_out += score([row for row in rows if row["source_family"] == family], evaluate_fn)
    return held_out


def _groups(mapped: list[MappedRun]) -> list[list[MappedRun]]:
    """Runs of ``MERGED_FAMILIES`` that repeat one configuration form one group; others stand alone."""
    groups: dict[tuple, list[MappedRun]] = defaultdict(list)
    for run in mapped:
        key = run.config_key if run.family in MERGED_FAMILIES else (run.row_id,)
        groups[(run.family, run.status, key)].append(run)
    return list(groups.values())


def _evaluate_group(group: list[MappedRun], evaluate_fn: EvaluateFn) -> RunResult:
    run = group[0]
    breakdown = evaluate_fn(run)
    measured = [r.measured_tokens_per_s_per_gpu for r in group if r.measured_tokens_per_s_per_gpu is not None]
    step = breakdown.step_time_s
    return RunResult(
        row_ids=tuple(r.row_id for r in group), family=run.family, run=run,
        measured_tokens_per_s_per_gpu=median(measured) if measured else None,
        predicted_tokens_per_s_per_gpu=breakdown.tokens_per_s / breakdown.num_gpus,
        predicted_fits=breakdown.fits, predicted_peak_memory_gib=breakdown.peak_memory_bytes / GIB,
        predicted_mfu=breakdown.mfu,
        predicted_peak_memory_as_measured_gib=_as_measured_bytes(breakdown, run.family) / GIB,
        time_fractions={t.removesuffix("_s"): getattr(breakdown, t) / step for t in TIME_TERMS})


def _as_measured_bytes(breakdown: CostBreakdown, family: str) -> float:
    """The peak rank's predicted memory as ``family`` measures it: without the parts outside the
    caching allocator where it reads the allocator (``ALLOCATOR_MEMORY_FAMILIES``)."""
    peak = breakdown.peak_stage
    if family not in ALLOCATOR_MEMORY_FAMILIES:
        return peak.total_bytes
    return peak.total_bytes - sum(v for name, v in peak.overhead_parts if name in OUTSIDE_ALLOCATOR)


def _family_score(family: str, num_rows: int, results: list[RunResult], reasons: dict[str, int]) -> FamilyScore:
    signed = [r.signed_error for r in results if r.signed_error is not None]
    absolute = [abs(e) for e in signed]
    oom = [r for r in results if r.run.status == "oom"]
    memory = [r.memory_error for r in results if r.memory_error is not None]
    tau, sweeps = _sweep_tau(results)
    return FamilyScore(
        family=family, num_rows=num_rows, num_evaluated=len(results), not_expressible=reasons,
        signed_median=_maybe(median, signed), signed_p90=_maybe(lambda v: percentile(v, 90), signed),
        abs_median=_maybe(median, absolute), abs_p90=_maybe(lambda v: percentile(v, 90), absolute),
        oom_right=(sum(r.predicted_fits == (r.run.status == "ok") for r in results), len(results)),
        oom_cells_predicted=(sum(not r.predicted_fits for r in oom), len(oom)),
        memory_abs_median=_maybe(median, [abs(e) for e in memory]), memory_signed_median=_maybe(median, memory),
        num_memory=len(memory), kendall_tau=tau, num_sweeps=sweeps, results=tuple(results))


def _sweep_tau(results: list[RunResult]) -> tuple[float | None, int]:
    """Pair-weighted mean tau-b over sweeps of 2+ distinct measured layouts (a pair is tau = ±1).

    A sweep is one ``sweep_key`` (same model, GPU, GPU count, sequence and precision); runs of one
    layout inside it (MegaScale's software ablations) count once, at their median measurement.
    """
    sweeps: dict[tuple, dict] = defaultdict(lambda: defaultdict(list))
    for r in results:
        if r.measured_tokens_per_s_per_gpu is not None:
            sweeps[r.run.sweep_key][r.run.layout].append(r)
    total = weight = 0.0
    used = 0
    for by_layout in sweeps.values():
        if len(by_layout) < 2:
            continue
        members = list(by_layout.values())
        tau = kendall_tau([m[0].predicted_tokens_per_s_per_gpu for m in members],
                          [median([r.measured_tokens_per_s_per_gpu for r in m]) for m in members])
        if tau is None:
            continue
        pairs = len(members) * (len(members) - 1) / 2
        total += tau * pairs
        weight += pairs
        used += 1
    return (total / weight if weight else None), used


def _maybe(fn: Callable[[list[float]], float], values: list[float]) -> float | None:
    return fn(values) if values else None


def _result_dict(r: RunResult) -> dict:
    L = r.run.layout
    return {
        "rows": list(r.row_ids), "status": r.run.status, "hardware": r.run.hardware_name,
        "gpus": r.run.num_gpus, "precision": r.run.precision, "fp8_recipe": r.run.fp8_recipe,
        "layout": f"dp{L.dp} tp{L.tp} pp{L.pp} cp{L.cp} ep{L.ep} v{L.virtual_stages} mb{L.micro_batch_size}"
                  f"x{L.num_microbatches} zero{L.zero_stage} {L.recompute}{' sp' if L.sequence_parallel else ''}",
        "measured_tokens_per_s_per_gpu": r.measured_tokens_per_s_per_gpu, "measured_basis": r.run.measured_basis,
        "predicted_tokens_per_s_per_gpu": r.predicted_tokens_per_s_per_gpu, "signed_error": r.signed_error,
        "predicted_fits": r.predicted_fits, "predicted_peak_memory_gib": r.predicted_peak_memory_gib,
        "measured_peak_memory_gib": r.run.measured_peak_memory_gib, "predicted_mfu": r.predicted_mfu,
        "time_fractions": r.time_fractions, "assumptions": list(r.run.assumptions),
    }
