"""An ILP plan applied with parallelize_module under torchrun matches the single-process loss."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = str(Path(__file__).parent)
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
CASES = {"user_tower": ("test_alpa_fixtures:tower_wide", (4, 64)),
         "autoplan_tiny_llama": ("test_alpa_fixtures:tiny_llama", (2, 128))}


def _plan(factory: str, shape) -> dict:
    from planner.alpa.shard import shard_graph
    from planner.alpa.trace import build_from_factory, token_inputs, trace_module

    graph = trace_module(build_from_factory(factory, "fp32"), token_inputs(shape))
    return shard_graph(graph, tp=2, hardware="cpu", dtype="fp32").report.to_dict()


@pytest.fixture(scope="module", params=sorted(CASES))
def parity(request, tmp_path_factory):
    factory, shape = CASES[request.param]
    work = tmp_path_factory.mktemp(request.param)
    report = _plan(factory, shape)
    (work / "plan.json").write_text(json.dumps(report))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", "2", "-m", "planner.alpa.parity",
                           "--module", factory, "--input-shape", ",".join(map(str, shape)),
                           "--plan", str(work / "plan.json"), "--out", str(work / "result.json")],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return report, json.loads((work / "result.json").read_text())


@pytest.mark.torchrun
def test_plan_splits_the_model(parity):
    report, result = parity
    styles = {v.split(";")[0] for v in report["tp_plan"].values()}
    assert {"colwise", "rowwise"} <= styles  # the run exercises real tensor parallelism
    assert result["tp_plan"] == report["tp_plan"] and result["world_size"] == 2


@pytest.mark.torchrun
def test_loss_matches_single_process(parity):
    _, result = parity
    assert len(result["reference"]) == 3
    assert result["reference"][-1] < result["reference"][0]  # training moved
    for ref, par in zip(result["reference"], result["parallel"]):
        assert par == pytest.approx(ref, rel=1e-5, abs=1e-6)
