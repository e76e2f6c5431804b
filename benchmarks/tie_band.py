"""Measure the cost model's between-layout error, overall and per mechanism: the tie band.

Run: ``.venv/bin/python benchmarks/tie_band.py [--write] [--json]`` (a few seconds). Every
published run is scored with the shipped model (``planner.published.score``); every pair of
measured layouts inside one sweep gives the error of the predicted step-time ratio against the
measured one (``planner.published.pairs``). Prints the median and 80th percentile per mechanism
(pairs that differ in that mechanism alone or both run it at one setting,
``pairs.by_mechanism_in_use``), over every runtime's pairs and over each runtime's own, and over all
pairs; ``--write`` stores the record ``costmodels/data/tie_band.json`` that ``costmodels.tie_band``
reads: band = median over all pairs; a runtime's mechanism figures where it has ``MIN_PAIRS`` pairs.
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
from planner.published.pairs import MECHANISMS, by_mechanism_in_use, layout_pairs, relative_error  # noqa: E402
from profiles.io import write_text_atomic  # noqa: E402

MIN_PAIRS = 5
"""A mechanism with fewer pairs than this (differing in it alone, or both running it) counts as
unmeasured: on a runtime, its figure is then the one over every runtime's pairs."""


def summary(log_errors: list[float]) -> dict:
    """Pair count, median and 80th percentile of the relative ratio error (None without pairs)."""
    if not log_errors:
        return {"num_pairs": 0, "median_rel": None, "p80_rel": None}
    return {"num_pairs": len(log_errors), "median_rel": round(relative_error(log_errors), 4),
            "p80_rel": round(math.exp(percentile(log_errors, 80)) - 1, 4)}


def mechanism_table(counted: dict[str, tuple[int, int, list[float]]]) -> dict[str, dict]:
    """Per mechanism: pair counts and the error summary, median None under ``MIN_PAIRS`` pairs."""
    out = {}
    for name, (alone, held, values) in counted.items():
        entry = {**summary(values), "num_alone": alone, "num_held": held}
        if entry["num_pairs"] < MIN_PAIRS:
            entry["median_rel"] = None  # unmeasured: too few pairs to say
        out[name] = entry
    return out


def record(rows: list[dict]) -> dict:
    """The tie-band record of the published rows."""
    results = [r for s in score(rows) for r in s.results]
    pairs = layout_pairs(results)
    logs = [p.log_error for p in pairs]
    runtimes = {runtime: {"num_pairs": sum(p.runtime == runtime for p in pairs),
                          "mechanisms": mechanism_table(by_mechanism_in_use(pairs, runtime))}
                for runtime in sorted({p.runtime for p in pairs})}
    return {"schema_version": 2, "band_rel": round(relative_error(logs), 4), **summary(logs),
            "num_sweeps": len({p.sweep for p in pairs}), "num_families": len({p.family for p in pairs}),
            "min_pairs": MIN_PAIRS, "mechanisms": mechanism_table(by_mechanism_in_use(pairs)), "runtimes": runtimes,
            "statistic": "median over pairs of |ln(predicted ratio / measured ratio)| of tokens/s per GPU, "
                         "as exp(.) - 1; per mechanism over pairs that differ in it alone or both run it at one "
                         "setting (in use as costmodels.tie_band.in_use counts it on the pair's runtime), over "
                         "every runtime's pairs and over each runtime's own"}


def print_record(doc: dict) -> None:
    scopes = [("all", doc["mechanisms"])] + [(r, e["mechanisms"]) for r, e in doc["runtimes"].items()]
    print(f"{'mechanism':17} " + " ".join(f"{name[:15]:>15}" for name, _ in scopes))
    print(f"{'(pairs)':17} " + " ".join(f"{doc['runtimes'][n]['num_pairs'] if n != 'all' else doc['num_pairs']:>15}"
                                         for n, _ in scopes))
    for name in MECHANISMS:
        cells = []
        for _, table in scopes:
            m = table[name]
            cells.append(f"{'-' if m['median_rel'] is None else format(m['median_rel'], '.1%')} ({m['num_pairs']})")
        print(f"{name:17} " + " ".join(f"{c:>15}" for c in cells))
    print(f"{'all pairs':17} {doc['median_rel']:15.1%}   (p80 {doc['p80_rel']:.1%}; {doc['num_sweeps']} sweeps, "
          f"{doc['num_families']} families)")
    print(f"tie band: {doc['band_rel']:.1%} (median over all pairs); a mechanism is uncertain on a runtime where "
          f"its figure (its own, else all) is above the band or '-' (fewer than {doc['min_pairs']} pairs)")


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
