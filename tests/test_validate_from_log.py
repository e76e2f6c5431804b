"""``autoplan validate PLAN --calibrate --from-log TABLE``: calibrate from step times measured elsewhere.

The "measured" step times are made by the cost model itself with known factors (compute 1.8x
slower, 40 ms fixed per step): calibration must find factors that reproduce them, in sample and
leave-one-out. The Megatron-LM and torchtitan lines follow those frameworks' per-iteration log
formats (Megatron ``training_log``; torchtitan ``MetricsProcessor.log``), written here by hand.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from costmodels.assumptions import DEFAULT_ASSUMPTIONS
from planner.cli import main
from planner.validate.calibrate import Run, predict_all
from planner.plan.plan_file import read_plan_file
from planner.calibrate import megatron_log, torchtitan_log
from planner.validate.from_log import read_table
from planner.validate.runner import ValidateError
from profiles import load_profile

JOB = ["--model", "tiny-llama", "--hardware", "cpu", "--gpus", "4", "--global-batch", "8", "--seq-len", "128",
       "--precision", "fp32"]
LAYOUTS = [dict(dp=4, tp=1, pp=1, zero=1), dict(dp=2, tp=2, pp=1, zero=1), dict(dp=1, tp=4, pp=1, zero=0),
           dict(dp=2, tp=1, pp=2, zero=1), dict(dp=1, tp=2, pp=2, zero=0), dict(dp=4, tp=1, pp=1, zero=3)]
TRUTH = replace(DEFAULT_ASSUMPTIONS, compute_scale=1.8, step_overhead_s=0.04)

MEGATRON = """ [2026-11-20 10:00:01] iteration        1/      50 | consumed samples:            8 | elapsed time per iteration (ms): 9000.0 | learning rate: 1.000E-05 | global batch size:     8 | lm loss: 7.0E+00 |
 [2026-11-20 10:00:02] iteration        2/      50 | consumed samples:           16 | elapsed time per iteration (ms): {ms:.1f} | learning rate: 1.000E-05 | global batch size:     8 | lm loss: 6.9E+00 |
[Rank 0] (after 2 iterations) memory (MB) | allocated: 300.0 | max allocated: 512.0 | reserved: 600.0 | max reserved: 600.0
 [2026-11-20 10:00:03] iteration        3/      50 | consumed samples:           24 | elapsed time per iteration (ms): {ms:.1f} | learning rate: 1.000E-05 | global batch size:     8 | lm loss: 6.8E+00 |
"""
TITAN = """[titan] 2026-11-20 10:00:00,000 - root - INFO - \x1b[31mstep:  1  \x1b[32mloss:  7.0000  \x1b[33mmemory:  0.40GiB(1.00%)  \x1b[34mtps: 10  \x1b[36mtflops: 0.01  \x1b[35mmfu: 0.01%\x1b[39m
[titan] 2026-11-20 10:00:01,000 - root - INFO - step:  2  loss:  6.9000  memory:  0.75GiB(1.90%)  tps: {tps:,.0f}  tflops: 0.02  mfu: 0.02%
[titan] 2026-11-20 10:00:02,000 - root - INFO - step:  3  loss:  6.8000  memory:  0.75GiB(1.90%)  tps: {tps:,.0f}  tflops: 0.02  mfu: 0.02%
"""


@pytest.fixture(scope="module")
def plan_path(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("plan") / "plan.json"
    result = CliRunner().invoke(main, ["evaluate", *JOB, "--dp", "4", "--tp", "1", "--pp", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def _truth_times(plan_path: Path, tmp_path: Path) -> list[float]:
    """Step times of LAYOUTS under TRUTH, through the same table reader the command uses."""
    table = tmp_path / "layouts.csv"
    table.write_text("dp,tp,pp,zero,step_time_s\n" + "".join(f"{L['dp']},{L['tp']},{L['pp']},{L['zero']},1\n"
                                                               for L in LAYOUTS))
    inputs = read_plan_file(plan_path).inputs
    runs = [Run(inputs=inputs, layout=r.layout, measured_step_time_s=1.0) for r in read_table(table, inputs)]
    return predict_all(runs, TRUTH)


def test_framework_log_lines_give_step_time_and_peak_memory() -> None:
    lines = megatron_log.log_lines(MEGATRON.format(ms=123.4))
    assert megatron_log.step_times(lines) == [pytest.approx(0.1234)] * 2      # first iteration dropped
    assert megatron_log.peak_memory_bytes(lines) == 600.0 * 2**20             # max reserved
    # torchtitan: 8 sequences x 128 tokens per step over 4 GPUs at 256 tokens/s per GPU = 1 s.
    lines = torchtitan_log.log_lines(TITAN.format(tps=256))
    assert torchtitan_log.step_times(lines, tokens_per_step=8 * 128, num_gpus=4) == [pytest.approx(1.0)] * 2
    assert torchtitan_log.peak_memory_bytes(lines) == pytest.approx(0.75 * 2**30)


def test_validate_and_calibrate_read_a_log_alike(plan_path: Path, tmp_path: Path) -> None:
    """One Megatron-LM log, as a launcher prints it (rank prefixes, a warm-up past the first
    interval), gives ``validate --from-log`` the step time and peak that ``autoplan calibrate``
    reads from it: the warm-up iterations (<= 10) are dropped, not just the first line."""
    lines = ["[rank0]: ---- arguments ----", "[rank0]: ---- end of arguments ----"]
    for i, ms in ((5, 9000.0), (10, 400.0), (15, 100.0), (20, 120.0), (25, 110.0)):
        lines.append(f"[rank0]:  iteration {i:8d}/      50 | elapsed time per iteration (ms): {ms:.1f} | lm loss: 7.0E+00 |")
    lines.append("[rank0]: [Rank 0] memory (MB) | allocated: 300.0 | max allocated: 512.0 | reserved: 600.0 | "
                 "max reserved: 700.0")
    (tmp_path / "run.log").write_text("\n".join(lines) + "\n")
    table = tmp_path / "runs.csv"
    table.write_text("dp,tp,pp,zero,log\n4,1,1,1,run.log\n")
    (run,) = read_table(table, read_plan_file(plan_path).inputs)
    parsed = megatron_log.log_lines((tmp_path / "run.log").read_text())
    assert run.step_time_s == pytest.approx(0.110) == pytest.approx(statistics.median(megatron_log.step_times(parsed)))
    assert run.peak_memory_bytes == 700.0 * 2**20 == megatron_log.peak_memory_bytes(parsed)
    assert run.origin == "run.log (megatron, 3 iterations)"


def test_calibration_from_a_table_recovers_the_step_times(plan_path: Path, tmp_path: Path) -> None:
    truth = _truth_times(plan_path, tmp_path)
    (tmp_path / "mega.log").write_text(MEGATRON.format(ms=truth[1] * 1e3))
    (tmp_path / "titan.log").write_text(TITAN.format(tps=8 * 128 / (truth[2] * 4)))
    rows = ["dp\ttp\tpp\tzero\tstep_time_s\tstep_time_ms\tlog\tpeak_memory_gib"]
    for i, (L, t) in enumerate(zip(LAYOUTS, truth)):
        cells = {1: ("", "", "mega.log"), 2: ("", "", "titan.log"), 3: ("", f"{t * 1e3:.6f}", "")}.get(i, (f"{t:.6f}", "", ""))
        rows.append("\t".join([str(L["dp"]), str(L["tp"]), str(L["pp"]), str(L["zero"]), *cells, "0.5" if i == 0 else ""]))
    table = tmp_path / "runs.tsv"
    table.write_text("\n".join(rows) + "\n")
    profile = tmp_path / "cal.json"
    result = CliRunner().invoke(main, ["validate", str(plan_path), "--calibrate", "--from-log", str(table),
                                       "--profile", str(profile), "--format", "json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert [r["origin"].split(" ")[0] for r in report["rows"]][1:3] == ["mega.log", "titan.log"]
    for i, (row, t) in enumerate(zip(report["rows"], truth)):
        tps = 8 * 128 / (t * 4)  # torchtitan logs whole tokens/s: up to half a unit of rounding
        assert row["measured_s"] == pytest.approx(t, rel=1e-3 if i != 2 else 0.5 / tps + 1e-6)
        assert row["fitted_s"] == pytest.approx(t, rel=0.05)
        assert row["leave_one_out_s"] == pytest.approx(t, rel=0.15)
    assert report["rows"][0]["measured_peak_gib"] == 0.5
    assert report["median_abs_error_pct_before"] > 20 > report["median_abs_error_pct_after"]
    assert load_profile(profile).calibration   # the factors were written


@pytest.mark.parametrize(("table", "needle"), [
    ("tp,pp,step_time_s\n1,1,1\n", "the header needs dp"),
    ("dp,tp,pp,step_time_s\n4,1,1,fast\n", "step_time_s is 'fast'"),
    ("dp,tp,pp,step_time_s\n3,1,1,1\n", "inputs.training.global_batch_size 8 is not divisible by dp 3"),
    ("dp,tp,pp,step_time_s\n2,1,1,1\n", "row 1: dp 2 x tp 1 x pp 1 x cp 1 = 2, but the plan's inputs.gpus 4"),
    ("dp,tp,pp,schedule,virtual_stages,step_time_s\n4,1,1,,,1\n1,1,4,interleaved,2,1\n",
     "row 2: pp 4 x virtual stages 2 exceeds the 4 layers"),
    ("dp,tp,pp,log\n4,1,1,missing.log\n", "cannot read the log"),
])
def test_bad_tables_are_one_line_errors(plan_path: Path, tmp_path: Path, table: str, needle: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(table)
    result = CliRunner().invoke(main, ["validate", str(plan_path), "--calibrate", "--from-log", str(path),
                                       "--profile", str(tmp_path / "p.json")])
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1 and needle in result.output


def test_from_log_needs_calibrate(plan_path: Path, tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("dp,tp,pp,step_time_s\n4,1,1,1\n")
    result = CliRunner().invoke(main, ["validate", str(plan_path), "--from-log", str(path)])
    assert result.exit_code == 2 and "add --calibrate" in result.output
    with pytest.raises(ValidateError):
        read_table(tmp_path / "nope.csv", read_plan_file(plan_path).inputs)
