"""Record the residuals the error bands are taken from (``costmodels/bands.py``).

Run: ``.venv/bin/python benchmarks/bands.py [--write]`` (about a minute). Throughput: the
leave-one-family-out loop of ``benchmarks/calibrate.py`` (each family scored with the grid point
fitted on the others), one signed error per scored configuration. Memory: every configuration whose
source measured peak memory, scored with the shipped model (memory does not depend on the fitted
constants). Prints the bands; ``--write`` stores the residuals in ``costmodels/data/bands.json``.
When the calibration record carries ``provenance.lofo_residuals`` (``calibrate.py --write``), the
step band is read from there instead and this file's throughput list is the fallback.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from calibrate import AXES  # noqa: E402
from gpu_records import fit_rows  # noqa: E402
from published import DATA  # noqa: E402

from costmodels.bands import BANDS_FILE, band_from_residuals, memory_residuals, step_residuals  # noqa: E402
from planner.published import cross_validate_by_family, score  # noqa: E402
from planner.published.calibration import Evaluator, grid_points, make_fit  # noqa: E402
from planner.published.scoring import FamilyScore  # noqa: E402
from profiles.io import write_text_atomic  # noqa: E402


def residual_records(scores: list[FamilyScore], attribute: str) -> list[dict]:
    """One ``{family, rows, signed_error}`` per scored configuration that has ``attribute``
    (``signed_error`` for throughput, ``memory_error`` for peak memory), sorted for stable bytes."""
    out = []
    for s in scores:
        for r in s.results:
            value = getattr(r, attribute)
            if value is not None:
                out.append({"family": s.family, "rows": list(r.row_ids), "signed_error": round(value, 6)})
    return sorted(out, key=lambda d: (d["family"], d["rows"]))


def lofo_scores(rows: list[dict]) -> list[FamilyScore]:
    """``calibrate.py``'s leave-one-family-out loop: each family scored with the grid point
    fitted on the others, over the same grid (``calibrate.AXES``)."""
    evaluator = Evaluator()
    return cross_validate_by_family(rows, make_fit(grid_points(AXES), evaluator, {}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write the residuals to {BANDS_FILE}")
    rows, args = fit_rows(DATA), parser.parse_args(argv)
    lofo = residual_records(lofo_scores(rows), "signed_error")
    memory = residual_records(score(rows), "memory_error")
    step = band_from_residuals(step_residuals([d["signed_error"] for d in lofo]), what="held-out runs (LOFO)",
                               record="-", num_families=len({d["family"] for d in lofo}))
    mem = band_from_residuals(memory_residuals([d["signed_error"] for d in memory]), what="runs that measured memory",
                              record="-", num_families=len({d["family"] for d in memory}))
    for name, band in (("step time", step), ("peak memory", mem)):
        print(f"{name}: ± {band.half_width_rel:.0%} ({band.basis}); edges {band.low_rel:+.0%} / {band.high_rel:+.0%}")
    if args.write:
        doc = {
            "schema_version": 1,
            "throughput": {"residuals": lofo, "kind": "predicted / measured tokens/s per GPU - 1, leave-one-family-out"},
            "memory": {"residuals": memory, "kind": "predicted / measured peak memory - 1"},
            "provenance": {"command": ".venv/bin/python benchmarks/bands.py --write",
                           "date": datetime.date.today().isoformat(), "data": "benchmarks/data/published_runs.json and benchmarks/data/gpu/*.json (family gpu_truth)",
                           "grid": {k: list(v) for k, v in AXES.items()}},
        }
        write_text_atomic(BANDS_FILE, json.dumps(doc, indent=1, sort_keys=True) + "\n")
        print(f"wrote {BANDS_FILE.relative_to(Path(__file__).parents[1])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
