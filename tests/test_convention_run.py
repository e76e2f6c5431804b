"""The FSDP2 convention the cost model costs is what the launched job does: one torchrun launch
(2 processes, CPU/gloo, ``tests/data/fsdp2_syncs.py``) counts the data-parallel collectives of
one step's forward and backward at each ZeRO stage, with 2 and with 4 micro-batches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from costmodels.runtimes import FSDP2

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("syncs") / "syncs.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
               str(REPO / "tests" / "data" / "fsdp2_syncs.py"), str(out)]
    proc = subprocess.run(command, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text(encoding="utf-8"))


@pytest.mark.torchrun
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_launched_job_syncs_as_the_fsdp2_convention_says(launched, stage):
    """Per step and FSDP unit (each block, plus the root): ``gathers_per_microbatch`` all-gathers
    per micro-batch (0 = one per step) and a reduce-scatter after every micro-batch or once, as
    ``FSDP2.dp_sync`` gives them to the cost model; a stage that shards nothing is ``replicate``:
    one all-reduce per step, no gather."""
    units = launched["units"]
    gathers_per_mb, reduce_every = FSDP2.dp_sync(stage, 1)
    sharded = FSDP2.zero(stage).sharded_stage > 0
    for m in (2, 4):
        counts = launched["counts"][str(stage)][str(m)]
        if not sharded:
            assert counts == {"all_reduce": 1}, counts
            continue
        assert counts.get("all_gather_single", 0) == units * (gathers_per_mb * m if gathers_per_mb else 1), (m, counts)
        assert counts.get("reduce_scatter_single", 0) == units * (m if reduce_every else 1), (m, counts)
        assert "all_reduce" not in counts
