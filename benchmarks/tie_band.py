"""Measure the cost model's between-layout error, overall and per mechanism: the tie band.

Run: ``.venv/bin/python benchmarks/tie_band.py [--write] [--json]`` (a few seconds). Every
published run is scored with the shipped model (``planner.published.score``); every pair of
measured layouts inside one sweep gives the error of the predicted step-time ratio against the
measured one (``planner.published.pairs``). Prints the median and 80th percentile per mechanism
(pairs that differ in that mechanism alone) and over all pairs; ``--write`` stores the record
``costmodels/data/tie_band.json`` that ``costmodels.tie_band`` reads: band = median over all pairs.
The shipped calibration was fitted on these rows (a few global constants); the ratio of two layouts
of one job cancels most of what they move.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from gpu_records import fit_rows  # noqa: E402
from published import DATA  # noqa: E402

from costmodels.bands import percentile  # noqa: E402
from costmodels.tie_band import TIE_BAND_FILE  # noqa: E402
from planner.published import score  # noqa: E402
from planner.published.pairs import MECHANISMS, by_mechanism, layout_pairs, relative_error  # noqa: E402
from profiles.io import write_text_atomic  # noqa: E402

MIN_PAIRS = 5
"""A mechanism with fewer single-mechanism pairs than this counts as unmeasured."""


def summary(log_errors: list[float]) -> dict:
    """Pair count, median and 80th percentile of the relative ratio error (None without pairs)."""
    if not log_errors:
        return {"num_pairs": 0, "median_rel": None, "p80_rel": None}
    return {"num_pairs": len(log_errors), "median_rel": round(relative_error(log_errors), 4),
            "p80_rel": round(math.exp(percentile(log_errors, 80)) - 1, 4)}


def record(rows: list[dict]) -> dict:
    """The tie-band record of the published rows."""
    results = [r for s in score(rows) for r in s.results]
    pairs = layout_pairs(results)
    logs = [p.log_error for p in pairs]
    mechanisms = {}
    for name, values in by_mechanism(pairs).items():
        entry = summary(values)
        if entry["num_pairs"] < MIN_PAIRS:
            entry["median_rel"] = None  # unmeasured: too few pairs to say
        mechanisms[name] = entry
    return {"schema_version": 1, "band_rel": round(relative_error(logs), 4), **summary(logs),
            "num_sweeps": len({p.sweep for p in pairs}), "num_families": len({p.family for p in pairs}),
            "min_pairs": MIN_PAIRS, "mechanisms": mechanisms,
            "statistic": "median over pairs of |ln(predicted ratio / measured ratio)| of tokens/s per GPU, "
                         "as exp(.) - 1; per mechanism over pairs that differ in it alone"}


def print_record(doc: dict) -> None:
    print(f"{'mechanism':17} {'pairs':>5} {'median':>7} {'p80':>7}")
    for name in MECHANISMS:
        m = doc["mechanisms"][name]
        med = "-" if m["median_rel"] is None else f"{m['median_rel']:.1%}"
        p80 = "-" if m["p80_rel"] is None else f"{m['p80_rel']:.1%}"
        print(f"{name:17} {m['num_pairs']:5} {med:>7} {p80:>7}")
    print(f"{'all pairs':17} {doc['num_pairs']:5} {doc['median_rel']:7.1%} {doc['p80_rel']:7.1%}   "
          f"({doc['num_sweeps']} sweeps, {doc['num_families']} families)")
    print(f"tie band: {doc['band_rel']:.1%} (median over all pairs); '-': fewer than {doc['min_pairs']} pairs")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write the record to {TIE_BAND_FILE}")
    parser.add_argument("--json", action="store_true", help="print the record as JSON")
    args = parser.parse_args(argv)
    doc = record(fit_rows(DATA))
    if args.json:
        print(json.dumps(doc, indent=1, sort_keys=True))
    else:
        print_record(doc)
    if args.write:
        doc["provenance"] = {"command": ".venv/bin/python benchmarks/tie_band.py --write",
                             "date": datetime.date.today().isoformat(),
                             "data": "benchmarks/data/published_runs.json (shared/published_runs/runs.json) and benchmarks/data/gpu/*.json (family gpu_truth)",
                             "model": "shipped cost model and calibration (costmodels/data/calibration.json)"}
        write_text_atomic(TIE_BAND_FILE, json.dumps(doc, indent=1, sort_keys=True) + "\n")
        print(f"wrote {TIE_BAND_FILE.relative_to(Path(__file__).parents[1])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
