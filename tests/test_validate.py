"""``autoplan validate`` end to end: one torchrun launch (2 processes, 2 plans) shared by the tests.

The launch runs the best plan and one candidate of a tiny-llama plan file, with --calibrate
writing a fresh profile. Tests read its JSON report, the step logs and the profile.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import planner
from costmodels.layout import Layout
from costmodels.params import total_params
from costmodels.presets import load_model
from planner.cli import main
from profiles import load_profile

REPO = Path(__file__).resolve().parent.parent
PLAN_ARGS = dict(model="tiny-llama", hardware="cpu", gpus=2, gpus_per_node=2, global_batch=4, seq_len=32,
                 precision="fp32", launchable=True, top_k=3)


@pytest.fixture(scope="module")
def validated(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("validate")
    plan_path = tmp / "plan.json"
    plan_path.write_text(planner.plan(**PLAN_ARGS).to_json(), encoding="utf-8")
    profile = tmp / "calibrated.json"
    proc = subprocess.run([str(Path(sys.executable).parent / "autoplan"), "validate", str(plan_path), "--candidates", "1",
                           "--steps", "2", "--warmup", "1", "--workdir", str(tmp / "work"), "--calibrate",
                           "--profile", str(profile), "--format", "json"],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout), plan_path, profile


@pytest.mark.slow
def test_reports_both_plans_with_step_time_error(validated):
    report, _, _ = validated
    plans = [p for p in report["plans"] if "skipped" not in p]
    assert [p["name"] for p in plans] == ["plan-0", "plan-1"]
    for p in plans:
        t = p["step_time_s"]
        assert t["measured"] > 0 and t["predicted"] > 0
        assert t["error_pct"] == pytest.approx(100 * (t["predicted"] - t["measured"]) / t["measured"])


@pytest.mark.slow
def test_parameter_bytes_are_exact(validated):
    """fp32 params: 4 bytes per element held; ZeRO-3 shards them over dp, TP splits the layers."""
    report, _, _ = validated
    psi = total_params(load_model("tiny-llama"))
    for p in report["plans"]:
        layout = Layout.from_dict(p["layout"])
        if layout.pp > 1 or layout.tp > 1 or layout.optimizer_offload:  # offloaded: on the host, 0 on device
            continue                                                     # (tests/test_dryrun_offload_lora.py)
        measured = next(r["measured"] for r in p["memory_bytes"] if r["component"] == "params")
        shards = layout.dp if layout.zero_stage > 0 else 1
        assert measured == pytest.approx(4 * psi / shards, rel=0.01)


@pytest.mark.slow
def test_launchable_plans_predict_states_and_activations_of_the_run(validated):
    """A --launchable plan is costed as the job holds memory (torch runtime): params, grads,
    optimizer states and saved activations each within 2% of the run's exact bytes, per rank."""
    report, _, _ = validated
    assert "note" not in report
    for p in report["plans"]:
        assert {"params", "grads", "optimizer", "activations"} <= {row["component"] for row in p["memory_bytes"]}
        for row in p["memory_bytes"]:
            if row["component"] in ("params", "grads", "optimizer", "activations"):
                assert row["predicted"] == pytest.approx(row["measured"], rel=0.02), (p["layout"], row)


@pytest.mark.slow
def test_step_log_written_like_the_generated_job(validated):
    report, _, _ = validated
    for p in report["plans"]:
        lines = (Path(p["job_dir"]) / "logs" / "metrics.jsonl").read_text().splitlines()
        assert len(lines) == 2
        record = json.loads(lines[0])
        assert {"step", "loss", "grad_norm", "step_time_s", "tokens_per_s"} <= set(record)
        assert (Path(p["job_dir"]) / "train.py").exists()


@pytest.mark.slow
def test_calibration_lowers_log_error_and_is_used_by_the_planner(validated):
    report, plan_path, profile = validated
    cal = report["calibration"]
    loaded = load_profile(profile)
    assert loaded.calibration and loaded.provenance["calibration"]["source"].startswith("autoplan validate")
    before = sum(math.log(p["step_time_s"]["predicted"] / p["step_time_s"]["measured"]) ** 2
                 for p in report["plans"])
    after = sum(math.log(a["predicted_s"] / a["measured_s"]) ** 2 for a in cal["after"])
    assert after <= before
    first = cal["after"][0]
    # The plan was made with --launchable, which costs for the torch runtime: evaluate the same way.
    evaluated = planner.evaluate(layout=Layout.from_dict(first["layout"]), profile=str(profile), runtime="torch",
                                 **{k: v for k, v in PLAN_ARGS.items() if k not in ("launchable", "top_k")})
    assert evaluated.step_time_s == pytest.approx(first["predicted_s"], rel=1e-9)
    low, high = first["interval_s"]
    assert low <= first["predicted_s"] <= high


def test_other_schema_version_is_one_line_exit_2(tmp_path):
    plan = json.loads(planner.plan(**PLAN_ARGS).to_json())
    plan["schema_version"] = 1
    path = tmp_path / "old.json"
    path.write_text(json.dumps(plan))
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "schema_version" in result.output
    assert "Traceback" not in result.output


@pytest.mark.slow
def test_failed_job_names_its_log(tmp_path):
    """A job that dies (its plan file is missing) gives one error naming the launch log."""
    from planner.validate.runner import ValidateError, launch

    job = {"name": "broken", "job_dir": str(tmp_path / "missing"), "layout": Layout(dp=1, tp=1, pp=1)}
    with pytest.raises(ValidateError) as err:
        launch([job], tmp_path, steps=1, warmup=0, nproc=1)
    log = str(err.value).rsplit("its log: ", 1)[1]
    assert Path(log).exists() and "missing" in Path(log).read_text()
