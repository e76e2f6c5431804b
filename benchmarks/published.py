"""Predicted vs measured on the published runs: every run's own layout, scored per family.

Run: ``.venv/bin/python benchmarks/published.py [--family F ...] [--json] [--worst N] [--cv] [--moe]``.
Data: ``benchmarks/data/published_runs.json`` (a copy of the development set, ``shared/published_runs``).
Signed error = predicted / measured tokens/s per GPU - 1 (positive: the model is too fast).
``--cv`` runs the leave-one-family-out driver with a fit that fits nothing (a smoke test of the
driver; its figures equal the plain ones).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from planner.published import cross_validate_by_family, default_evaluate, load_rows, score
from planner.published.scoring import FamilyScore, assumption_counts, map_rows, overall_median

DATA = Path(__file__).parent / "data" / "published_runs.json"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.0%}"


def _abs(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def print_table(scores: list[FamilyScore]) -> None:
    header = (f"{'family':27} {'rows':>4} {'eval':>4} {'n/a':>4}  {'sgn med':>7} {'sgn p90':>7} {'abs med':>7} "
              f"{'abs p90':>7}  {'OOM right':>9} {'OOM cells':>9}  {'mem err':>7}  {'tau (sweeps)':>12}")
    print(header)
    print("-" * len(header))
    for s in scores:
        skipped = sum(s.not_expressible.values())
        oom = f"{s.oom_right[0]}/{s.oom_right[1]}" if s.oom_right[1] else "-"
        cells = f"{s.oom_cells_predicted[0]}/{s.oom_cells_predicted[1]}" if s.oom_cells_predicted[1] else "-"
        mem = f"{_pct(s.memory_signed_median)} ({s.num_memory})" if s.num_memory else "-"
        tau = f"{s.kendall_tau:+.2f} ({s.num_sweeps})" if s.kendall_tau is not None else "-"
        print(f"{s.family:27} {s.num_rows:4} {s.num_evaluated:4} {skipped:4}  {_pct(s.signed_median):>7} "
              f"{_pct(s.signed_p90):>7} {_abs(s.abs_median):>7} {_abs(s.abs_p90):>7}  {oom:>9} {cells:>9}  "
              f"{mem:>7}  {tau:>12}")
    print(f"\nmedian over families of median |error|: {_abs(overall_median(scores))} "
          f"({sum(1 for s in scores if s.abs_median is not None)} families scored)")
    print("\nnot yet expressible (rows, by reason):")
    for s in scores:
        if s.not_expressible:
            reasons = ", ".join(f"{k} {v}" for k, v in sorted(s.not_expressible.items(), key=lambda kv: -kv[1]))
            print(f"  {s.family}: {reasons}")


def mfu_of(r) -> tuple[float, float | None, float]:
    """(predicted MFU, measured MFU, predicted compute-only MFU) of one scored configuration: the
    measured MFU is the predicted one scaled by measured / predicted tokens/s; compute-only MFU is
    the model FLOPs over the compute (and recompute) time alone, what the kernels are taken to sustain."""
    busy = r.time_fractions.get("compute", 0.0) + r.time_fractions.get("recompute", 0.0)
    measured = None if r.signed_error is None else r.predicted_mfu / (1 + r.signed_error)
    return r.predicted_mfu, measured, r.predicted_mfu / busy if busy > 0 else 0.0


def print_mfu(scores: list[FamilyScore]) -> None:
    """Per family: median predicted, measured and compute-only MFU; and every bf16 dense H100 row."""
    print("\nMFU by family (medians; compute-only = model FLOPs over compute + recompute time alone):")
    print(f"  {'family':27} {'pred':>6} {'meas':>6} {'compute-only':>12}")
    for s in scores:
        rows = [mfu_of(r) for r in s.results if r.signed_error is not None]
        if rows:
            med = lambda i: sorted(x[i] for x in rows)[len(rows) // 2]  # noqa: E731
            print(f"  {s.family:27} {med(0):6.1%} {med(1):6.1%} {med(2):12.1%}")
    print("\nbf16 dense H100 rows (predicted / measured / compute-only MFU; pp, nodes):")
    for s in scores:
        for r in s.results:
            run = r.run
            if r.signed_error is None or run.precision != "bf16" or run.hardware_name != "h100-sxm-80gb" \
                    or run.model.moe is not None:
                continue
            pred, meas, comp = mfu_of(r)
            nodes = -(-run.num_gpus // run.gpus_per_node)
            print(f"  {r.row_ids[0][:58]:58} {pred:6.1%} {meas:6.1%} {comp:6.1%}  pp{run.layout.pp} {nodes} nodes")


def moe_results(scores: list[FamilyScore]) -> list:
    """The scored configurations of mixture-of-experts models (merged repeats count once)."""
    return [r for s in scores for r in s.results if r.run.model.moe is not None and r.signed_error is not None]


def print_moe(scores: list[FamilyScore]) -> None:
    """The MoE development rows: each configuration's layout as run (rack placement, token dispatcher
    and EP overlap: ``planner.published.moe_recipes``), measured and predicted tokens/s per GPU and
    the exposed EP all-to-all's share of the predicted step."""
    results = sorted(moe_results(scores), key=lambda r: (r.run.hardware_name, r.row_ids[0]))
    print(f"\nMoE rows ({len(results)} configurations; signed error = predicted / measured - 1):")
    print(f"  {'row':62} {'layout':48} {'meas':>7} {'pred':>7} {'error':>6} {'EP':>5}")
    for r in results:
        L = r.run.layout
        comm = [f"{L.gpus_per_nvlink_domain}/rack"] if L.gpus_per_nvlink_domain else []
        comm += [L.moe_dispatcher] if L.moe_dispatcher != "alltoall" else []
        comm += ["EP overlap"] if L.ep_comm_overlap else []
        layout = f"tp{L.tp} pp{L.pp} v{L.virtual_stages} ep{L.ep} " + " ".join(comm)
        ep_share = r.time_fractions.get("ep_comm", 0.0)
        print(f"  {r.row_ids[0][:62]:62} {layout:48} {r.measured_tokens_per_s_per_gpu:7,.0f} "
              f"{r.predicted_tokens_per_s_per_gpu:7,.0f} {r.signed_error:+6.0%} {ep_share:5.0%}")
    errors = sorted(abs(r.signed_error) for r in results)
    if errors:
        print(f"  median |error| over the MoE rows: {errors[len(errors) // 2]:.0%}")


def print_assumptions(rows: list[dict]) -> None:
    mapped, _ = map_rows(rows)
    print(f"\nassumed where the row is silent (rows of {len(mapped)} mapped that depend on it, families):")
    for key, (count, families) in assumption_counts(rows).items():
        print(f"  {key:40} {count:4} rows  {families:2} families")


def print_worst(scores: list[FamilyScore], count: int) -> None:
    results = [r for s in scores for r in s.results if r.signed_error is not None]
    results.sort(key=lambda r: -abs(r.signed_error))
    print(f"\n{count} largest |error| (terms as share of predicted step):")
    for r in results[:count]:
        terms = ", ".join(f"{k} {v:.0%}" for k, v in r.time_fractions.items() if v >= 0.005)
        L = r.run.layout
        print(f"  {r.row_ids[0]}: measured {r.measured_tokens_per_s_per_gpu:,.0f} predicted "
              f"{r.predicted_tokens_per_s_per_gpu:,.0f} tok/s/GPU ({r.signed_error:+.0%}), MFU {r.predicted_mfu:.0%}; "
              f"dp{L.dp} tp{L.tp} pp{L.pp} cp{L.cp} v{L.virtual_stages} mb{L.micro_batch_size}x{L.num_microbatches} "
              f"{L.recompute}; {terms}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", action="append", help="score only this family (repeatable)")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    parser.add_argument("--worst", type=int, default=0, help="also list the N runs with the largest error")
    parser.add_argument("--mfu", action="store_true", help="also print predicted, measured and compute-only MFU")
    parser.add_argument("--moe", action="store_true", help="also print every MoE row: layout as run, measured, "
                        "predicted, EP share")
    parser.add_argument("--cv", action="store_true", help="leave-one-family-out with the no-constants fit")
    parser.add_argument("--data", type=Path, default=DATA, help="published-runs JSON file")
    args = parser.parse_args(argv)
    try:
        rows = load_rows(args.data)
    except (OSError, ValueError) as err:
        print(f"error: --data {args.data}: {err}", file=sys.stderr)
        return 2
    known = sorted({r["source_family"] for r in rows})
    for family in args.family or []:
        if family not in known:
            print(f"error: --family {family!r} is not in {args.data.name}; known: {', '.join(known)}",
                  file=sys.stderr)
            return 2
    if args.family:
        rows = [r for r in rows if r["source_family"] in args.family]
    scores = cross_validate_by_family(rows, lambda _train: default_evaluate) if args.cv else score(rows)
    if args.json:
        print(json.dumps({"families": [s.to_dict() for s in scores],
                          "median_over_families_abs_error": overall_median(scores)}, indent=1, sort_keys=True))
        return 0
    print_table(scores)
    print_assumptions(rows)
    if args.mfu:
        print_mfu(scores)
    if args.moe:
        print_moe(scores)
    if args.worst:
        print_worst(scores, args.worst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
