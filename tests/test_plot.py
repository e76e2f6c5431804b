"""``--plot DIR``: PNG and SVG figures of a plan exist and are valid images."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import matplotlib.image
from click.testing import CliRunner

import planner
from planner.cli import main
from planner.validate.plot import candidate_points, plan_cost_model, plot_plan

NAMES = ("schedule", "memory", "candidates")


def _check(directory):
    for name in NAMES:
        png = directory / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        image = matplotlib.image.imread(png)
        assert image.shape[0] > 100 and image.shape[1] > 100
        root = ET.parse(directory / f"{name}.svg").getroot()
        assert root.tag.endswith("svg")


def test_plot_plan_writes_three_figures_twice(tmp_path):
    report = planner.plan(model="tiny-llama", hardware="cpu", gpus=4, gpus_per_node=4, global_batch=8, seq_len=64,
                          precision="fp32", launchable=True)
    paths = plot_plan(report.to_plan_file(), tmp_path)
    assert sorted(p.name for p in paths) == sorted(f"{n}.{e}" for n in NAMES for e in ("png", "svg"))
    _check(tmp_path)


def test_plan_and_explain_plot_option(tmp_path):
    runner = CliRunner()
    plan = tmp_path / "plan.json"
    args = ["plan", "--model", "tiny-llama", "--hardware", "cpu", "--gpus", "2", "--global-batch", "4",
            "--seq-len", "32", "--precision", "fp32", "--out", str(plan), "--plot", str(tmp_path / "a")]
    assert runner.invoke(main, args).exit_code == 0
    _check(tmp_path / "a")
    result = runner.invoke(main, ["explain", str(plan), "--plot", str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    _check(tmp_path / "b")


def test_plot_costs_with_the_plans_profile():
    """``plan --profile P --plot``: the figures use P, as the plan did, so the chosen plan's star
    sits on its own point of the candidates cloud (datasheet rates put it elsewhere)."""
    job = dict(model="tiny-llama", hardware="cpu", gpus=2, global_batch=4, seq_len=128, precision="fp32")
    shipped = Path(__file__).resolve().parents[1] / "profiles" / "data" / "cpu-gloo-2proc.json"
    plan = planner.plan(profile=str(shipped), **job).to_plan_file()
    datasheet = planner.plan(**job).to_plan_file()
    best = plan.best.predicted
    drawn = plan_cost_model(plan).estimate(plan.best.layout)
    assert round(drawn.step_time_s, 6) == round(best["step_time_s"], 6)
    assert round(plan_cost_model(datasheet).estimate(plan.best.layout).step_time_s, 6) != round(best["step_time_s"], 6)
    points = {(round(m, 3), round(t, 6)) for m, t, _ in candidate_points(plan, plan_cost_model(plan))}
    assert (round(best["peak_memory_gib"], 3), round(best["step_time_s"], 6)) in points


def test_explain_plot_without_the_plans_profile_is_one_line_exit_2(tmp_path, monkeypatch):
    shipped = Path(__file__).resolve().parents[1] / "profiles" / "data" / "cpu-gloo-2proc.json"
    (tmp_path / "p.json").write_bytes(shipped.read_bytes())
    monkeypatch.chdir(tmp_path)
    args = ["plan", "--model", "tiny-llama", "--hardware", "cpu", "--gpus", "2", "--global-batch", "4",
            "--seq-len", "32", "--precision", "fp32", "--profile", "p.json", "--out", "plan.json"]
    assert CliRunner().invoke(main, args).exit_code == 0
    (tmp_path / "p.json").unlink()
    result = CliRunner().invoke(main, ["explain", "plan.json", "--plot", "figs"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1].startswith("error: inputs.profile p.json: no such file")


def test_schedule_plot_of_256_microbatches_is_a_small_window(tmp_path):
    from planner.api import resolve_job
    from planner.plan.report import PlanReport
    from planner.validate.plot import MAX_DRAWN_MICROBATCHES, drawn_microbatches, plot_schedule

    assert drawn_microbatches(256, 4, 1) == MAX_DRAWN_MICROBATCHES
    assert drawn_microbatches(256, 4, 2) % 4 == 0 and drawn_microbatches(16, 4, 1) == 16
    request = dict(model="tiny-llama", hardware="cpu", gpus=2, global_batch=256, seq_len=64, precision="fp32")
    layout = planner.Layout(dp=1, pp=2, num_microbatches=256)
    breakdown = planner.evaluate(layout=layout, **request)
    file = PlanReport(inputs=resolve_job(**request).inputs, best=breakdown, candidates=()).to_plan_file()
    paths = plot_schedule(file, plan_cost_model(file), tmp_path)
    svg = next(p for p in paths if p.suffix == ".svg")
    assert svg.stat().st_size < 300_000
