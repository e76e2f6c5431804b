"""``validate --dry-run``: the step on fake tensors gives exact model-state bytes at any size."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import planner
from costmodels.params import total_params
from costmodels.presets import load_model
from planner.cli import main


def test_dry_run_fsdp_states_are_fp32_shards(tmp_path):
    """FSDP2 with bf16 compute keeps fp32 sharded params (4 B) and Adam states (8 B) per element."""
    plan = tmp_path / "plan.json"
    args = ["evaluate", "--model", "tiny-llama", "--hardware", "h100-sxm-80gb", "--gpus", "2", "--global-batch", "2",
            "--seq-len", "128", "--dp", "2", "--tp", "1", "--pp", "1", "--zero", "3", "--out", str(plan)]
    assert CliRunner().invoke(main, args).exit_code == 0
    result = CliRunner().invoke(main, ["validate", str(plan), "--dry-run", "--format", "json",
                                       "--workdir", str(tmp_path / "w")])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    rows = {r["component"]: r for r in report["plans"][0]["memory_bytes"]}
    psi = total_params(load_model("tiny-llama"))
    assert rows["params"]["measured"] == pytest.approx(4 * psi / 2, rel=0.01)
    assert rows["optimizer"]["measured"] == pytest.approx(8 * psi / 2, rel=0.01)
    assert rows["activations"]["measured"] > 0
    assert "step_time_s" not in report["plans"][0]
    assert planner is not None
