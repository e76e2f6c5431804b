"""Calibration from a cluster's own logs (``autoplan calibrate``): its speed, and what it would have
done for each development sweep taken as one team's logs.

Run: ``.venv/bin/python benchmarks/calibrate_logs.py [--speed-only | --sweeps-only]`` (about a minute).

Speed, on one core: 100 and 1,000 logged runs (Llama 3 8B and 70B layouts on H100, their steps
the model's own under known factors, with 2% noise) costed once as their terms, then the factors
fitted and judged leave-one-out on the terms; prints each part's seconds and the factors recovered.

Sweeps: every family of the development set on one GPU type with at least 8 measured runs
(``planner.calibrate.sweeps``): leave-one-out median |step error| before (the shipped model) and
after calibration, the factors with their spread (x/ exp(sd)), and over its sweeps how often the
least predicted step (leave-one-out) is the measured fastest layout, before and after.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one core, as the speed figure promises
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import itertools  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from costmodels.assumptions import DEFAULT_ASSUMPTIONS  # noqa: E402
from costmodels.calibration_factors import assumptions_at  # noqa: E402
from planner.api import layout_for_batch, resolve_job  # noqa: E402
from planner.calibrate.fit import fit_steps  # noqa: E402
from planner.calibrate.runs import LoggedRun  # noqa: E402
from planner.calibrate.sweeps import group_runs, score_group  # noqa: E402
from planner.calibrate.terms import run_terms  # noqa: E402
from planner.published import load_rows  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from gpu_records import fit_rows  # noqa: E402

DATA = Path(__file__).parent / "data" / "published_runs.json"
TRUTH = {"gemm": 1.15, "intra_node": 1.3, "inter_node": 1.6, "overlap": 0.7}
JOBS = (dict(model="llama3-8b", hardware="h100-sxm-80gb", gpus=64, global_batch=256, seq_len=4096),
        dict(model="llama3-70b", hardware="h100-sxm-80gb", gpus=64, global_batch=128, seq_len=4096))


def synthetic_runs(count: int, seed: int = 0) -> list[LoggedRun]:
    """``count`` logged runs cycling through the layouts of ``JOBS`` that fit, steps under ``TRUTH``."""
    rng, pool = random.Random(seed), []
    for request in JOBS:
        model = resolve_job(**request).cost_model(assumptions_at(DEFAULT_ASSUMPTIONS, TRUTH))
        for tp, pp, mb, zero, recompute in itertools.product((1, 2, 4, 8), (1, 2, 4), (1, 2), (0, 1), ("none", "full")):
            try:
                layout = layout_for_batch(request["global_batch"], dp=request["gpus"] // (tp * pp), tp=tp, pp=pp,
                                          micro_batch_size=mb, zero_stage=zero, recompute=recompute)
                cost = model.estimate(layout)
            except ValueError:
                continue
            if cost.fits:
                pool.append((request, layout, cost.step_time_s))
    return [LoggedRun(request=req, layout=lay, step_time_s=t * math.exp(rng.gauss(0, 0.02)), origin=f"synthetic {i}")
            for i, (req, lay, t) in zip(range(count), itertools.cycle(pool))]


def speed(count: int) -> None:
    runs = synthetic_runs(count)
    started = time.perf_counter()
    terms = run_terms(runs)
    costed = time.perf_counter()
    fit = fit_steps(terms)
    done = time.perf_counter()
    recovered = ", ".join(f"{f.name} {f.multiplier:.2f}" for f in fit.factors if f.informed)
    print(f"{count:5} runs: terms {costed - started:6.2f} s, fit + leave-one-out {done - costed:6.2f} s, "
          f"total {done - started:6.2f} s; leave-one-out median |error| "
          f"{statistics.median(abs(e) for e in fit.errors_leave_one_out):.1%}; {recovered}")


def sweeps() -> None:
    rows = fit_rows(DATA) if DATA.exists() else load_rows(DATA)
    print(f"{'family':27} {'gpu':22} {'runs':>4}  {'LOO before':>10} {'after':>7}  {'best picked':>14}  factors (x, x/spread)")
    scores = []
    for (family, hardware), runs in group_runs(rows).items():
        s = score_group(family, hardware, runs)
        scores.append(s)
        factors = ", ".join(f"{name} {f['multiplier']:.2f}{'!' if f['on_bound'] else ''} x/{math.exp(f['log_sd']):.2f}"
                            for name, f in s.factors.items() if f["informed"])
        picks = f"{s.best_picked_before}->{s.best_picked_after}/{s.sweeps}" if s.sweeps else "-"
        print(f"{family:27} {hardware:22} {s.runs:4}  {s.loo_before:10.1%} {s.loo_after:7.1%}  {picks:>14}  {factors}")
    print(f"\nmedian over {len(scores)} groups: leave-one-out |error| {statistics.median(s.loo_before for s in scores):.1%}"
          f" before, {statistics.median(s.loo_after for s in scores):.1%} after; over the groups of 16 or more runs "
          f"{statistics.median([s.loo_after for s in scores if s.runs >= 16] or [math.nan]):.1%} after")
    print("('!' marks a factor on its bound; best picked = sweeps whose least predicted step is the measured fastest "
          "layout, before -> after, of the sweeps with two or more layouts)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--speed-only", action="store_true")
    parser.add_argument("--sweeps-only", action="store_true")
    args = parser.parse_args(argv)
    if not args.sweeps_only:
        for count in (100, 1000):
            speed(count)
    if not args.speed_only:
        print()
        sweeps()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
