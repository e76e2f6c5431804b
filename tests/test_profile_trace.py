"""``autoplan profile import-trace``: a PyTorch profiler trace of one step -> rates, curves, overlap.

tests/data/trace/tiny-1layer-dp2-step.json.gz was recorded on this machine by
``torchrun --standalone --nproc-per-node 2 -m planner.launch.torchjob.trace_step --plan
tests/data/trace/tiny-1layer-dp2-plan.json --out step.json`` (the generated job's own step: a
1-layer Llama-style model of tests/data/trace/tiny-1layer.json, dp 2 with FSDP2 ZeRO-3, gloo,
CPU activities), then gzipped. The CUDA trace is hand-made below to exercise the kernel-name paths.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from planner.cli import main
from profiles import load_profile
from profiles.trace_events import Op, TraceError
from profiles.trace_import import achieved_overlap, import_trace, parse_degrees

STEP = Path(__file__).parent / "data" / "trace" / "tiny-1layer-dp2-step.json.gz"


def _raw_totals_s() -> dict[str, float]:
    """The trace's own per-op times, summed straight from the JSON (independent of the importer)."""
    events = json.loads(gzip.decompress(STEP.read_bytes()))["traceEvents"]
    total: dict[str, float] = {}
    for e in events:
        name = e.get("name", "")
        kind = {"aten::mm": "gemm", "gloo:all_gather": "collective:all_gather",
                "gloo:all_reduce": "collective:all_reduce"}.get(name)
        if name.startswith("aten::_scaled_dot_product_flash_attention_for_cpu"):
            kind = "attention"
        if kind and e.get("ph") == "X":
            total[kind] = total.get(kind, 0.0) + e["dur"] * 1e-6
    return total


def test_import_of_the_jobs_own_step_reproduces_the_traces_op_times_within_5_percent() -> None:
    result = import_trace(str(STEP), degrees={"dp": 2})
    raw = _raw_totals_s()
    assert set(raw) == {"gemm", "attention", "collective:all_gather", "collective:all_reduce"}
    for kind, seconds in raw.items():
        assert result.trace_time_s[kind] == pytest.approx(seconds, rel=1e-9), kind   # nothing missed or doubled
        assert result.reproduced_time_s[kind] == pytest.approx(seconds, rel=0.05), kind


def test_rates_and_curves_of_the_step() -> None:
    result = import_trace(str(STEP), degrees={})          # group size 2 read from distributedInfo.pg_config
    profile = result.profile
    assert profile.device_type == "cpu" and profile.provenance["source"] == "trace"
    # FSDP2 gathers layer 0's 196,864 fp32 parameters from two shards of 98,432: the full buffer
    # S of the all-gather is 196,864 x 4 bytes (gloo's range shows the 98,432-element input).
    gather = profile.collective_curve("all_gather", 2, 2, 1)
    assert gather is not None and gather.source == "trace" and 196864 * 4 in gather.sizes_bytes
    # gloo runs FSDP2's reduce-scatter as an all-reduce of the full buffer.
    assert profile.collective_curve("all_reduce", 2, 2, 1) is not None
    assert sum(r["calls"] for r in result.gemm_rates) == 24          # the step's aten::mm calls
    (attention,) = profile.attention["fp32"].points
    assert (attention.batch, attention.num_heads, attention.seq_len, attention.head_dim) == (2, 4, 64, 32)
    assert 0.0 <= result.overlap["fraction"] <= 1.0


def test_cli_writes_a_profile_that_loads(tmp_path: Path) -> None:
    out = tmp_path / "trace.json"
    result = CliRunner().invoke(main, ["profile", "import-trace", str(STEP), "--layout", "dp=2",
                                       "--model", "tiny-llama", "--out", str(out)], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    assert "overlap" in result.output and "GEMM rate by shape" in result.output
    loaded = load_profile(out)
    assert {c.source for c in loaded.collectives} == {"trace"} and "fp32" in loaded.gemm
    assert loaded.provenance["model"] == "tiny-llama" and loaded.provenance["layout"] == "dp=2"


def test_overlap_is_collective_time_covered_by_compute_on_other_lanes() -> None:
    ops = [Op(kind="collective", name="c", start_s=0.0, dur_s=10.0, lane="stream 20"),
           Op(kind="gemm", name="g", start_s=5.0, dur_s=10.0, lane="stream 7"),
           Op(kind="memory", name="m", start_s=6.0, dur_s=1.0, lane="stream 7"),      # inside the GEMM
           Op(kind="memory", name="copy", start_s=1.0, dur_s=1.0, lane="stream 20")]  # comm lane: not compute
    assert achieved_overlap(ops) == {"comm_s": 10.0, "overlapped_s": 5.0, "fraction": 0.5}


def _cuda_trace() -> dict:
    """A hand-made Kineto-shaped CUDA step: a bf16 GEMM, flash attention forward, an elementwise
    kernel on stream 7, and an NCCL all-reduce on stream 20 that overlaps the GEMM for 30 us."""
    cpu, gpu = [], []

    def launch(op: dict, corr: int, kernel: str, stream: int, k_ts: float, k_dur: float) -> None:
        cpu.append(op)
        cpu.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                    "ts": op["ts"] + 1, "dur": 2, "args": {"correlation": corr}})
        gpu.append({"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": stream, "ts": k_ts, "dur": k_dur,
                    "args": {"stream": stream, "correlation": corr, "device": 0}})

    launch({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 5,
            "args": {"Input Dims": [[4096, 8192], [8192, 1024]], "Input type": ["c10::BFloat16", "c10::BFloat16"]}},
           1, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", 7, 100, 100)
    launch({"ph": "X", "cat": "cpu_op", "name": "aten::_flash_attention_forward", "pid": 1, "tid": 1, "ts": 10,
            "dur": 5, "args": {"Input Dims": [[2, 16, 1024, 128], [2, 16, 1024, 128], [2, 16, 1024, 128]],
                               "Input type": ["c10::BFloat16"] * 3}},
           2, "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>, true>(Flash_fwd_params)", 7, 240, 80)
    launch({"ph": "X", "cat": "cpu_op", "name": "aten::add_", "pid": 1, "tid": 1, "ts": 20, "dur": 5, "args": {}},
           3, "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", 7, 320, 10)
    launch({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 30, "dur": 8,
            "args": {"Collective name": "allreduce", "dtype": "BFloat16", "In msg nelems": 4194304,
                     "Out msg nelems": 4194304, "Group size": 8}},
           4, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 20, 170, 60)
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
            "traceEvents": cpu + gpu}


def test_cuda_kernel_names_shapes_sizes_and_overlap(tmp_path: Path) -> None:
    path = tmp_path / "cuda.json"
    path.write_text(json.dumps(_cuda_trace()))
    result = import_trace(str(path), degrees={"tp": 8})
    profile = result.profile
    assert profile.device_type == "cuda" and profile.provenance["device_name"] == "NVIDIA H100 80GB HBM3"
    (gemm,) = profile.gemm["bf16"].points
    assert (gemm.m, gemm.n, gemm.k, gemm.time_s) == (4096, 1024, 8192, pytest.approx(100e-6))
    (attn,) = profile.attention["bf16"].points
    assert (attn.batch, attn.num_heads, attn.seq_len, attn.head_dim) == (2, 16, 1024, 128)
    curve = profile.collective_curve("all_reduce", 8, 8, 1)
    assert curve is not None and curve.sizes_bytes == (4194304 * 2,) and curve.dtype == "bf16"
    assert result.trace_time_s["memory"] == pytest.approx(10e-6)
    # NCCL ran 170..230 us; the GEMM kernel 100..200 us on another stream: 30 of 60 us overlapped.
    assert result.overlap["fraction"] == pytest.approx(0.5)


@pytest.mark.parametrize(("content", "needle"), [
    ("not json at all", "not a JSON Chrome trace"),
    ('{"hello": 1}', "traceEvents"),
    ('{"traceEvents": [{"ph": "X", "name": "aten::add", "cat": "cpu_op", "ts": 0, "dur": 1}]}', "no GEMM"),
])
def test_foreign_traces_are_one_line_errors(tmp_path: Path, content: str, needle: str) -> None:
    path = tmp_path / "t.json"
    path.write_text(content)
    result = CliRunner().invoke(main, ["profile", "import-trace", str(path)])
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1 and needle in result.output


def test_layout_degrees_parse_and_reject_bad_entries() -> None:
    assert parse_degrees("dp=2, tp=4") == {"dp": 2, "tp": 4}
    with pytest.raises(TraceError, match="'xp=2'"):
        parse_degrees("xp=2")


@pytest.mark.torchrun
def test_trace_step_records_the_generated_jobs_step_and_it_imports(tmp_path: Path) -> None:
    """The fixture's recipe, run again: trace_step under torchrun writes a trace the import reads."""
    import os
    import subprocess
    import sys

    plan = Path(__file__).parent / "data" / "trace" / "tiny-1layer-dp2-plan.json"
    out = tmp_path / "step.json"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "planner.launch.torchjob.trace_step", "--plan", str(plan), "--out", str(out)],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"},
                          cwd=Path(__file__).parent.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = import_trace(str(out), degrees={"dp": 2})
    assert result.profile.collective_curve("all_gather", 2, 2, 1) is not None
    assert sum(r["calls"] for r in result.gemm_rates) == 24
