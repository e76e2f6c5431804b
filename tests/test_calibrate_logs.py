"""Calibrated by the user's own runs: logs in each framework's format -> factors -> a plan that uses them.

The "measured" times are the cost model's own under known factors (plus a little noise), written into
Megatron-LM logs and torchtitan run directories in those frameworks' real formats
(``tests/synthetic_logs.py``); the calibration must read them back, recover the factors the runs
inform, hold the rest at 1 and say so, and write a profile ``plan --calibration`` uses."""

from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path

import pytest
from click.testing import CliRunner

from costmodels.assumptions import DEFAULT_ASSUMPTIONS
from costmodels.presets import load_model
from planner.api import layout_for_batch, resolve_job
from planner.calibrate import CalibrationError, calibrate
from costmodels.calibration_factors import assumptions_at
from planner.calibrate.megatron_log import read_megatron_log
from planner.calibrate.sources import read_sources
from planner.cli import main
from synthetic_logs import megatron_args, megatron_log_text, write_torchtitan_run

HW = "h100-sxm-80gb"
TRUTH = {"gemm": 1.2, "intra_node": 1.5}
"""The cluster the logs come from: GEMMs 20% slower than shipped, NVLink collectives 1.5x slower."""


def _megatron_dir(tmp_path: Path, truth: dict[str, float] = TRUTH, noise: float = 0.01) -> Path:
    """Twelve Megatron-LM logs of Llama 3 8B on 16 H100s (two nodes), one out of memory."""
    model, rng = load_model("llama3-8b"), random.Random(7)
    job = resolve_job(model=model, hardware=HW, gpus=16, global_batch=64, seq_len=4096)
    true_model = job.cost_model(assumptions_at(DEFAULT_ASSUMPTIONS, truth))
    logs = tmp_path / "megatron"
    logs.mkdir()
    for i, (tp, pp, mb) in enumerate(itertools.product((1, 2, 4, 8), (1, 2), (1, 2))):
        if (tp, mb) in ((1, 1), (8, 2)):
            continue
        layout = layout_for_batch(64, dp=16 // (tp * pp), tp=tp, pp=pp, micro_batch_size=mb, zero_stage=i % 2)
        cost = true_model.estimate(layout)
        args = megatron_args(model, layout, seq_len=4096, global_batch=64)
        text = megatron_log_text(args, cost.step_time_s * math.exp(rng.gauss(0, noise)),
                                 peak_mib=cost.peak_memory_bytes / 2**20 * 1.05)
        (logs / f"run{i:02d}.log").write_text(text, encoding="utf-8")
    oom = layout_for_batch(64, dp=16, tp=1, pp=1, micro_batch_size=4, zero_stage=0)
    (logs / "oom.log").write_text(megatron_log_text(megatron_args(model, oom, seq_len=4096, global_batch=64), 1.0,
                                                    out_of_memory=True), encoding="utf-8")
    (logs / "notes.txt").write_text("nothing to read here\n", encoding="utf-8")
    return logs


def test_a_megatron_log_reads_back_as_its_job_and_layout(tmp_path):
    model = load_model("llama3-8b")
    layout = layout_for_batch(64, dp=4, tp=2, pp=2, micro_batch_size=2, zero_stage=1)
    path = tmp_path / "run.log"
    path.write_text(megatron_log_text(megatron_args(model, layout, seq_len=4096, global_batch=64), 2.5,
                                      peak_mib=40_000), encoding="utf-8")
    run = read_megatron_log(path, hardware=HW)
    assert run.layout == layout
    assert run.request["gpus"] == 16 and run.request["global_batch"] == 64 and run.request["seq_len"] == 4096
    spec = run.request["model"]
    assert (spec.num_layers, spec.hidden_size, spec.num_kv_heads, spec.vocab_size) == (32, 4096, 8, 128256)
    # the first logged interval (3x slower, warm-up) is dropped; the rest are within 0.4% of 2.5 s
    assert run.step_time_s == pytest.approx(2.5, rel=0.005)
    assert run.peak_memory_bytes == pytest.approx(40_000 * 2**20)
    # the memory-estimate of that run costs the same as the layout it read
    job = resolve_job(**run.request)
    assert job.cost_model().estimate(run.layout).step_time_s > 0


def test_the_first_logged_interval_is_warm_up_whatever_the_log_interval():
    from planner.calibrate.megatron_log import step_times

    def line(iteration: int, ms: float) -> str:
        return f" iteration {iteration:8d}/    1000 | elapsed time per iteration (ms): {ms:.1f} |"

    # --log-interval 100: iteration 100's interval averages the warm-up in; it is not a step time
    assert step_times([line(100, 3000.0), line(200, 1000.0), line(300, 1010.0)]) == [1.0, 1.01]
    assert step_times([line(10, 3000.0), line(20, 1000.0)]) == [1.0]  # --log-interval 10, as the synthetic logs
    assert step_times([line(5, 3000.0), line(10, 1500.0), line(15, 1000.0)]) == [1.0]  # past 10 iterations only


def test_a_megatron_log_without_an_arguments_block_names_the_file(tmp_path):
    path = tmp_path / "bare.log"
    path.write_text(" iteration       10/     100 | elapsed time per iteration (ms): 1000.0 |\n", encoding="utf-8")
    with pytest.raises(CalibrationError, match=r"bare\.log: no Megatron-LM arguments block"):
        read_megatron_log(path, hardware=HW)
    cut = tmp_path / "cut.log"
    cut.write_text("------------------------ arguments ------------------------\n  num_layers ..... 4\n", encoding="utf-8")
    with pytest.raises(CalibrationError, match=r"cut\.log: the arguments block never ends"):
        read_megatron_log(cut, hardware=HW)


def test_a_megatron_log_directory_calibrates_end_to_end(tmp_path):
    logs = _megatron_dir(tmp_path)
    sources = read_sources([logs], hardware=HW)
    assert len(sources.runs) == 13 and sum(r.out_of_memory for r in sources.runs) == 1
    assert any("notes.txt" in s for s in sources.skipped)  # a file that is no log is skipped and said so
    report, table, _ = calibrate([str(logs)], hardware=HW)
    factors = report["factors"]
    assert factors["gemm"]["multiplier"] == pytest.approx(1.2, rel=0.06)
    assert factors["intra_node"]["multiplier"] == pytest.approx(1.5, rel=0.1)
    # the network was as shipped: found so
    assert factors["inter_node"]["multiplier"] == pytest.approx(1.0, abs=0.05)
    # Megatron's fused layers pay no host floor: no run informs it, so it stays at 1 and says so
    assert factors["host"] == {**factors["host"], "multiplier": 1.0, "informed": False, "informing_runs": 0}
    for f in factors.values():
        assert f["bounds"][0] <= f["multiplier"] <= f["bounds"][1]
        assert len(f["informed_by"]) == f["informing_runs"] and all(".log (Megatron-LM" in o for o in f["informed_by"])
    assert report["median_abs_error_before"] > 0.08  # the shipped model is off this cluster ...
    assert report["median_abs_error_leave_one_out"] < 0.03  # ... and the calibration is not, held out
    assert table["compute_scale"] == pytest.approx(factors["gemm"]["multiplier"])
    assert "layer_overhead_s" not in table  # an uninformed factor writes nothing
    assert 0 < table["step_time_log_sd"] < 0.05


def test_a_torchtitan_run_directory_calibrates_end_to_end(tmp_path):
    model = load_model("llama3-8b")
    truth = {"gemm": 1.15, "host": 1.6}
    job = resolve_job(model=model, hardware=HW, gpus=8, global_batch=16, seq_len=2048, runtime="torchtitan")
    true_model = job.cost_model(assumptions_at(DEFAULT_ASSUMPTIONS, truth))
    runs = tmp_path / "titan"
    for i, (tp, mb, zero, recompute) in enumerate(itertools.product((1, 2), (1, 2), (2, 3), ("none", "full"))):
        layout = layout_for_batch(16, dp=8 // tp, tp=tp, micro_batch_size=mb, zero_stage=zero, recompute=recompute)
        cost = true_model.estimate(layout)
        write_torchtitan_run(runs / f"run{i:02d}", "llama3-8b", model, job.training, layout, seq_len=2048,
                             step_s=cost.step_time_s, peak_gib=cost.peak_memory_bytes / 2**30)
    sources = read_sources([runs], hardware=HW)
    assert len(sources.runs) == 16 and {r.request["runtime"] for r in sources.runs} == {"torchtitan"}
    report, _, _ = calibrate([str(runs)], hardware=HW)
    assert report["factors"]["gemm"]["multiplier"] == pytest.approx(1.15, rel=0.08)
    assert report["median_abs_error_leave_one_out"] < 0.03


def test_plan_with_the_calibration_costs_with_its_factors_and_says_so(tmp_path):
    logs = _megatron_dir(tmp_path)
    out = tmp_path / "cal.json"
    runner = CliRunner()
    made = runner.invoke(main, ["calibrate", str(logs), "--hardware", "h100", "--out", str(out)])
    assert made.exit_code == 0, made.output
    said = " ".join(made.output.split())  # the console wraps long lines
    assert "no run informs it: held at 1" in said and "leave-one-out" in said
    request = ["--model", "llama3-8b", "--hardware", "h100-sxm-80gb", "--gpus", "16", "--global-batch", "64",
               "--seq-len", "4096", "--format", "json"]
    plain = json.loads(runner.invoke(main, ["plan", *request]).output)
    calibrated = json.loads(runner.invoke(main, ["plan", *request, "--calibration", str(out)]).output)
    # slower GEMMs and network: every layout is slower, by about what the factors say
    assert calibrated["best"]["predicted"]["step_time_s"] > 1.1 * plain["best"]["predicted"]["step_time_s"]
    band = calibrated["best"]["predicted"]["band"]
    assert band["calibration"].startswith("rates calibrated by 12 logged runs of this cluster")
    assert "leave-one-out" in band["step_time_s"]["basis"]
    table = runner.invoke(main, ["plan", *request[:-2], "--calibration", str(out)])
    assert "rates calibrated by 12 logged runs of this cluster" in " ".join(table.output.split())
    both = runner.invoke(main, ["plan", *request, "--calibration", str(out), "--profile", str(out)])
    assert both.exit_code == 2 and "give --calibration or --profile, not both" in both.output


def test_bad_sources_are_one_line_errors(tmp_path):
    runner = CliRunner()
    missing = runner.invoke(main, ["calibrate", str(tmp_path / "nope"), "--hardware", "h100",
                                   "--out", str(tmp_path / "c.json")])
    assert missing.exit_code == 2 and "no such file or directory" in missing.output
    table = tmp_path / "runs.csv"
    table.write_text("model,gpus,global_batch,seq_len,dp,tp,pp,step_time_s\nllama3-8b,8,16,2048,8,1,1,abc\n",
                     encoding="utf-8")
    bad = runner.invoke(main, ["calibrate", str(table), "--hardware", "h100", "--out", str(tmp_path / "c.json")])
    assert bad.exit_code == 2 and "runs.csv:2: step_time_s is 'abc', not a number" in bad.output
    assert not (tmp_path / "c.json").exists()
    binary = tmp_path / "utf16.csv"
    binary.write_bytes("model,gpus\n".encode("utf-16"))
    coded = runner.invoke(main, ["calibrate", str(binary), "--hardware", "h100", "--out", str(tmp_path / "c.json")])
    assert coded.exit_code == 2 and "utf16.csv: not UTF-8 text" in coded.output and "Traceback" not in coded.output


HEADER = "model,gpus,global_batch,seq_len,dp,tp,pp,micro_batch,step_time_s\n"


@pytest.mark.parametrize(("row", "needle"), [
    # dp 4 x tp 1 x pp 1 = 4 GPUs, but the row ran on 8: evaluate refuses the same layout
    ("llama3-8b,8,64,4096,4,1,1,1,3.1", "runs.csv:2: dp 4 x tp 1 x pp 1 x cp 1 = 4, but gpus 8; "
                                         "choose degrees whose product is 8"),
    ("llama3-8b,8,64,4096,8,1,1,3,3.1", "runs.csv:2: global_batch 64 is not divisible by dp 8 x micro_batch 3"),
    ("llama3-8b,6,64,4096,2,3,1,1,3.1", "runs.csv:2: tp 3 does not divide the 32 attention heads"),
    ("llama3-8b,8,64,4095,4,2,1,1,3.1", "runs.csv:2: seq_len 4095 is not divisible by tp 2"),
    ("llama3-8b,8,64,4096,4,,1,1,3.1", "runs.csv:2: tp is empty; every row needs model, gpus"),
])
def test_a_table_row_is_checked_as_evaluate_checks_a_layout(tmp_path, row, needle):
    table = tmp_path / "runs.csv"
    table.write_text(HEADER + row + "\n", encoding="utf-8")
    out = tmp_path / "c.json"
    result = CliRunner().invoke(main, ["calibrate", str(table), "--hardware", HW, "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert needle in result.output and len(result.output.strip().splitlines()) == 1
    assert not out.exists()
    if "gpus 8" in needle:   # the same layout, given to evaluate, is refused for the same reason
        refused = CliRunner().invoke(main, ["evaluate", "--model", "llama3-8b", "--hardware", HW, "--gpus", "8",
                                            "--global-batch", "64", "--seq-len", "4096", "--dp", "4", "--tp", "1",
                                            "--pp", "1"])
        assert refused.exit_code == 2 and "= 4, but --gpus 8" in refused.output


def _calibration(tmp_path: Path, name: str, table: dict[str, float], factors: dict[str, float]) -> str:
    """A calibration profile as ``autoplan calibrate`` writes it, with these factors."""
    from planner.calibrate import write_calibration_profile

    provenance = {"source": "autoplan calibrate", "runs": 10, "timed_runs": 10,
                  "median_abs_error_leave_one_out": 0.02,
                  "factors": {k: {"multiplier": v, "informed": True} for k, v in factors.items()}}
    path = tmp_path / f"{name}.json"
    write_calibration_profile(path, {**table, "step_time_log_sd": 0.02}, provenance, None, hardware=HW,
                              gpus_per_node=None)
    return str(path)


def test_a_bad_calibration_is_named_by_the_option_given_and_the_command_that_makes_one(tmp_path):
    """--calibration fills the profile input: its errors say --calibration, never '?' for what the
    file does not record, and advise 'autoplan calibrate' (which makes it), not 'autoplan profile'."""
    runner = CliRunner()
    job = ["--model", "llama3-8b", "--gpus", "8", "--global-batch", "64", "--seq-len", "4096"]
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text("{", encoding="utf-8")
    for path, needle in ((corrupt, "not valid JSON"), (tmp_path / "missing.json", "cannot read")):
        result = runner.invoke(main, ["plan", *job, "--hardware", HW, "--calibration", str(path)])
        assert result.exit_code == 2 and f'error: --calibration "{path}": {needle}' in result.output
    made_on_h100 = _calibration(tmp_path, "h100", {"compute_scale": 1.1}, {"gemm": 1.1})
    result = runner.invoke(main, ["plan", *job, "--hardware", "a100-sxm-80gb", "--calibration", made_on_h100])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert f"error: --calibration {made_on_h100} was measured on NVIDIA H100" in result.output
    assert "?" not in result.output and "(cuda, nodes of 8)" in result.output
    assert "'autoplan calibrate LOGS --hardware a100-sxm-80gb --out FILE'" in result.output
    assert "autoplan profile" not in result.output and "--profile " not in result.output
    # a calibration of one timed run has no leave-one-out error: no step band, and calibrate is what fixes it
    from planner.calibrate import write_calibration_profile

    one_run = tmp_path / "one.json"
    write_calibration_profile(one_run, {"compute_scale": 1.1}, {"source": "autoplan calibrate", "runs": 1,
                                                                 "timed_runs": 1}, None, hardware=HW,
                              gpus_per_node=None)
    planned = runner.invoke(main, ["plan", *job, "--hardware", HW, "--calibration", str(one_run), "--format", "json"])
    note = json.loads(planned.output)["best"]["predicted"]["band"]["step_time_note"]
    assert "re-run 'autoplan calibrate'" in note and "validate --calibrate" not in note


def test_the_calibration_moves_the_pick_where_its_factors_say_so_and_explain_names_them(tmp_path):
    import planner
    from planner.explain import explain
    from planner.plan.plan_file import read_plan_file

    request = dict(model="llama3-8b", hardware=HW, gpus=16, global_batch=64, seq_len=4096)
    shipped = planner.plan(**request).best.layout
    assert shipped.tp == 4
    # NVLink three times as slow as shipped: tensor parallelism costs three times its traffic, so the
    # pick leaves tp 4 (at twice, tp 4 stays within the tie band of the fastest, and the tie keeps it)
    slow_nvlink = _calibration(tmp_path, "nvlink", {"intra_node_comm_scale": 3.0}, {"intra_node": 3.0})
    moved = planner.plan(**request, profile=slow_nvlink)
    assert moved.best.layout.tp < shipped.tp
    # GEMMs 5% slower everywhere: every layout slows alike, the pick stays (at 10-20% the layouts
    # less bound by GEMMs move closer, dp 8 · tp 2 without TP overlap enters the tie band and, the
    # simpler, wins the tie)
    slow_gemm = _calibration(tmp_path, "gemm", {"compute_scale": 1.05}, {"gemm": 1.05})
    kept = planner.plan(**request, profile=slow_gemm)
    assert kept.best.layout == shipped and kept.best.step_time_s > planner.plan(**request).best.step_time_s
    for report, factor, changed in ((moved, "intra_node", True), (kept, "gemm", False)):
        path = tmp_path / f"{factor}-plan.json"
        path.write_text(report.to_json(), encoding="utf-8")
        doc = explain(read_plan_file(path))["calibration"]
        assert doc["moved"] is changed
        if changed:
            assert doc["factors"] == ["intra_node"] and "tp 4" in doc["uncalibrated"]


def test_the_written_profile_keeps_the_base_calibration_no_factor_replaces(tmp_path):
    from planner.calibrate import write_calibration_profile
    from profiles import HardwareProfile, load_profile

    base = HardwareProfile(device_type="cuda", calibration={"compute_scale": 1.3, "step_overhead_s": 0.02},
                           provenance={"device_name": "NVIDIA H100 80GB HBM3", "devices_per_node": 8})
    out = tmp_path / "cal.json"
    write_calibration_profile(out, {"compute_scale": 1.1, "step_time_log_sd": 0.02}, {"source": "test"}, base,
                              hardware=HW, gpus_per_node=None)
    written = load_profile(out).calibration
    assert written == {"compute_scale": 1.1, "step_overhead_s": 0.02, "step_time_log_sd": 0.02}


def test_the_calibration_line_counts_runs_in_words():
    from planner.plan.bands import calibration_line

    assert calibration_line({"timed_runs": 1}, None).startswith("rates calibrated by 1 logged run of this cluster")
    assert calibration_line({"timed_runs": 12}, None).startswith("rates calibrated by 12 logged runs of this cluster")
