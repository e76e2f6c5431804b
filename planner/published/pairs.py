"""The cost model's between-layout error: how far its predicted ratio of two layouts of one job
misses the measured ratio, over every pair of measured layouts inside one published sweep.

A sweep is one ``MappedRun.sweep_key`` (same model, GPU, GPU count, sequence and precision); a
layout measured several times in it counts once, at its median. For layouts a and b with predicted
and measured tokens/s per GPU ``p`` and ``m``, the pair's error is ``|ln((p_a / p_b) / (m_a / m_b))|``
(symmetric in a and b; tokens per second per GPU is the inverse of step time per token, so this is
the log error of the predicted step-time ratio). A pair whose layouts differ in one mechanism
(``MECHANISMS``; dp and the micro-batch count follow from the others) is counted under it in
``by_mechanism_in_use``; so is a pair whose layouts both run a mechanism at
one setting (``LayoutPair.held``: the model's word between layouts that run it), each pair under
the runtime its runs ran (``costmodels.tie_band.in_use`` with that runtime's standard ZeRO stage).
Pure: takes ``scoring.RunResult`` values, reads nothing.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import combinations

from costmodels.layout import Layout
from costmodels.tie_band import in_use, standard_zero_stage

from .scoring import RunResult
from .stats import median

MECHANISMS: tuple[str, ...] = ("tp", "pp", "cp", "ep", "zero_stage", "recompute", "micro_batch_size", "schedule",
                               "optimizer_offload")
"""What a pair may differ in and be counted under (the issue's list, with expert parallelism and
optimizer offload)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LayoutPair:
    """Two measured layouts of one sweep, and the model's error on their ratio."""

    family: str
    sweep: tuple
    """The sweep's ``MappedRun.sweep_key``."""
    rows: tuple[tuple[str, ...], tuple[str, ...]]
    """The row ids behind each layout."""
    differs_in: tuple[str, ...]
    """What differs between the two: ``MECHANISMS`` names, ``global_batch`` or ``other``."""
    runtime: str
    """The runtime both layouts ran on (one sweep, one runtime)."""
    held: tuple[str, ...]
    """Mechanisms both layouts run at one setting (in use in both, not among ``differs_in``), as
    ``costmodels.tie_band.in_use`` counts them on ``runtime``."""
    log_error: float
    """``|ln(predicted ratio / measured ratio)|`` (≥ 0)."""


def differences(a: Layout, b: Layout, batch_a: int, batch_b: int) -> tuple[str, ...]:
    """What differs between two layouts of one sweep, in ``MECHANISMS`` order; ``schedule`` covers
    the schedule and its virtual stages; ``other`` the stage split, activation offload, expert TP,
    SP and TP overlap; ``global_batch`` a different batch."""
    out = [m for m in MECHANISMS if m != "schedule" and getattr(a, m) != getattr(b, m)]
    if (a.schedule, a.virtual_stages) != (b.schedule, b.virtual_stages):
        out.insert(MECHANISMS.index("schedule"), "schedule")
    if any(getattr(a, f) != getattr(b, f) for f in ("layers_per_chunk", "activation_offload_layers", "expert_tp",
                                                    "sequence_parallel", "tp_comm_overlap")):
        out.append("other")
    if batch_a != batch_b:
        out.append("global_batch")
    return tuple(out)


def layout_pairs(results: Iterable[RunResult]) -> list[LayoutPair]:
    """Every pair of distinct measured layouts inside one sweep, with its ratio error."""
    sweeps: dict[tuple, dict[tuple, list[RunResult]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        if r.measured_tokens_per_s_per_gpu is not None:
            sweeps[r.run.sweep_key][(r.run.layout, r.run.global_batch)].append(r)
    pairs = []
    for sweep, by_layout in sweeps.items():
        for (key_a, runs_a), (key_b, runs_b) in combinations(by_layout.items(), 2):
            measured = _median_measured(runs_a) / _median_measured(runs_b)
            predicted = runs_a[0].predicted_tokens_per_s_per_gpu / runs_b[0].predicted_tokens_per_s_per_gpu
            differs = differences(key_a[0], key_b[0], key_a[1], key_b[1])
            runtime = runs_a[0].run.runtime
            standard = standard_zero_stage(runtime)
            pairs.append(LayoutPair(
                family=runs_a[0].family, sweep=sweep, rows=(_rows(runs_a), _rows(runs_b)), differs_in=differs,
                runtime=runtime, held=tuple(m for m in in_use(key_a[0], standard) if m not in differs),
                log_error=abs(math.log(predicted / measured))))
    return pairs


def relative_error(log_errors: list[float]) -> float:
    """The median pair error as a relative step-time figure: ``exp(median |ln ratio error|) - 1``."""
    return math.exp(median(log_errors)) - 1


def by_mechanism_in_use(pairs: Iterable[LayoutPair], runtime: str | None = None) -> dict[str, tuple[int, int, list[float]]]:
    """Per mechanism (every one listed): (pairs that differ in it alone, pairs that hold it, the log
    errors of both), over the pairs of ``runtime`` (None: every runtime's)."""
    out: dict[str, tuple[int, int, list[float]]] = {m: (0, 0, []) for m in MECHANISMS}
    for pair in pairs:
        if runtime is not None and pair.runtime != runtime:
            continue
        for m in MECHANISMS:
            alone, held = pair.differs_in == (m,), m in pair.held
            if alone or held:
                n_alone, n_held, errors = out[m]
                out[m] = (n_alone + alone, n_held + held, errors + [pair.log_error])
    return out


def _median_measured(runs: list[RunResult]) -> float:
    return median([r.measured_tokens_per_s_per_gpu for r in runs])


def _rows(runs: list[RunResult]) -> tuple[str, ...]:
    return tuple(row for r in runs for row in r.row_ids)
