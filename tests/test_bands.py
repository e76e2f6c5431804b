"""Error bands (issue #11): taken from held-out residuals, shown in the table and the plan JSON,
and a layout whose memory band crosses the cap is a risk."""

import json
import math

import pytest
from click.testing import CliRunner

from costmodels.bands import (Band, band_from_residuals, memory_residuals, memory_risk, profile_step_band,
                              residual_values, shipped_memory_band, shipped_step_band)
from planner.plan.bands import JobBands
from planner.cli import main

EVALUATE = ["evaluate", "--model", "llama3-8b", "--hardware", "h100-sxm-80gb", "--gpus", "8", "--global-batch", "64",
            "--seq-len", "4096", "--dp", "4", "--tp", "2", "--pp", "1", "--zero", "1", "--micro-batch", "2"]


def test_band_by_hand_from_a_small_residual_list():
    # |r| sorted: 0, 0.1, 0.1, 0.2, 0.5; p80 sits at position (5-1)·0.8 = 3.2: 0.2 + 0.2·(0.5-0.2) = 0.26.
    # r sorted: -0.1, 0, 0.1, 0.2, 0.5; p10 at 0.4: -0.1 + 0.4·0.1 = -0.06; p90 at 3.6: 0.2 + 0.6·0.3 = 0.38.
    band = band_from_residuals([0.5, -0.1, 0.1, 0.0, 0.2], what="x", record="r")
    assert band.half_width_rel == pytest.approx(0.26)
    assert band.low_rel == pytest.approx(-0.06)
    assert band.high_rel == pytest.approx(0.38)
    assert band.bounds(10.0) == pytest.approx((9.4, 13.8))
    assert band.basis == "covers 80% of 5 x"


def test_memory_residual_is_measured_over_predicted():
    # predicted 25% above the measurement: measured / predicted - 1 = 1/1.25 - 1 = -0.2
    assert memory_residuals([0.25, -0.2]) == pytest.approx([-0.2, 0.25])


def test_memory_risk_rule():
    band = Band(low_rel=-0.1, high_rel=0.1, half_width_rel=0.1, basis="", record="")
    assert memory_risk(70.0, 76.0, band)          # 70 · 1.1 = 77 > 76: fits, band crosses the cap
    assert not memory_risk(60.0, 76.0, band)      # 66 <= 76
    assert not memory_risk(80.0, 76.0, band)      # does not fit at all: not a risk, a miss
    assert not memory_risk(70.0, 76.0, None)


def test_residual_records_in_either_form():
    assert residual_values([0.1, -0.2]) == ([0.1, -0.2], 0)
    assert residual_values([{"family": "a", "signed_error": 0.1}, {"family": "b", "signed_error": 0.3}]) == ([0.1, 0.3], 2)
    assert residual_values({"a": [0.1], "b": [{"signed_error": 0.2}], "c": []}) == ([0.1, 0.2], 2)
    assert residual_values("nonsense") == ([], 0)


def test_calibration_lofo_residuals_win_over_the_bands_file(tmp_path):
    calibration, bands = tmp_path / "calibration.json", tmp_path / "bands.json"
    bands.write_text(json.dumps({"throughput": {"residuals": [0.5, 0.5]}, "memory": {"residuals": [0.25]}}))
    calibration.write_text(json.dumps({"provenance": {}}))
    assert shipped_step_band(calibration, bands).half_width_rel == pytest.approx(0.5)
    calibration.write_text(json.dumps({"provenance": {"lofo_residuals": [0.1, -0.1]}}))
    step = shipped_step_band(calibration, bands)
    assert step.half_width_rel == pytest.approx(0.1) and "lofo_residuals" in step.record
    assert shipped_memory_band(bands_file=bands, memory_file=tmp_path / "absent.json").half_width_rel == pytest.approx(0.2)


def test_memory_band_comes_from_the_held_out_memory_residuals(tmp_path):
    """The memory calibration's LOFO residuals (measured / predicted - 1) win over the bands file's
    in-sample ones, and the band spans their 5th-95th percentiles (the fit rule's quantile)."""
    bands, memory = tmp_path / "bands.json", tmp_path / "memory.json"
    bands.write_text(json.dumps({"memory": {"residuals": [0.25]}}))
    values = [i / 100 for i in range(-20, 21)]  # -0.20 .. 0.20
    memory.write_text(json.dumps({"lofo_residuals": [{"family": "f", "measured_over_predicted": v} for v in values]}))
    band = shipped_memory_band(bands_file=bands, memory_file=memory)
    assert band.high_rel == pytest.approx(0.18) and band.low_rel == pytest.approx(-0.18)
    assert "lofo_residuals" in band.record and "held-out" in band.basis


def test_the_deepspeed_runtime_has_a_memory_band_of_its_own(tmp_path):
    """Residuals tagged with a band group make only that group's band: the deepspeed runtime's from
    its own, every other runtime's from the shared ones."""
    bands, memory = tmp_path / "bands.json", tmp_path / "memory.json"
    bands.write_text(json.dumps({"memory": {"residuals": [0.25]}}))
    shared = [{"family": "a", "band_group": "shared", "measured_over_predicted": i / 100} for i in range(-10, 11)]
    own = [{"family": "b", "band_group": "deepspeed", "measured_over_predicted": 0.3 + i / 100} for i in range(-10, 11)]
    memory.write_text(json.dumps({"lofo_residuals": shared + own}))
    assert shipped_memory_band("megatron", bands_file=bands, memory_file=memory).high_rel == pytest.approx(0.09)
    assert shipped_memory_band("torchtitan", bands_file=bands, memory_file=memory).high_rel == pytest.approx(0.09)
    deep = shipped_memory_band("deepspeed", bands_file=bands, memory_file=memory)
    assert deep.high_rel == pytest.approx(0.39) and "21 held-out runs (LOFO), 1 family" in deep.basis


def test_the_fit_rule_takes_the_runtime_band():
    """One layout, two runtimes: its memory cap is the usable memory over 1 + its runtime's edge."""
    import planner
    from costmodels.assumptions import DEFAULT_ASSUMPTIONS
    from planner import api
    kw = dict(model="llama3-8b", hardware="h100-sxm-80gb", gpus=8, global_batch=64, seq_len=4096,
              layout=api.layout_for_batch(64, dp=8, tp=1, pp=1, zero_stage=1, micro_batch_size=1))
    for runtime in ("megatron", "deepspeed"):
        b = planner.evaluate(runtime=runtime, **kw)
        upper = DEFAULT_ASSUMPTIONS.memory_band_upper_for(runtime)
        assert b.memory_band_upper == pytest.approx(upper)
        assert b.memory_capacity_bytes == pytest.approx(b.memory_usable_bytes / (1 + upper))
    assert DEFAULT_ASSUMPTIONS.deepspeed_memory_band_upper > DEFAULT_ASSUMPTIONS.memory_band_upper > 0


def test_profile_band_from_validate_calibrate_or_none():
    band = profile_step_band({"step_time_log_sd": 0.1}, "p.json", "megatron")
    assert band.high_rel == pytest.approx(math.exp(0.196) - 1)
    assert band.low_rel == pytest.approx(math.exp(-0.196) - 1)
    assert profile_step_band({"compute_scale": 1.2}, "p.json", "megatron") is None


def test_no_step_band_is_said_in_the_json():
    from planner.plan.bands import NO_PROFILE_BAND
    from planner.plan.report import plan_entry
    import planner

    breakdown = planner.evaluate(model="llama3-8b", hardware="h100-sxm-80gb", gpus=8, global_batch=64, seq_len=4096,
                                 layout=planner.Layout(dp=8, num_microbatches=8))
    band = plan_entry(breakdown, JobBands(step=None, memory=None, step_note=NO_PROFILE_BAND)).predicted["band"]
    assert band == {"step_time_s": None, "step_time_note": NO_PROFILE_BAND, "memory_risk": False}


def test_evaluate_shows_bands_in_table_and_json():
    table = CliRunner().invoke(main, EVALUATE)
    assert table.exit_code == 0, table.output
    doc = json.loads(CliRunner().invoke(main, EVALUATE + ["--format", "json"]).output)
    p, band = doc["predicted"], doc["predicted"]["band"]
    step = shipped_step_band()
    assert band["step_time_s"]["low"] == pytest.approx(p["step_time_s"] * (1 + step.low_rel), rel=1e-5)
    assert band["step_time_s"]["high"] == pytest.approx(p["step_time_s"] * (1 + step.high_rel), rel=1e-5)
    # the table shows ± h for a spread, and the two edges when one is under a quarter of the other (a bias)
    lopsided = min(-step.low_rel, step.high_rel) < 0.25 * max(-step.low_rel, step.high_rel)
    shown = f"{step.low_rel:+.0%} to {step.high_rel:+.0%}" if lopsided else f"± {step.half_width_rel:.0%}"
    assert f"step {p['step_time_s']:.3f} s {shown}" in table.output
    # the risk reads the usable memory: the cap already holds the band's upper edge
    assert band["memory_risk"] == (p["peak_memory_gib"] * (1 + shipped_memory_band().high_rel)
                                   > p["memory_usable_gib"])
    assert p["memory_capacity_gib"] == pytest.approx(p["memory_usable_gib"] / (1 + p["memory_band_upper"]), rel=1e-5)
    assert ("memory risk" in table.output) == band["memory_risk"]


def test_job_bands_follow_the_status_label():
    from planner.plan.bands import job_bands
    from profiles import HardwareProfile

    shipped = job_bands(None, None, "megatron")
    assert shipped.step == shipped_step_band() and shipped.memory == shipped_memory_band()
    calibrated = job_bands(HardwareProfile(device_type="cuda", calibration={"step_time_log_sd": 0.05},
                                           provenance={"calibration": {"runs": 6}}), "p.json", "megatron")
    assert calibrated.step.high_rel == pytest.approx(math.exp(1.96 * 0.05) - 1)
    assert calibrated.step.basis.endswith("validate --calibrate fit, 6 runs")
    assert calibrated.step.record == "p.json calibration.step_time_log_sd"
    measured_only = job_bands(HardwareProfile(device_type="cuda", provenance={}), "p.json", "megatron")
    assert measured_only.step is None and "validate --calibrate" in measured_only.step_note
    assert measured_only.memory == shipped_memory_band()


def test_explain_says_when_the_runner_up_is_inside_the_step_band():
    from planner.explain import within_step_band
    from planner.plan.plan_file import PlanEntry
    import planner

    layout = planner.Layout(dp=8, num_microbatches=8)
    band = {"step_time_s": {"low": 9.0, "high": 12.0}}
    best = PlanEntry(layout=layout, predicted={"step_time_s": 10.0, "band": band})
    assert within_step_band(best, PlanEntry(layout=layout, predicted={"step_time_s": 11.9}))
    assert not within_step_band(best, PlanEntry(layout=layout, predicted={"step_time_s": 12.1}))
    assert within_step_band(PlanEntry(layout=layout, predicted={"step_time_s": 10.0}),
                            PlanEntry(layout=layout, predicted={"step_time_s": 11.0})) is None


def test_profile_without_a_calibrate_fit_has_no_step_band_and_says_so():
    from pathlib import Path

    profile = str(Path(__file__).parents[1] / "profiles" / "data" / "cpu-gloo-2proc.json")
    args = ["evaluate", "--model", "tiny-llama", "--hardware", "cpu", "--gpus", "2", "--global-batch", "8",
            "--seq-len", "256", "--dp", "2", "--tp", "1", "--pp", "1", "--profile", profile]
    doc = json.loads(CliRunner().invoke(main, args + ["--format", "json"]).output)
    band = doc["predicted"]["band"]
    assert band["step_time_s"] is None and "validate --calibrate" in band["step_time_note"]
    assert band["peak_memory_gib"]["record"] == "costmodels/data/memory_calibration.json lofo_residuals"
    table = CliRunner().invoke(main, args).output
    assert "predicted from the measured profile" in table and "no step-time band" in table
    assert f"step {doc['predicted']['step_time_s']:.3f} s ·" in table      # no ± after the step


def test_a_one_sided_band_shows_its_edges_not_a_plus_minus():
    """A band wholly on one side of the prediction (the deepspeed runtime's memory: every residual
    of its family is above) is a bias, shown as its edges; a band around it keeps the ± form."""
    from planner.plan.render import _pm

    assert _pm({"low": 45.0, "high": 67.9, "half_width_rel": 0.46}, 45.0) == " +0% to +51%"
    assert _pm({"low": 51.9, "high": 74.0, "half_width_rel": 0.17}, 62.0) == " ± 17%"
    assert _pm(None, 62.0) == ""
    run = CliRunner().invoke(main, ["plan", "--model", "llama3-8b", "--hardware", "h100-sxm-80gb", "--gpus", "8",
                                    "--global-batch", "64", "--seq-len", "4096", "--runtime", "deepspeed"])
    assert run.exit_code == 0 and "+0% to +" in run.output.split("peak memory")[1].splitlines()[0]


def test_band_edges_print_as_figures_not_exponents():
    """A band of a thousand GiB or seconds reads 767-1,080, not 767-1.08e+03."""
    from planner.plan.render import band_lines

    record = {"basis": "held-out residuals", "record": "x y"}
    lines = band_lines({"peak_memory_gib": {"low": 767.3, "high": 1080.2, **record},
                        "step_time_s": {"low": 0.0123, "high": 54.92, **record}})
    assert lines[0].startswith("step band 0.0123-54.9 s") and lines[1].startswith("memory band 767-1,080 GiB")
    assert "e+" not in "".join(lines)
