"""ILP plans applied with parallelize_module under torchrun match the single-process loss.

One torchrun launch (2 processes, gloo) checks three models: a user model with repeated blocks,
a user model with a fused q/k/v projection, and autoplan's own tiny-llama (the model launch trains).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = str(Path(__file__).parent)
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
CASES = {"test_alpa_fixtures:tower_wide": (4, 64), "test_alpa_fixtures:fused_qkv": (4, 64),
         "test_alpa_fixtures:tiny_llama": (2, 128)}


def _plan(factory: str, shape) -> dict:
    from planner.alpa.shard import shard_graph
    from planner.alpa.trace import build_from_factory, token_inputs, trace_module

    graph = trace_module(build_from_factory(factory, "fp32"), token_inputs(shape))
    return shard_graph(graph, tp=2, hardware="cpu", dtype="fp32").report.to_dict()


@pytest.fixture(scope="module")
def parity(tmp_path_factory):
    work = tmp_path_factory.mktemp("parity")
    reports, command = {}, [TORCHRUN, "--standalone", "--nproc-per-node", "2", "-m", "planner.alpa.parity"]
    for i, (factory, shape) in enumerate(sorted(CASES.items())):
        reports[factory] = _plan(factory, shape)
        (work / f"plan{i}.json").write_text(json.dumps(reports[factory]))
        command += ["--case", factory, ",".join(map(str, shape)), str(work / f"plan{i}.json")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")])}
    for _ in range(2):
        proc = subprocess.run(command + ["--out", str(work / "result.json")], capture_output=True, text=True,
                              env=env, timeout=300, check=False)
        # gloo on this 2-core VM sometimes aborts a rank with a C++ "terminate called without an
        # active exception" right after DTensor's all-to-all fallback (seen in 2 of 4 full-suite runs,
        # 0 of 18 runs of this launch alone). That is a crash of the transport, not a wrong answer:
        # launch once more; any other failure, or a second abort, fails the test.
        if proc.returncode == 0 or "terminate called without an active exception" not in proc.stderr:
            break
    assert proc.returncode == 0, proc.stderr[-3000:]
    return reports, json.loads((work / "result.json").read_text())


@pytest.mark.torchrun
@pytest.mark.parametrize("factory", sorted(CASES))
def test_plan_is_applied_and_splits_the_model(parity, factory):
    reports, result = parity
    plan = reports[factory]["tp_plan"]
    assert result["world_size"] == 2 and result["cases"][factory]["tp_plan"] == plan
    assert any(v.split(";")[0] in ("colwise", "rowwise") for v in plan.values())  # real tensor parallelism
    assert reports[factory]["unexpressible"] == []


@pytest.mark.torchrun
@pytest.mark.parametrize("factory", sorted(CASES))
def test_loss_matches_single_process(parity, factory):
    case = parity[1]["cases"][factory]
    assert len(case["reference"]) == 3
    assert case["reference"][-1] < case["reference"][0]  # training moved
    for ref, par in zip(case["reference"], case["parallel"]):
        assert par == pytest.approx(ref, rel=1e-5, abs=1e-6)
