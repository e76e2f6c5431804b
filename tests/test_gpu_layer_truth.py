"""``benchmarks/gpu_layer_truth.py`` on the CPU (its --quick toy shape): it runs end to end and writes a
layer record the device readers take, with every kernel's forward, input- and weight-gradient times."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))

pytestmark = pytest.mark.slow


def test_the_cpu_run_writes_a_layer_record_with_each_gemm_pass_and_a_sustained_record(tmp_path):
    import gpu_layer_truth

    assert gpu_layer_truth.main(["--device", "cpu", "--quick", "--out-dir", str(tmp_path), "--sustained-s", "0.1"]) == 0
    (layers,) = tmp_path.glob("layer_truth-cpu-*.json")
    (sustained,) = tmp_path.glob("sustained-cpu-*.json")
    record = json.loads(layers.read_text())
    row = record["rows"][0]
    assert set(row["gemm"]) == {"qkv", "o", "gate_up", "down"}
    for gemm in row["gemm"].values():
        assert gemm["fwdbwd_ms"] == pytest.approx(gemm["fwd_event_ms"] + gemm["dgrad_event_ms"] + gemm["wgrad_event_ms"])
    assert row["kernel_floor_ms"] > 0 and row["eager_layer_ms"] > 0 and record["square_8192_tflops"] > 0
    loads = json.loads(sustained.read_text())
    assert loads["gemm"] and loads["layers"] and all(s["ms_per_layer"] > 0 for s in loads["layers"])
