"""Fit the default calibration on the published runs and report it by leave-one-family-out CV.

Run: ``.venv/bin/python benchmarks/calibrate.py [--write]``. Tries every point of ``AXES`` (a
handful of physically meaningful ``Assumptions`` fields, one value for every family), prints the
in-sample table of the best point and the leave-one-family-out table (each family scored with the
point fitted on the others). ``--write`` stores the all-family fit with its provenance and CV
figures in ``costmodels/data/calibration.json``, the cost model's default calibration.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from published import DATA, print_table  # noqa: E402

from planner.published import cross_validate_by_family, load_rows  # noqa: E402
from planner.published.calibration import Evaluator, fit_constants, grid_points, make_fit  # noqa: E402
from planner.published.scoring import overall_median  # noqa: E402

AXES: dict[str, tuple[float, ...]] = {
    "gemm_efficiency": (0.6, 0.65, 0.7, 0.75, 0.8),
    "fp8_gemm_efficiency": (0.5, 0.6, 0.75),  # >= 0.5: fp8 GEMMs at least 1.33x bf16 ones (torchtitan measures 1.28x end to end)
    "overlap_slowdown": (0.0, 0.1, 0.2),
}
OUT = Path(__file__).parents[1] / "costmodels" / "data" / "calibration.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write the fitted set to {OUT}")
    args = parser.parse_args(argv)
    rows = load_rows(DATA)
    points, evaluator = grid_points(AXES), Evaluator()
    best, figure = fit_constants(rows, points, evaluator)
    print(f"all families: {dict(best)}, median over families of median |error| {figure:.1%}\n")
    chosen: dict = {}
    cv = cross_validate_by_family(rows, make_fit(points, evaluator, chosen))
    print("leave-one-family-out (each family scored with the constants fitted on the others):")
    print_table(cv)
    cv_figure = overall_median(cv)
    worst = max((s.abs_median for s in cv if s.abs_median is not None), default=None)
    if args.write:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "constants": dict(best),
            "provenance": {
                "command": ".venv/bin/python benchmarks/calibrate.py --write",
                "date": datetime.date.today().isoformat(),
                "data": "benchmarks/data/published_runs.json",
                "grid": {k: list(v) for k, v in AXES.items()},
                "in_sample_median_abs_error": round(figure, 4),
                "lofo_median_abs_error": None if cv_figure is None else round(cv_figure, 4),
                "lofo_worst_family_median_abs_error": None if worst is None else round(worst, 4),
                "lofo_by_family": {s.family: None if s.abs_median is None else round(s.abs_median, 4) for s in cv},
            },
        }
        tmp = OUT.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        tmp.replace(OUT)
        print(f"\nwrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
