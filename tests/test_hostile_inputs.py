"""Issue 38's three hostile-input reproducers: a malformed ``predicted`` block, a step far longer than
the cluster's MTBF, and a no-fit search at many GPU counts. Each exits 2 or 1 (never 3, a bug) in one
line, and the API raises only its documented errors (``ValueError`` subclasses) or reports no fit."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from costmodels.goodput import daly_useful_fraction
from planner import api
from planner.cli import main
from planner.plan.plan_file import PlanFileError, read_plan_file

PLAN = ["--model", "llama3-8b", "--hardware", "h100-sxm-80gb", "--gpus", "8", "--global-batch", "64",
        "--seq-len", "4096"]


@pytest.fixture(scope="module")
def plan_text(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("plan") / "plan.json"
    assert CliRunner().invoke(main, ["plan", *PLAN, "--out", str(out)]).exit_code == 0
    return out.read_text(encoding="utf-8")


@pytest.mark.parametrize("where, change, field", [
    ("best", {"time_s": ""}, "best.predicted.time_s"),
    ("best", {"memory_usable_gib": {}}, "best.predicted.memory_usable_gib"),
    ("best", {"peak_memory_gib": "60"}, "best.predicted.peak_memory_gib"),
    ("best", {"tokens_per_s": None}, "best.predicted.tokens_per_s"),
    ("best", {"comm_gib_per_gpu": {"tp": []}}, "best.predicted.comm_gib_per_gpu.tp"),
    ("best", {"band": "x"}, "best.predicted.band"),
    ("best", {"step_time_s": None}, "best.predicted.step_time_s"),
    ("candidate", {"band": "x"}, "candidates.0.predicted.band"),
    ("best", {"mfu": True}, "best.predicted.mfu"),
])
def test_explain_refuses_a_malformed_prediction_in_one_line_naming_the_field(tmp_path, plan_text, where, change,
                                                                          field):
    raw = json.loads(plan_text)
    entry = raw["best"] if where == "best" else raw["candidates"][0]
    for key, value in change.items():
        if value is None:
            entry["predicted"].pop(key)
        else:
            entry["predicted"][key] = value
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(raw), encoding="utf-8")
    with pytest.raises(PlanFileError, match=field.replace(".", r"\.")):
        read_plan_file(path)
    result = CliRunner().invoke(main, ["explain", str(path)])
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1 and field in result.output and "Traceback" not in result.output


def test_the_useful_fraction_is_defined_for_any_step_length():
    """Daly's T_s / T_w, computed in logs: a step past the MTBF gives a fraction in [0, 1], never an overflow."""
    mtbf = 3600.0
    assert daly_useful_fraction(1e9, 10.0, 100.0, mtbf) == 0.0
    values = [daly_useful_fraction(tau, 10.0, 100.0, mtbf) for tau in (1e3, 1e4, 1e5, 1e6, 1e300)]
    assert all(0.0 <= v <= 1.0 for v in values) and values == sorted(values, reverse=True)  # past τ_opt: falls
    assert daly_useful_fraction(1e300, 10.0, 100.0, mtbf) == 0.0


@pytest.mark.parametrize("argv", [
    ["plan", "--model", "llama2-7b", "--hardware", "cpu", "--gpus", "8", "--global-batch", "64",
     "--seq-len", "10000000"],
    ["plan", "--model", "gpt-oss-120b", "--hardware", "a100-sxm-40gb", "--gpus", "1", "--global-batch", "1000000",
     "--seq-len", "131072", "--runtime", "torch"],
])
def test_hostile_reproducers_exit_1_or_2_within_10_seconds(argv):
    """Within 10 s of the process's own CPU time (wall time on a shared 2-core machine also counts
    other jobs' turns; a generous wall limit still catches a search without bound, which ran > 600 s)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "planner.cli", *argv], capture_output=True, text=True, timeout=120)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert run.returncode in (1, 2), run.stderr[-2000:]
    assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()[-1]) > 0
    assert cpu < 10.0 and wall < 60.0, (cpu, wall)


def test_goodput_is_defined_for_a_step_far_past_the_mtbf():
    """The reproducer's step (a 10M-token sequence on CPU cores: about 32 years) against a cluster
    MTBF of months: the API reports a goodput near 0, never an overflow, and plans it as no fit."""
    import math

    import planner

    cost = planner.evaluate(model="llama2-7b", hardware="cpu", gpus=8, global_batch=8, seq_len=10_000_000,
                            layout=planner.Layout(dp=8, num_microbatches=1))
    g = cost.goodput
    assert cost.step_time_s > g.mtbf_s  # the step outlasts the MTBF
    assert 0.0 <= g.useful_fraction < 1e-6 and math.isfinite(g.tokens_per_s)
    report = api.plan(model="llama2-7b", hardware="cpu", gpus=8, global_batch=64, seq_len=10_000_000)
    assert report.best is None and report.no_fit.reason
