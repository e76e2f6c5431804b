"""A --seq-len past the model's context is planned, with a warning: on stderr, and in the plan's JSON."""

import json

from click.testing import CliRunner

import planner
from costmodels.presets import load_model
from planner.cli import main
from planner.plan.plan_file import PlanFile

JOB = ["--model", "llama3-8b", "--hardware", "h100-sxm-80gb", "--gpus", "8", "--global-batch", "8"]


def _plan(seq_len: int, *extra: str):
    return CliRunner().invoke(main, ["plan", *JOB, "--seq-len", str(seq_len), *extra])


def test_a_seq_len_past_the_context_warns_on_stderr_and_in_the_json():
    context = load_model("llama3-8b").max_position_embeddings
    result = _plan(4 * context, "--format", "json")
    assert result.exit_code == 0
    doc = json.loads(result.stdout)  # stdout is JSON only
    assert len(doc["warnings"]) == 1 and f"seq_len {4 * context}" in doc["warnings"][0]
    assert f"warning: {doc['warnings'][0]}" in result.stderr
    assert PlanFile.from_json(result.stdout).to_json() == result.stdout  # the field reads back


def test_a_seq_len_within_the_context_warns_of_nothing():
    context = load_model("llama3-8b").max_position_embeddings
    result = _plan(context, "--format", "json")
    assert result.exit_code == 0 and "warning" not in result.stderr
    assert "warnings" not in json.loads(result.stdout)  # plan files of ordinary requests are unchanged


def test_the_api_report_and_evaluate_carry_the_warning_too():
    report = planner.plan(model="llama3-8b", hardware="h100-sxm-80gb", gpus=8, global_batch=8, seq_len=16384)
    assert report.warnings and "8192" in report.warnings[0]
    result = CliRunner().invoke(main, ["evaluate", *JOB, "--seq-len", "16384", "--dp", "1", "--tp", "8",
                                       "--pp", "1", "--format", "json"])
    assert result.exit_code == 0 and "warning: seq_len 16384" in result.stderr
    json.loads(result.stdout)
