"""Fit the memory model's allocator constant on the published runs' measured peaks, report it by
leave-one-family-out, and build the memory band and its fit rule from those held-out residuals.

Run: ``.venv/bin/python benchmarks/memory_fit.py [--write]``. Tries every value of ``AXES``
(``Assumptions.allocator_fragmentation``: the share of live activations and buffers the caching
allocator holds beyond them) on the runs that measured peak memory. The shipped value is fitted on
the families of the shared band group (``costmodels.bands.memory_band_group``);
leave-one-family-out scores each family with the value fitted on the other families of its group
(the shared group's where its own has no other) and, for comparison, with the value fitted on
every other family. A residual is ``measured / predicted - 1`` (the predicted peak as the family
measures it, ``scoring.ALLOCATOR_MEMORY_FAMILIES``). The band's upper edge is the
``MEMORY_BAND_QUANTILE`` of those held-out residuals, one edge for the deepspeed runtime from the
families that ran it and one for every other runtime from the rest; a layout fits only when its
predicted peak × (1 + its runtime's upper edge) is under the memory cap. Then it checks the
development set's out-of-memory cells against that rule (an OOM cell that a run of the same sweep
with the same layout and a micro-batch at least as large contradicts is counted apart). ``--write``
stores the constants as the generated module ``costmodels/memory_calibration_data.py`` and the record
``costmodels/data/memory_calibration.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from gpu_records import fit_rows  # noqa: E402
from published import DATA  # noqa: E402

from costmodels.assumptions import OWN_MEMORY_BAND_RUNTIME  # noqa: E402
from costmodels.bands import memory_band_group  # noqa: E402
from costmodels.calibration import MEMORY_CALIBRATION_FILE, MEMORY_CALIBRATION_MODULE, module_text, write_text  # noqa: E402
from planner.published.calibration import Evaluator, fit_memory, memory_lofo, memory_results, memory_rows  # noqa: E402
from planner.published.scoring import RunResult, mapped_rows  # noqa: E402
from planner.published.stats import median, percentile  # noqa: E402

AXES: dict[str, tuple[float, ...]] = {
    "allocator_fragmentation": (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4),
}
MEMORY_BAND_QUANTILE = 95.0
"""Percentile of the held-out residuals the fit rule guards against (``_QUANTILE_WHY``)."""
OUT, MODULE = MEMORY_CALIBRATION_FILE, MEMORY_CALIBRATION_MODULE


def contradicted(cell: RunResult, results: list[RunResult]) -> bool:
    """An OOM cell another run of its sweep contradicts: same layout but the micro-batch, which is
    at least as large, and it ran."""
    L = cell.run.layout
    for r in results:
        M = r.run.layout
        if r.run.status == "ok" and r.run.sweep_key == cell.run.sweep_key and M.micro_batch_size >= L.micro_batch_size \
                and (M.dp, M.tp, M.pp, M.cp, M.ep, M.virtual_stages, M.zero_stage, M.recompute) == \
                (L.dp, L.tp, L.pp, L.cp, L.ep, L.virtual_stages, L.zero_stage, L.recompute):
            return True
    return False


def band_groups(residuals: list[dict], runtime_of: dict[str, str]) -> dict[str, list[float]]:
    """Held-out residuals by memory band group (``costmodels.bands.memory_band_group`` of the
    runtime its run ran, by row id); tags each residual with its group."""
    groups: dict[str, list[float]] = {}
    for d in residuals:
        d["band_group"] = memory_band_group(runtime_of[d["rows"][0]])
        groups.setdefault(d["band_group"], []).append(d["measured_over_predicted"])
    return groups


def fold_pool(rows: list[dict], family: str, group_of: dict[str, str]) -> list[dict]:
    """The rows a leave-one-family-out fold fits the allocator constant on: the other families of
    the held-out family's band group (``memory_band_group``), or, with none, the shared group's.
    The shipped constant is the shared group's too: a family of another group is held apart
    because its stack's peaks are not today's runtimes' (``_GROUPS_WHY``)."""
    own = [r for r in rows if r["source_family"] != family and group_of.get(r["source_family"]) == group_of[family]]
    return own or [r for r in rows if r["source_family"] != family and group_of.get(r["source_family"]) == "shared"]


def fits_at_band(r: RunResult, uppers: dict[str, float]) -> bool:
    """The fit rule: the predicted peak × (1 + its runtime's upper edge) under the device's memory
    (scoring caps at 100%)."""
    upper = uppers[memory_band_group(r.run.runtime)]
    return r.predicted_peak_memory_gib * (1 + upper) <= r.run.node.hardware.memory_bytes / 2**30


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {MODULE} and {OUT}")
    args = parser.parse_args(argv)
    rows = memory_rows(fit_rows(DATA))
    evaluator = Evaluator()
    runtime_of = {run.row_id: run.runtime for group in mapped_rows(rows).groups for run in group}
    group_of = {r["source_family"]: memory_band_group(runtime_of[r["id"]]) for r in rows if r["id"] in runtime_of}
    shared = [r for r in rows if group_of.get(r["source_family"]) == "shared"]
    best = fit_memory(shared, AXES, evaluator)
    residuals, chosen = memory_lofo(rows, AXES, evaluator, pool=lambda family: fold_pool(rows, family, group_of))
    pooled_residuals, pooled_chosen = memory_lofo(rows, AXES, evaluator)
    results = memory_results(mapped_rows(rows), evaluator, best)
    groups = band_groups(residuals, runtime_of)
    if OWN_MEMORY_BAND_RUNTIME not in groups:  # no family ran it: it takes the shared band
        groups[OWN_MEMORY_BAND_RUNTIME] = groups["shared"]
    uppers = {g: percentile(v, MEMORY_BAND_QUANTILE) for g, v in groups.items()}
    lowers = {g: percentile(v, 100 - MEMORY_BAND_QUANTILE) for g, v in groups.items()}
    print(f"fit on the shared group's families: {dict(best)}; leave-one-family-out choices: "
          + ", ".join(f"{f} <- {dict(p)['allocator_fragmentation']}" for f, p in chosen.items()))
    print("leave-one-family-out |predicted / measured - 1| (residual = measured / predicted - 1):")
    by_family: dict[str, float] = {}
    for family in sorted({d["family"] for d in residuals}):
        own = [abs(1 / (1 + d["measured_over_predicted"]) - 1) for d in residuals if d["family"] == family]
        by_family[family] = median(own)
        runtimes = sorted({runtime_of[d["rows"][0]] for d in residuals if d["family"] == family})
        print(f"  {family:27} {len(own):3} runs  median {median(own):.1%}  p90 {percentile(own, 90):.1%}"
              f"  (runtime {', '.join(runtimes)})")
    overall = median(list(by_family.values()))
    values = [d["measured_over_predicted"] for d in residuals]
    all_runs = median([abs(1 / (1 + v) - 1) for v in values])
    print(f"  median over families {overall:.1%}; over all {len(values)} runs {all_runs:.1%}")
    pooled = {f: median([abs(1 / (1 + d["measured_over_predicted"]) - 1) for d in pooled_residuals if d["family"] == f])
              for f in by_family}
    print("  each fold fitted on every other family instead (BLOOM in the shared group's folds): "
          + ", ".join(f"{f} {v:.1%}" for f, v in sorted(pooled.items()))
          + f"; median over families {median(list(pooled.values())):.1%}; choices "
          + ", ".join(f"{f} <- {dict(p)['allocator_fragmentation']}" for f, p in pooled_chosen.items()))
    for group in sorted(groups):
        runtimes = OWN_MEMORY_BAND_RUNTIME if group != "shared" else "every other runtime"
        print(f"memory band for {runtimes} ({group}: {len(groups[group])} held-out runs of "
              f"{', '.join(sorted({d['family'] for d in residuals if d.get('band_group') == group}))}): "
              f"measured / predicted in [{1 + lowers[group]:.3f}, {1 + uppers[group]:.3f}] at the "
              f"{100 - MEMORY_BAND_QUANTILE:g}th-{MEMORY_BAND_QUANTILE:g}th percentiles; fits only when "
              f"predicted x {1 + uppers[group]:.3f} <= cap")
    cells = [r for r in results if r.run.status == "oom"]
    print(f"\nout-of-memory cells ({len(cells)}), with {dict(best)} and their runtime's band:")
    for r in cells:
        L = r.run.layout
        upper = uppers[memory_band_group(r.run.runtime)]
        verdict = "predicted OOM" if not fits_at_band(r, uppers) else "PREDICTED TO FIT"
        note = " (contradicted by a run of the same layout)" if contradicted(r, results) else ""
        print(f"  {r.row_ids[0]:22} dp{L.dp} tp{L.tp} pp{L.pp} mb{L.micro_batch_size}: predicted "
              f"{r.predicted_peak_memory_gib:6.1f} GiB x {1 + upper:.3f} = {r.predicted_peak_memory_gib * (1 + upper):6.1f}"
              f" vs {r.run.node.hardware.memory_bytes / 2**30:.0f}: {verdict}{note}")
    fair = [r for r in cells if not contradicted(r, results)]
    refused = sum(not fits_at_band(r, uppers) for r in fair)
    print(f"  uncontradicted OOM cells predicted not to fit: {refused}/{len(fair)}")
    ok = [r for r in results if r.run.status == "ok"]
    print(f"  runs that ran, predicted to fit: {sum(fits_at_band(r, uppers) for r in ok)}/{len(ok)}")
    if args.write:
        constants = {**dict(best), "memory_band_upper": round(uppers["shared"], 4),
                     "deepspeed_memory_band_upper": round(uppers[OWN_MEMORY_BAND_RUNTIME], 4)}
        record = {
            "constants": constants,
            "provenance": {
                "command": ".venv/bin/python benchmarks/memory_fit.py --write",
                "date": datetime.date.today().isoformat(), "data": "benchmarks/data/published_runs.json and benchmarks/data/gpu/*.json (family gpu_truth)",
                "grid": {k: list(v) for k, v in AXES.items()},
                "fit_objective": "smallest mean over families of median |predicted / measured peak - 1|",
                "fit_rows": "the families of the shared band group (" + ", ".join(
                    sorted({r["source_family"] for r in shared})) + "); each leave-one-family-out fold "
                    "fits on the other families of its family's group, or on the shared group's if none",
                "lofo_median_abs_error_by_family": {k: round(v, 4) for k, v in by_family.items()},
                "lofo_median_over_families_abs_error": round(overall, 4),
                "lofo_folds_fitted_on_every_other_family": {k: round(v, 4) for k, v in sorted(pooled.items())},
                "band_quantile_pct": MEMORY_BAND_QUANTILE,
                "band_quantile_why": " ".join(_QUANTILE_WHY.split()),
                "band_groups_why": " ".join(_GROUPS_WHY.split()),
                "band_measured_over_predicted": {g: [round(1 + lowers[g], 4), round(1 + uppers[g], 4)] for g in groups},
                "fit_rule": "a layout fits when predicted peak x (1 + the memory band upper edge of its runtime: "
                            "deepspeed_memory_band_upper for deepspeed, memory_band_upper otherwise) <= memory cap",
            },
            "lofo_residuals": sorted(residuals, key=lambda d: (d["family"], d["rows"][0])),
        }
        write_text(OUT, json.dumps(record, indent=2, sort_keys=True) + "\n")
        write_text(MODULE, module_text(MODULE_DOCSTRING, constants))
        print(f"\nwrote {MODULE} and {OUT}")
    return 0


_GROUPS_WHY = """The deepspeed runtime's band is made from the residuals of the families that ran it (the BLOOM
sweep: Megatron-DeepSpeed and PyTorch of early 2022, read with nvidia-smi), every other runtime's from
the other families' (costmodels.assumptions.OWN_MEMORY_BAND_RUNTIME)."""


_QUANTILE_WHY = """An OOM costs a whole attempt (crash in the first steps, relaunch, reload, re-queue); passing
over a layout that would have fitted costs the few per cent of throughput to the next layout that
surely fits. With an OOM taken as 20 such misses, a layout is worth accepting while its chance of
running out is under 1/21, about 5%: the 95th percentile of the held-out residuals."""


MODULE_DOCSTRING = ("Shipped memory calibration: the allocator constant fitted on the published runs' measured\n"
                    "peaks and the memory band's upper edge from their leave-one-family-out residuals.\n\n"
                    "Generated by ``.venv/bin/python benchmarks/memory_fit.py --write``; do not edit by hand.\n"
                    "Provenance is in ``data/memory_calibration.json``.\n")
"""Docstring of the generated ``costmodels/memory_calibration_data.py``."""


if __name__ == "__main__":
    raise SystemExit(main())
