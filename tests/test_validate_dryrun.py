"""``validate --dry-run``: the step on fake tensors gives exact model-state bytes at any size."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import planner
from costmodels.params import total_params
from costmodels.presets import load_model
from planner.cli import main


@pytest.mark.slow
def test_dry_run_fsdp_states_are_fp32_shards(tmp_path):
    """FSDP2 with bf16 compute keeps fp32 sharded params (4 B) and Adam states (8 B) per element."""
    plan = tmp_path / "plan.json"
    args = ["evaluate", "--model", "tiny-llama", "--hardware", "h100-sxm-80gb", "--gpus", "2", "--global-batch", "2",
            "--seq-len", "128", "--dp", "2", "--tp", "1", "--pp", "1", "--zero", "3", "--out", str(plan)]
    assert CliRunner().invoke(main, args).exit_code == 0
    result = CliRunner().invoke(main, ["validate", str(plan), "--dry-run", "--format", "json",
                                       "--workdir", str(tmp_path / "w")])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    rows = {r["component"]: r for r in report["plans"][0]["memory_bytes"]}
    psi = total_params(load_model("tiny-llama"))
    assert rows["params"]["measured"] == pytest.approx(4 * psi / 2, rel=0.01)
    assert rows["optimizer"]["measured"] == pytest.approx(8 * psi / 2, rel=0.01)
    assert rows["activations"]["measured"] > 0
    assert "step_time_s" not in report["plans"][0]
    assert "--launchable" in report["note"]  # a megatron-costed plan is flagged as not like for like
    assert planner is not None


@pytest.mark.parametrize("model, layout_args", [
    ("tiny-llama", ["--dp", "2", "--tp", "1", "--pp", "1", "--zero", "1"]),  # 2 micro-batches: unsharded grads accumulate
    ("tiny-llama", ["--dp", "2", "--tp", "1", "--pp", "1", "--zero", "2"]),
    ("tiny-llama", ["--dp", "1", "--tp", "2", "--pp", "1", "--sequence-parallel"]),
    ("tiny-llama", ["--dp", "1", "--tp", "1", "--pp", "2", "--recompute", "full"]),
    ("tiny-llama", ["--dp", "1", "--tp", "1", "--pp", "1", "--cp", "2", "--cp-attention", "all_gather"]),
    ("tiny-mixtral", ["--dp", "2", "--tp", "1", "--pp", "1", "--ep", "2", "--zero", "3"]),
    ("tiny-mixtral", ["--dp", "1", "--tp", "2", "--pp", "1", "--sequence-parallel"]),
], ids=["zero1", "zero2", "tp2-sp", "pp2-full", "cp2-all-gather", "moe-ep2-zero3", "moe-tp2-sp-autocast"])
@pytest.mark.slow
def test_torch_runtime_predicts_each_model_state_and_activations_of_the_job(tmp_path, model, layout_args):
    """With ``--runtime torch`` the cost model counts params, grads and optimizer states as the
    launched job holds them (FSDP2 fp32 shards for every ZeRO stage >= 1; a vocabulary-sharded
    embedding whose gradient is a shard too), each within 2% of the dry run's exact bytes, and
    the activations autograd saves (FSDP2 mixed precision, autocast without dp, PyTorch SP's
    gathered inputs, pipeline in-flight micro-batches, all-gather CP's gathered K/V and mask, MoE
    capacity slots with experts split over ep and tp) within 2% on every pipeline rank."""
    plan = tmp_path / "plan.json"
    args = ["evaluate", "--model", model, "--hardware", "h100-sxm-80gb", "--gpus", "2", "--global-batch", "4",
            "--seq-len", "128", "--runtime", "torch", *layout_args, "--out", str(plan)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(main, ["validate", str(plan), "--dry-run", "--format", "json",
                                       "--workdir", str(tmp_path / "w")])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["plans"][0]["memory_bytes"]
    assert {"params", "grads", "optimizer", "activations"} <= {row["component"] for row in rows}
    for row in rows:
        if row["component"] in ("params", "grads", "optimizer", "activations"):
            assert row["predicted"] == pytest.approx(row["measured"], rel=0.02), row


@pytest.mark.slow
def test_validate_removes_its_temporary_directory_unless_keep(tmp_path, monkeypatch):
    import tempfile

    plan = tmp_path / "plan.json"
    args = ["evaluate", "--model", "tiny-llama", "--hardware", "cpu", "--gpus", "2", "--global-batch", "2",
            "--seq-len", "64", "--precision", "fp32", "--dp", "2", "--tp", "1", "--pp", "1", "--zero", "3",
            "--out", str(plan)]
    assert CliRunner().invoke(main, args).exit_code == 0
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    result = CliRunner().invoke(main, ["validate", str(plan), "--dry-run", "--format", "json"])
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith("dry run: 1 plan(s), 1 pipeline rank(s) in all")  # said before it starts
    json.loads(result.stdout)
    assert not list(scratch.glob("autoplan-validate-*"))
    assert CliRunner().invoke(main, ["validate", str(plan), "--dry-run", "--format", "json", "--keep"]).exit_code == 0
    assert len(list(scratch.glob("autoplan-validate-*"))) == 1


@pytest.mark.slow
def test_validate_reports_progress_per_plan(tmp_path):
    from pathlib import Path

    from planner.validate.workflow import run_validation

    plan = tmp_path / "plan.json"
    args = ["evaluate", "--model", "tiny-llama", "--hardware", "cpu", "--gpus", "2", "--global-batch", "2",
            "--seq-len", "64", "--precision", "fp32", "--dp", "2", "--tp", "1", "--pp", "1", "--zero", "3",
            "--out", str(plan)]
    assert CliRunner().invoke(main, args).exit_code == 0
    calls = []
    run_validation(Path(plan), num_candidates=0, steps=1, warmup=0, nproc=None, dry_run=True, calibrate=False,
                   profile_path=None, workdir=None, progress=lambda *call: calls.append(call))
    assert calls[0][:2] == (0, 1) and "dry run" in calls[0][2]
    assert calls[-1] == (1, 1, "done")


_MEASURE = """
import json, sys, warnings
warnings.filterwarnings("ignore")
from planner.plan.plan_file import read_plan_file
from planner.validate import dryrun
plan = read_plan_file(sys.argv[1]); t = plan.inputs.training
def measure(mode):
    if mode == "all":
        dryrun.STEPPED_MICROBATCHES = 10**9
    r = dryrun.measure_rank(plan.inputs.model_spec, plan.best.layout, 0, t.seq_len, t.precision, t.optimizer)
    r.pop("seconds")
    return r
print(json.dumps([dryrun.in_child(measure, mode) for mode in ("all", "stepped")], sort_keys=True))
"""


@pytest.mark.parametrize("layout_args", [["--zero", "1"], ["--zero", "3", "--recompute", "full"]])
@pytest.mark.slow
def test_three_micro_batches_measure_what_all_eight_do(tmp_path, layout_args):
    """The dry run steps 3 of a pp = 1 plan's 8 micro-batches (``dryrun.stepped_layout``): every
    component's peak equals the one of stepping all 8 (each run in its own process, forked from one
    interpreter by ``dryrun.in_child`` as the dry run runs ranks)."""
    import os
    import subprocess
    import sys

    plan = tmp_path / "plan.json"
    args = ["evaluate", "--model", "tiny-llama", "--hardware", "cpu", "--gpus", "2", "--global-batch", "16",
            "--seq-len", "64", "--dp", "2", "--tp", "1", "--pp", "1", "--micro-batch", "1", "--runtime", "torch",
            *layout_args, "--out", str(plan)]
    assert CliRunner().invoke(main, args).exit_code == 0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.run([sys.executable, "-c", _MEASURE, str(plan)], capture_output=True, text=True, env=env,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-1000:]
    every, stepped = json.loads(run.stdout.strip().splitlines()[-1])
    assert every == stepped and every["activations"] > 0


def test_the_cost_line_counts_the_micro_batches_the_dry_run_steps():
    from planner.validate import dryrun, runner

    assert runner.DRY_RUN_MICROBATCHES == dryrun.STEPPED_MICROBATCHES
    plan = planner.plan(model="tiny-llama", hardware="cpu", gpus=2, global_batch=16, seq_len=64,
                        top_k=1).to_plan_file()
    chosen = [plan.best, *plan.candidates[:1]]
    passes = sum(p.layout.pp * (p.layout.num_microbatches if p.layout.pp > 1 else min(p.layout.num_microbatches, 3))
                 for p in chosen)
    assert f"({2 * passes} micro-batch passes in all)" in runner.dry_run_cost(plan, 1)
