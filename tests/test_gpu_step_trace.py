"""benchmarks/gpu_step_trace.py: the CPU quick run writes a complete summary, and the trace
reduction (union of kernel intervals, idle gaps) is right on hand-made intervals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_step_trace_summary as summary  # noqa: E402


def _event(name: str, start_us: float, end_us: float, *, kernel: bool = False):
    span = SimpleNamespace(start=start_us, end=end_us, elapsed_us=lambda: end_us - start_us)
    return SimpleNamespace(name=name, time_range=span, self_cpu_time_total=end_us - start_us,
                           device_type="DeviceType.CUDA" if kernel else "DeviceType.CPU")


def test_union_of_kernel_intervals():
    assert summary.merged([(0, 2), (1, 3), (5, 6), (6, 7)]) == [(0, 3), (5, 7)]


def test_gap_is_found_with_its_phase_and_cpu_op():
    """One 10 ms step: kernels busy 0-2 ms and 6-10 ms; the 4 ms gap lies in the optimizer phase
    while aten::mul_ runs on the host."""
    events = [_event("step", 0, 10_000), _event("step/optimizer", 1_000, 9_000),
              _event("aten::mul_", 2_000, 6_000), _event("k1", 0, 2_000, kernel=True),
              _event("k2", 6_000, 10_000, kernel=True)]
    s = summary.summarize(events, num_steps=1)
    assert s["wall_ms_per_step"] == pytest.approx(10.0)
    assert s["device_busy_ms_per_step"] == pytest.approx(6.0)
    assert s["num_kernels_per_step"] == 2
    assert s["gaps"]["count"] == 1 and s["gaps"]["total_ms"] == pytest.approx(4.0)
    (gap,) = s["gaps"]["largest"]
    assert gap["phase"] == "step/optimizer" and gap["cpu_op"] == "aten::mul_"
    assert s["phases"]["optimizer"]["device_idle_ms"] == pytest.approx(4.0)


@pytest.mark.torchrun
def test_cpu_quick_run_writes_a_complete_summary(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu_step_trace.py"), "--device", "cpu", "--quick",
                           "--out-dir", str(tmp_path)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) <= 4 and "step-trace-cpu.json" in files and "step-trace-cpu.md" in files
    record = json.loads((tmp_path / "step-trace-cpu.json").read_text())
    assert {"matmul_allow_tf32", "cudnn_allow_tf32", "float32_matmul_precision"} <= set(record["settings"])
    (row,) = record["layouts"]
    assert set(row["step_ms"]) == {"job", "adamw_for_loop", "adamw_foreach", "no_clip", "fwd_bwd_only", "memory_probe"}
    assert row["optimizer_defaults"]["fused"] is True
    for kind in ("job", "adamw_for_loop"):
        trace = row["traces"][kind]
        assert set(trace["phases"]) == set(summary.PHASES)
        assert trace["wall_ms_per_step"] > 0 and trace["top_cpu_ops"] and trace["sdpa_backends"]
    # the fused step issues one optimizer op where the loop issues about ten per tensor; which of the
    # loop's in-place ops make the top CPU ops (ranked by time) varies with the machine's load
    loop_ops = {op["name"]: op["calls_per_step"] for op in row["traces"]["adamw_for_loop"]["top_cpu_ops"]}
    per_tensor = [loop_ops[name] for name in ("aten::mul_", "aten::add_", "aten::addcmul_", "aten::lerp_",
                                              "aten::div_", "aten::addcdiv_") if name in loop_ops]
    assert per_tensor and max(per_tensor) >= row["num_param_tensors"]
