"""Planning from the shipped CPU profile: the terms it measured change, the others do not."""

from __future__ import annotations

from pathlib import Path

import pytest

import planner
import profiles
from costmodels.layout import Layout

SHIPPED = Path(profiles.__file__).parent / "data" / "cpu-gloo-2proc.json"
COVERED = ("compute", "attention", "memory_bound")
JOB = dict(model="tiny-llama", hardware="cpu", global_batch=8, seq_len=256)


def _pair(gpus: int, layout: Layout):
    return (planner.evaluate(**JOB, gpus=gpus, layout=layout),
            planner.evaluate(**JOB, gpus=gpus, layout=layout, profile=SHIPPED))


def test_profile_replaces_compute_memory_and_in_node_collective_terms() -> None:
    """2 CPU processes on one node, tp = 2: GEMM, attention, memory-bound and the TP all-reduce
    (2 ranks, one node) are all measured by the shipped profile, so each changes source and value."""
    datasheet, measured = _pair(2, Layout(dp=1, tp=2, pp=1, num_microbatches=8))
    for term in (*COVERED, "tp_comm"):
        assert datasheet.sources[term] == "datasheet"
        assert measured.sources[term] == "profile", term
    assert measured.compute_s != pytest.approx(datasheet.compute_s, rel=1e-3)
    assert measured.tp_comm_s != pytest.approx(datasheet.tp_comm_s, rel=1e-3)
    assert measured.optimizer_s != pytest.approx(datasheet.optimizer_s, rel=1e-3)  # memory-bound step
    assert measured.step_time_s != pytest.approx(datasheet.step_time_s, rel=1e-3)


def test_terms_the_profile_did_not_measure_fall_back_to_the_datasheet() -> None:
    """4 processes = 2 nodes of 2: pp = 2 sends across nodes, which a one-node profile never
    measured, so pipeline p2p keeps its datasheet source and value while dp (in node) changes."""
    layout = Layout(dp=2, tp=1, pp=2, num_microbatches=4, zero_stage=1)
    datasheet, measured = _pair(4, layout)
    assert measured.sources["pp_comm"] == "datasheet"
    assert measured.pp_comm_s == datasheet.pp_comm_s
    assert measured.sources["dp_comm"] == "profile"
    for term in COVERED:
        assert measured.sources[term] == "profile"


def test_plan_with_profile_ranks_on_measured_numbers() -> None:
    with_profile = planner.plan(**JOB, gpus=2, profile=str(SHIPPED))
    without = planner.plan(**JOB, gpus=2)
    assert with_profile.best is not None and without.best is not None
    for term in COVERED:
        assert with_profile.best.sources[term] == "profile"
        assert without.best.sources[term] == "datasheet"
    assert with_profile.inputs.profile == str(SHIPPED)
    assert with_profile.best.step_time_s != pytest.approx(without.best.step_time_s, rel=1e-3)
