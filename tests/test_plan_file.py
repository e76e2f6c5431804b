"""``PlanFile``: the one reader and writer of plan files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import planner
from planner.plan.plan_file import PlanFile, PlanFileError, read_plan_file

JOBS = [
    dict(model="llama3-8b", hardware="h100-sxm-80gb", gpus=16, global_batch=64, seq_len=4096),
    dict(model="mixtral-8x7b", hardware="h100-sxm-80gb", gpus=32, global_batch=128, seq_len=4096),
    dict(model="tiny-llama", hardware="cpu", gpus=4, global_batch=8, seq_len=128, precision="fp32", launchable=True),
    # nothing fits: closest misses are written instead of a best plan
    dict(model="llama3-70b", hardware="a100-sxm-40gb", gpus=2, global_batch=2, seq_len=4096),
]


@pytest.mark.parametrize("job", JOBS, ids=[j["model"] for j in JOBS])
def test_plan_file_round_trips_byte_for_byte(job):
    report = planner.plan(**job)
    text = report.to_json()
    back = PlanFile.from_json(text)
    assert back.to_json() == text
    assert back == report.to_plan_file()
    assert (back.best is None) == (not report.feasible)
    if report.feasible:
        assert back.best.layout == report.best.layout
        assert [c.layout for c in back.candidates] == [c.layout for c in report.candidates]
        assert back.best.predicted["step_time_s"] == report.best.predicted_dict()["step_time_s"]
    else:
        assert [m.entry.layout for m in back.closest_misses] == [m.breakdown.layout for m in report.closest_misses]
    assert back.inputs.model_spec == planner.api.resolve_job(**{k: v for k, v in job.items() if k != "launchable"}).model
    assert back.inputs_digest == back.inputs.digest()


def _plan_dict() -> dict:
    return json.loads(planner.plan(**JOBS[0]).to_json())


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["best"]["layout"].update(zero_stage=7), "best.layout.zero_stage"),
    (lambda d: d["best"]["layout"].update(dp="two"), "best.layout.dp"),
    (lambda d: d["best"]["layout"].update(colour=1), "best.layout: unknown field 'colour'"),
    (lambda d: d["best"]["layout"].update(tp=3), "best.layout does not fit the plan's inputs"),
    (lambda d: d["candidates"][0]["layout"].update(dp=d["candidates"][0]["layout"]["dp"] * 2),
     "candidates.0.layout does not fit the plan's inputs"),
    (lambda d: d["inputs"]["training"].update(global_batch_size=7), "but inputs.training.global_batch_size 7"),
    (lambda d: d["inputs"].update(gpus=d["inputs"]["gpus"] * 2), "but inputs.gpus"),
    (lambda d: d["best"]["predicted"].update(step_time_s=-1), "best.predicted.step_time_s: -1 is outside"),
    (lambda d: d["best"]["predicted"].update(step_time_s=1e308), "best.predicted.step_time_s: 1e+308 is outside"),
    (lambda d: d["best"]["predicted"].update(mfu=-0.5), "best.predicted.mfu: -0.5 is outside"),
    (lambda d: d["best"]["predicted"].update(bubble_fraction=2), "best.predicted.bubble_fraction: 2 is outside"),
    (lambda d: d["best"].pop("predicted"), "best.predicted: missing"),
    (lambda d: d["candidates"][1]["layout"].update(tp=0), "candidates.1.layout.tp"),
    (lambda d: d["inputs"].update(gpus="16"), "inputs.gpus: expected int"),
    (lambda d: d["inputs"].update(gpus=True), "inputs.gpus: expected int"),
    (lambda d: d["inputs"]["training"].update(seq_len=-1), "inputs.training"),
    (lambda d: d["inputs"]["model_spec"].update(wings=2), "inputs.model_spec: unknown field 'wings'"),
    (lambda d: d["inputs"].pop("hardware"), "inputs.hardware: missing"),
    (lambda d: d["inputs"].update(memory_fraction=5), "inputs.memory_fraction: must be in (0, 1]"),
    (lambda d: d["inputs"].update(gpus_per_node=0), "inputs.gpus_per_node: must be a positive integer"),
    (lambda d: d["best"].update(tp_plan={"a": 1}), "best.tp_plan"),
    (lambda d: d.update(schema_version=1), "schema_version 1 is not 2"),
    (lambda d: d.pop("candidates"), "candidates: missing"),
    (lambda d: d["search"].update(space_size="many"), "search.space_size: expected int"),
    (lambda d: d["search"]["rejected"].update(memory=1.5), "search.rejected.memory: expected a non-negative int"),
    (lambda d: d.update(no_fit=[]), "no_fit: expected an object"),
    (lambda d: d.update(no_fit={"reason": "x", "model_state_gib": 1.0, "smallest_fitting_gpus": "8"}),
     "no_fit.smallest_fitting_gpus: expected a positive integer or null"),
    (lambda d: d.update(no_fit={"reason": "x", "model_state_gib": 1.0, "smallest_fitting_gpus": 8,
                                "fitting_layout": {"dp": 0}}), "no_fit.fitting_layout"),
    (lambda d: d.update(no_fit={"reason": "x", "model_state_gib": 1.0, "smallest_fitting_gpus": 8}),
     "no_fit: smallest_fitting_gpus and fitting_layout must be both set or both null"),
])
def test_bad_field_is_named_by_its_dotted_path(edit, field):
    data = _plan_dict()
    edit(data)
    with pytest.raises(PlanFileError) as err:
        PlanFile.from_dict(data)
    assert field in str(err.value) and "\n" not in str(err.value)


def test_zero_stage_message_says_what_is_allowed():
    data = _plan_dict()
    data["best"]["layout"]["zero_stage"] = 7
    with pytest.raises(PlanFileError, match=r"^best\.layout\.zero_stage"):
        PlanFile.from_dict(data)


def test_reader_refuses_fifo_and_devices_without_hanging(tmp_path):
    fifo = tmp_path / "plan.fifo"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero"), tmp_path):
        with pytest.raises(PlanFileError, match="not a regular file"):
            read_plan_file(path)


def test_reader_caps_the_size(tmp_path):
    big = tmp_path / "big.json"
    with open(big, "wb") as handle:
        handle.truncate(65 * 2**20)  # sparse: no disk used
    with pytest.raises(PlanFileError, match="larger than 64 MiB"):
        read_plan_file(big)


@pytest.mark.parametrize("verb", ["explain", "launch", "validate"])
def test_cli_verbs_refuse_a_fifo_in_one_line_exit_2(tmp_path, verb):
    fifo = tmp_path / "plan.fifo"
    os.mkfifo(fifo)
    extra = ["--out", str(tmp_path / "job")] if verb == "launch" else []
    proc = subprocess.run([str(Path(sys.executable).parent / "autoplan"), verb, str(fifo), *extra], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "not a regular file" in proc.stderr and proc.stdout == ""
