"""How far to trust the cost model: predicted vs measured on this machine. Prints every figure.

    .venv/bin/python benchmarks/fidelity.py [--workdir DIR] [--skip-runs] [--skip-dry-run]

1. Every launchable layout of tiny-llama (fp32, global batch 4, seq 64) at world size 2 and 4
   (dp/tp/pp x ZeRO 0-3 x micro-batch x recompute none/full; 1F1B; SP whenever tp > 1),
   measured in one torchrun launch per world size: model-state memory per rank (exact tensor
   bytes) and saved activations against the cost model; Kendall tau between predicted and
   measured step time and the regret of the planner's pick (measured time of the layout with
   the best prediction over the best measured time), before and after calibration, both fitted
   on all runs of that world size (in-sample) and 2-fold cross-validated (fit on half, score the other),
   once from the cpu preset's datasheet rates and once from the shipped measured profile.
2. Dry runs (fake tensors) of llama3-8b and llama3-70b plans at seq 8192 on H100 80GB: FSDP
   (ZeRO-3), TP+SP, PP 1F1B, each without and with full recomputation; per-GPU memory per
   component against the cost model.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from costmodels.layout import Layout, layout_problems  # noqa: E402
from costmodels.presets import load_model  # noqa: E402
from costmodels.training import TrainingSpec  # noqa: E402
from planner.api import resolve_job  # noqa: E402
from planner.search.launchable import launch_problems  # noqa: E402
from planner.plan.report import PlanReport  # noqa: E402
from planner.plan.plan_file import PlanFile  # noqa: E402
from planner.search.space import LAUNCHABLE, SearchOptions, all_layouts  # noqa: E402
from planner.validate import runner  # noqa: E402
from planner.validate.calibrate import Run, fit, predict_all  # noqa: E402
from planner.validate.compare import worst_error  # noqa: E402
from profiles import load_profile  # noqa: E402

MIB = 2**20
SHIPPED_PROFILE = Path(__file__).resolve().parents[1] / "profiles" / "data" / "cpu-gloo-2proc.json"
"""The real profile of this machine class (autoplan profile --device cpu --nproc 2)."""


def plan_file(model: str, hardware: str, gpus: int, batch: int, seq: int, precision: str, layout: Layout) -> PlanFile:
    """A plan file with ``layout`` as best (what ``autoplan evaluate --out`` writes)."""
    job = resolve_job(model=model, hardware=hardware, gpus=gpus, gpus_per_node=gpus, global_batch=batch,
                      seq_len=seq, precision=precision, runtime="torch")
    report = PlanReport(inputs=job.inputs, best=job.cost_model().estimate(layout), candidates=(),
                        search={"solver": "evaluate", "space_size": 1, "evaluated": 1})
    return report.to_plan_file()


def small_layouts(world: int, batch: int, seq: int) -> list[Layout]:
    model, training = load_model("tiny-llama"), TrainingSpec(global_batch_size=batch, seq_len=seq, precision="fp32")
    options = SearchOptions(recompute_modes=("none", "full"), schedules=("1f1b",), allow_hsdp=False, **LAUNCHABLE)
    return [lay for lay in all_layouts(model, training, world, world, options)
            if not (lay.tp > 1 and not lay.sequence_parallel) and not launch_problems(model, training, lay)
            and not layout_problems(lay, model, training, world, world)
            and not (lay.pp > 1 and lay.num_microbatches < lay.pp)]  # torch's Schedule1F1B refuses m < pp


def kendall_tau(a: list[float], b: list[float]) -> float:
    """Kendall's tau-b between two sequences (ties in either count as neither)."""
    concordant = discordant = ties_a = ties_b = 0
    for i in range(len(a)):
        for j in range(i + 1, len(a)):
            da, db = a[i] - a[j], b[i] - b[j]
            if da == 0 and db == 0:
                continue
            if da == 0:
                ties_a += 1
            elif db == 0:
                ties_b += 1
            elif (da > 0) == (db > 0):
                concordant += 1
            else:
                discordant += 1
    denom = math.sqrt((concordant + discordant + ties_a) * (concordant + discordant + ties_b))
    return (concordant - discordant) / denom if denom else 0.0


def regret(predicted: list[float], measured: list[float]) -> float:
    """Measured time of the predicted-fastest layout over the measured-fastest."""
    pick = min(range(len(predicted)), key=predicted.__getitem__)
    return measured[pick] / min(measured)


def rank_figures(label: str, runs: list[Run], profile=None) -> None:
    measured = [r.measured_step_time_s for r in runs]
    before = predict_all(runs, None, profile)
    cal = fit(runs, profile=profile)
    from dataclasses import replace

    from costmodels.assumptions import DEFAULT_ASSUMPTIONS
    after = predict_all(runs, replace(DEFAULT_ASSUMPTIONS, **cal.factors), profile)
    half = [runs[::2], runs[1::2]]
    cross = [0.0] * len(runs)
    for k, train in enumerate(half):
        factors = fit(train, profile=profile).factors
        test_idx = list(range(1 - k, len(runs), 2))
        preds = predict_all([runs[i] for i in test_idx], replace(DEFAULT_ASSUMPTIONS, **factors), profile)
        for i, p in zip(test_idx, preds):
            cross[i] = p
    print(f"{label}: {len(runs)} layouts; factors " + ", ".join(f"{k} {v:.3g}" for k, v in cal.factors.items()))
    for name, pred in (("before calibration", before), ("after (in-sample)", after), ("after (2-fold)", cross)):
        med = sorted(abs(p / m - 1) for p, m in zip(pred, measured))[len(pred) // 2]
        print(f"  {name:20s} Kendall tau {kendall_tau(pred, measured):+.3f}   regret {regret(pred, measured):.3f}"
              f"   median |error| {100 * med:.1f}%")


def launch_resuming(jobs: list[dict], workdir: Path, steps: int, world: int, attempts: int = 3) -> dict[str, dict]:
    """``runner.launch``, relaunching the layouts not yet measured when a rank aborts.

    gloo on this machine now and then kills a rank with a C++ abort (a heap-corruption message
    or 'terminate called without an active exception') in the middle of a launch of dozens of
    layouts; the layouts measured before it stand, the rest run again (at most ``attempts``
    launches in all), and each relaunch is printed."""
    measured: dict[str, dict] = {}
    for attempt in range(attempts):
        remaining = [j for j in jobs if j["name"] not in measured]
        if not remaining:
            break
        sub = workdir / f"launch-{attempt}"
        sub.mkdir(parents=True, exist_ok=True)
        try:
            measured |= runner.launch(remaining, sub, steps=steps, warmup=1, nproc=world)
        except runner.ValidateError as err:
            done = sub / f"results-{world}.jsonl"
            lines = done.read_text(encoding="utf-8").splitlines() if done.exists() else []
            measured |= {r["name"]: r for r in map(json.loads, lines)}
            if attempt == attempts - 1:
                raise
            print(f"  launch {attempt + 1} aborted after {len(lines)} of {len(remaining)} layouts ({err}); "
                  "relaunching the rest")
    return measured


def measured_runs(world: int, workdir: Path, steps: int) -> tuple[list[Run], list]:
    batch, seq = 4, 64
    plans = [(f"w{world}-{i:03d}", plan_file("tiny-llama", "cpu", world, batch, seq, "fp32", lay))
             for i, lay in enumerate(small_layouts(world, batch, seq))]
    jobs, skipped = runner.prepare(plans, workdir)
    began = time.perf_counter()
    measured = launch_resuming(jobs, workdir, steps, world)
    print(f"world size {world}: {len(jobs)} layouts measured in {time.perf_counter() - began:.0f} s"
          f" ({len(skipped)} refused by the launcher)")
    results = [runner.compare(j, measured[j["name"]]) for j in jobs if j["name"] in measured]
    runs = [Run(inputs=j["plan"].inputs, layout=j["layout"], measured_step_time_s=r.measured_step_time_s)
            for j, r in zip(jobs, results)]
    return runs, results


def memory_figures(results: list) -> None:
    print("  memory error per layout, worst pipeline rank (predicted vs measured):")
    print("    layout                                         states    states+gathered  activations")
    worst = {"states": 0.0, "states_peak": 0.0, "activations": 0.0}
    for r in results:
        errs = {c: worst_error(r.memory, c) for c in worst}
        for c, e in errs.items():
            worst[c] = max(worst[c], e or 0.0)
        L = r.layout
        name = (f"dp{L.dp} tp{L.tp} pp{L.pp} z{L.zero_stage} mb{L.micro_batch_size}x{L.num_microbatches}"
                f" {L.recompute}")
        print(f"    {name:45s} {errs['states']:7.2f}%  {errs['states_peak']:12.2f}%  {errs['activations']:9.1f}%")
    within = sum(1 for r in results if (worst_error(r.memory, "states") or 0) <= 2.0)
    act = sum(1 for r in results if (worst_error(r.memory, "activations") or 0) <= 15.0)
    print(f"  worst |error|: states {worst['states']:.2f}% ({within}/{len(results)} within 2%), states with gathered"
          f" copies {worst['states_peak']:.2f}%, activations {worst['activations']:.1f}% ({act}/{len(results)} within 15%)")


DRY_CASES = [
    ("FSDP ZeRO-3", dict(dp=8, tp=1, pp=1, zero_stage=3, num_microbatches=1)),
    ("TP+SP", dict(dp=1, tp=8, pp=1, sequence_parallel=True, num_microbatches=1)),
    ("PP 1F1B", dict(dp=1, tp=1, pp=4, schedule="1f1b", num_microbatches=4)),
]


def dry_runs(workdir: Path) -> None:
    print("dry runs at seq 8192, h100-sxm-80gb, bf16 (fake tensors; per-GPU, worst pipeline rank):")
    print("  model       layout          recompute  states pred/meas (GiB)  err     activations pred/meas (GiB)  err")
    for model, gpus in (("llama3-8b", 8), ("llama3-70b", 8)):
        for label, fields in DRY_CASES:
            for recompute in ("none", "full"):
                extra = {"pp": 4, "dp": 2} if model == "llama3-70b" and label == "PP 1F1B" else {}
                layout = Layout(**{**fields, **extra}, micro_batch_size=1, recompute=recompute)
                world = layout.world_size
                plan = plan_file(model, "h100-sxm-80gb", world, layout.dp * layout.num_microbatches, 8192, "bf16",
                                 layout)
                jobs, skipped = runner.prepare([(f"{model}-{label}-{recompute}".replace(" ", "_"), plan)], workdir)
                if skipped:
                    print(f"  {model:11s} {label:15s} {recompute:9s}  refused: {skipped[0].skipped}")
                    continue
                began = time.perf_counter()
                r = runner.compare(jobs[0], runner.dry_run(jobs[0]))
                row = {c: max((x for x in r.memory if x.component == c), key=lambda x: x.measured_bytes)
                       for c in ("states", "activations")}
                s, a = row["states"], row["activations"]
                print(f"  {model:11s} {label:15s} {recompute:9s}  {s.predicted_bytes / 2**30:8.2f} / "
                      f"{s.measured_bytes / 2**30:8.2f}  {s.error_pct:+6.1f}%   {a.predicted_bytes / 2**30:8.2f} / "
                      f"{a.measured_bytes / 2**30:8.2f}  {a.error_pct:+6.1f}%   ({time.perf_counter() - began:.0f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--steps", type=int, default=6, help="timed steps per layout (median; one warm-up before)")
    parser.add_argument("--skip-runs", action="store_true")
    parser.add_argument("--skip-dry-run", action="store_true")
    args = parser.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="autoplan-fidelity-"))
    began = time.perf_counter()
    if not args.skip_runs:
        for world in (2, 4):
            runs, results = measured_runs(world, workdir / f"w{world}", args.steps)
            memory_figures(results)
            rank_figures(f"step time at world size {world}, datasheet rates (cpu preset)", runs)
            rank_figures(f"step time at world size {world}, measured profile ({SHIPPED_PROFILE.name})", runs,
                         load_profile(SHIPPED_PROFILE))
    if not args.skip_dry_run:
        dry_runs(workdir / "dry")
    print(f"total {time.perf_counter() - began:.0f} s; jobs and logs in {workdir}")


if __name__ == "__main__":
    main()
