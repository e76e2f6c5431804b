"""The profiler for real: ``autoplan profile --quick`` under torchrun with 2 gloo processes.

One launch per test session (the ``quick_profile`` fixture of tests/conftest.py, which the quick
GPU-truth run of tests/test_gpu_truth.py reads too); every test reads its output.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hardware_specs import load_node
from profiles import HardwareProfile, load_profile
from profiles.fit import COLLECTIVE_OPS
from profiles.schema import MEMORY_KERNELS
from profiles.shapes import make_plan

pytestmark = pytest.mark.torchrun


class Run:
    def __init__(self, proc: subprocess.CompletedProcess[str], path: Path) -> None:
        self.proc, self.path = proc, path
        self.profile: HardwareProfile | None = load_profile(path) if proc.returncode == 0 else None


@pytest.fixture(scope="module")
def quick_run(quick_profile: tuple[subprocess.CompletedProcess[str], Path]) -> Run:
    return Run(*quick_profile)


def test_quick_profile_command_succeeds_and_writes_a_valid_profile(quick_run: Run) -> None:
    assert quick_run.proc.returncode == 0, quick_run.proc.stderr[-3000:]
    p = quick_run.profile
    assert p is not None and p.device_type == "cpu"
    prov = p.provenance
    assert (prov["num_devices"], prov["num_nodes"], prov["backend"]) == (2, 1, "gloo")
    assert prov["threads_per_process"] == 1 and prov["mode"] == "quick"
    assert prov["command"] == f"autoplan profile --device cpu --nproc 2 --out {quick_run.path} --quick"
    for key in ("torch_version", "device_name", "date", "hosts", "platform"):
        assert prov[key], key


def test_quick_profile_measured_every_planned_point(quick_run: Run) -> None:
    p = quick_run.profile
    assert p is not None
    plan = make_plan("cpu", quick=True)
    for dtype in ("fp32", "bf16"):
        assert sorted((q.m, q.n, q.k) for q in p.gemm[dtype].points) == sorted(plan.gemm_shapes)
        assert len(p.attention[dtype].points) == len(plan.attention_shapes)
    assert set(p.memory) == set(MEMORY_KERNELS)
    assert {c.key for c in p.collectives} == {(op, 2, 2, 1) for op in COLLECTIVE_OPS}
    for curve in p.collectives:
        assert curve.sizes_bytes == plan.collective_sizes_bytes
        assert all(a <= b for a, b in zip(curve.smoothed_time_s, curve.smoothed_time_s[1:]))


def _cpu_flags() -> set[str]:
    """This CPU's flags from /proc/cpuinfo (empty where it cannot be read)."""
    try:
        return set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return set()


def _native_cpu_dtype(dtype: str) -> bool:
    """Whether this CPU has instructions for ``dtype`` GEMMs."""
    flags = {"bf16": ("avx512_bf16", "amx_bf16"), "fp16": ("avx512_fp16", "amx_fp16")}.get(dtype, ())
    return bool(_cpu_flags() & set(flags))


AMX_OVER_DATASHEET = 16
"""How far AMX tiles can run 16-bit GEMMs past ``hardware_specs/data/cpu.toml``'s bf16 figure, which
is 2 x 256-bit FMA doubled by VDPBF16PS (64 FLOP/cycle): an AMX unit retires 1024 bf16 or fp16
FLOP/cycle per core (Intel's optimization reference manual, AMX chapter), 16x that. The shipped
file describes the AMD machines this project first ran on; some machines of this class are
Sapphire Rapids Xeons with ``amx_bf16``."""


def _has_amx(dtype: str) -> bool:
    return {"bf16": "amx_bf16", "fp16": "amx_fp16"}.get(dtype) in _cpu_flags()


def test_measured_rates_are_physically_plausible(quick_run: Run) -> None:
    """Units check: achieved rates sit between 1% and 300% of this core's datasheet peak (turbo
    clocks and noise allow a little over 100%; a seconds/milliseconds slip would be 1000x off), or
    of its AMX peak where the CPU has AMX for that dtype (``AMX_OVER_DATASHEET``)."""
    p = quick_run.profile
    assert p is not None
    spec = load_node("cpu").hardware
    for dtype, table in p.gemm.items():
        ratio = table.peak_flops_per_s() / spec.peak_flops(dtype)
        # bf16/fp16 run natively only with AVX-512 BF16/FP16 or AMX; without them PyTorch converts
        # each element and runs one to two orders slower, so only the upper bound is a units check.
        low = 0.01 if dtype == "fp32" or _native_cpu_dtype(dtype) else 0.0
        high = 3.0 * (AMX_OVER_DATASHEET if _has_amx(dtype) else 1)
        assert low < ratio < high, (dtype, ratio)
    bandwidth = p.memory_bandwidth_bytes_per_s()
    assert bandwidth is not None and 1e8 < bandwidth < 1e12
    for curve in p.collectives:
        # A message can never beat the memory bus: bus bandwidth stays below 10x the copy rate.
        assert 0 < curve.peak_bus_bandwidth_bytes_per_s() < 10 * bandwidth, curve.op
        assert 0 < curve.median_time_s[0] < 0.1, curve.op  # a 4 KiB message takes under 100 ms


def test_summary_table_reports_compute_and_bus_bandwidth(quick_run: Run) -> None:
    out = quick_run.proc.stdout
    assert "TFLOP/s" in out and "GB/s" in out
    for op in COLLECTIVE_OPS:
        assert op in out
    assert f"wrote {quick_run.path}" in out
