"""Pick the fastest predicted cell among those predicted to fit, per development sweep that recorded
out-of-memory cells, and say whether it crashed and what the pick cost against the best cell that ran.

Run: ``.venv/bin/python benchmarks/sweep_pick.py``. A sweep is one ``MappedRun.sweep_key`` (one
model and shape, GPU, GPU count, sequence and precision; the layout varies). "Predicted to fit" is
the shipped fit rule (``CostBreakdown.fits``: the predicted peak under the memory cap over 1 + the
memory band's upper edge, ``costmodels/data/memory_calibration.json``), at 100% of device memory as
the published runs are scored. Regret = 1 - measured tokens/s of the pick / the best measured in
the sweep (a crashed pick: 100%).
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from published import DATA  # noqa: E402

from planner.published import load_rows, score  # noqa: E402
from planner.published.scoring import RunResult  # noqa: E402


def sweeps_with_oom(results: list[RunResult]) -> dict[tuple, list[RunResult]]:
    by_key: dict[tuple, list[RunResult]] = defaultdict(list)
    for r in results:
        by_key[r.run.sweep_key].append(r)
    return {k: v for k, v in by_key.items() if any(r.run.status == "oom" for r in v)}


def pick(cells: list[RunResult]) -> RunResult | None:
    """The fastest predicted cell among those predicted to fit (ties: the first row id)."""
    fitting = [r for r in cells if r.predicted_fits]
    return min(fitting, key=lambda r: (-r.predicted_tokens_per_s_per_gpu, r.row_ids[0])) if fitting else None


def regret(chosen: RunResult | None, cells: list[RunResult]) -> float | None:
    """1 - measured rate of the pick / the best measured rate (1.0 for a crash; None with no pick)."""
    best = max((r.measured_tokens_per_s_per_gpu for r in cells if r.measured_tokens_per_s_per_gpu), default=None)
    if chosen is None or best is None:
        return None
    if chosen.run.status == "oom" or not chosen.measured_tokens_per_s_per_gpu:
        return 1.0
    return 1 - chosen.measured_tokens_per_s_per_gpu / best


def main(argv: list[str] | None = None) -> int:
    rows = load_rows(DATA)
    results = [r for s in score(rows) for r in s.results]
    sweeps = sweeps_with_oom(results)
    crashes = 0
    print(f"{'sweep':58} {'cells':>5} {'oom':>3} {'fit':>3}  {'pick':18} {'status':6} {'regret':>6}")
    for key, cells in sorted(sweeps.items(), key=lambda kv: str(kv[0])):
        chosen = pick(cells)
        loss = regret(chosen, cells)
        crashes += chosen is not None and chosen.run.status == "oom"
        label = f"{key[0]} L{key[2]} h{key[3]} heads{key[4]} {key[7]} x{key[8]}"
        print(f"{label:58} {len(cells):5} {sum(r.run.status == 'oom' for r in cells):3} "
              f"{sum(r.predicted_fits for r in cells):3}  {chosen.row_ids[0] if chosen else '-':18} "
              f"{chosen.run.status if chosen else '-':6} {'-' if loss is None else f'{loss:.1%}':>6}")
    print(f"\n{len(sweeps)} sweeps with OOM cells; picks that crashed: {crashes}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
