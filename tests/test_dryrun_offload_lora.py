"""The cost model counts what the job holds under optimizer offload and LoRA (``--runtime torch``),
checked against the dry run's exact bytes (``planner.validate.dryrun``: the job's own
construction on fake tensors, ``MemoryProbe``), as ``test_validate_dryrun.py`` does for the rest."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from planner.cli import main

REPO = Path(__file__).resolve().parent.parent
BASE = ["--model", "tiny-llama", "--hardware", "h100-sxm-80gb", "--global-batch", "4", "--seq-len", "128",
        "--runtime", "torch", "--pp", "1", "--zero", "3"]
DP2 = ["--gpus", "2", "--dp", "2", "--tp", "1"]
TP2_DP2_SP = ["--gpus", "4", "--dp", "2", "--tp", "2", "--sequence-parallel"]
STATES = ("params", "grads", "optimizer")


def _predicted(plan: Path, *extra: str) -> dict:
    """The cost model's bytes of each model state, written to ``plan``."""
    result = CliRunner().invoke(main, ["evaluate", *BASE, *extra, "--out", str(plan)])
    assert result.exit_code == 0, result.output
    gib = json.loads(plan.read_text())["best"]["predicted"]["memory_gib"]
    return {k: gib[k] * 2**30 for k in STATES}


def _predicted_and_measured(tmp_path: Path, name: str, *extra: str) -> tuple[dict, dict]:
    plan, out = tmp_path / f"{name}.json", tmp_path / f"{name}.out.json"
    predicted = _predicted(plan, *extra)
    proc = subprocess.run([sys.executable, "-m", "planner.validate.dryrun", str(plan), str(out), "0"], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return predicted, json.loads(out.read_text())


@pytest.mark.slow
def test_fsdp2_offload_keeps_every_model_state_on_the_host(tmp_path):
    """CPUOffloadPolicy: no parameter, gradient or optimizer byte stays on the device (the cost
    model says 0, the probe finds 0), and the host holds what the device held without offload
    (fp32 shards 4 + 4 + 8 bytes per element over dp 2), within 2%."""
    off, measured = _predicted_and_measured(tmp_path, "offload", *DP2, "--offload")
    base = _predicted(tmp_path / "base.json", *DP2)
    assert all(off[k] == 0 and measured[k] == 0 for k in STATES)
    assert measured["host"] == pytest.approx(sum(base.values()), rel=0.02)


@pytest.mark.slow
@pytest.mark.parametrize("layout", [DP2, TP2_DP2_SP], ids=["dp2", "tp2-dp2-sp"])
def test_lora_holds_adapter_grads_and_states_only(tmp_path, layout):
    """LoRA rank 8 on q, k, v, o: frozen fp32 weights plus adapters as parameters; gradients
    (4 B) and AdamW states (8 B) of the adapters alone, r·(d_in + d_out) per matrix, split under
    tp as the projection is (q, k, v: B split, A whole; o: A split, B whole); each within 2%."""
    predicted, measured = _predicted_and_measured(tmp_path, "lora", *layout, "--lora-rank", "8")
    for k in STATES:
        assert predicted[k] == pytest.approx(measured[k], rel=0.02), k
    assert measured["optimizer"] == pytest.approx(2 * measured["grads"], rel=1e-6)
    assert measured["grads"] < measured["params"] / 20
