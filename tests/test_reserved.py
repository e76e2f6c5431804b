"""costmodels/reserved.py: the memory a process holds outside its tensors, as named overhead parts."""

from __future__ import annotations

import pytest

import planner
from costmodels import reserved
from costmodels.layout import Layout
from hardware_specs.units import MIB


def test_nccl_buffers_count_one_communicator_per_group_of_two_or_more_plus_world():
    # dp 4, tp 2, pp 2: three groups plus world; 16 channels x 2 peers x 4 MiB each
    layout = Layout(dp=4, tp=2, pp=2)
    assert reserved.communicator_count(layout) == 4
    assert reserved.nccl_buffer_bytes(layout, 16) == 4 * 16 * 2 * 4 * MIB
    assert reserved.communicator_count(Layout()) == 1


def test_workspaces_are_cublas_and_cublaslt_per_gemm_thread_larger_from_hopper_on():
    # PyTorch defaults: cuBLAS 32 MiB on sm90+ else ':4096:2:16:8' (2 x 4096 KiB + 8 x 16 KiB);
    # cuBLASLt 1024 KiB; one handle each for the forward thread and autograd's device thread
    assert reserved.workspace_bytes(9.0) == 2 * (32 * MIB + 1 * MIB)
    assert reserved.workspace_bytes(8.0) == 2 * (8 * MIB + 128 * 1024 + 1 * MIB)
    assert reserved.workspace_bytes(0.0) == reserved.workspace_bytes(9.0)


def test_fragmentation_holds_one_largest_block_rounded_to_2_mib():
    assert reserved.fragmentation_bytes(100 * MIB, 3 * MIB, 0.1) == pytest.approx(10 * MIB + 4 * MIB)
    assert reserved.fragmentation_bytes(0.0, 4 * MIB, 0.0) == 4 * MIB


def test_overhead_parts_sum_to_the_overhead_and_grow_with_the_groups():
    kwargs = dict(model="llama3-8b", hardware="h100-sxm-80gb", gpus=8, global_batch=16, seq_len=4096)
    alone = planner.evaluate(layout=planner.Layout(dp=8, num_microbatches=2), **kwargs).peak_stage
    split = planner.evaluate(layout=planner.Layout(dp=2, tp=2, pp=2, num_microbatches=8), **kwargs).peak_stage
    for stage in (alone, split):
        names = [name for name, _ in stage.overhead_parts]
        assert names == ["cuda_context", "nccl_buffers", "workspaces", "fragmentation"]
        assert sum(v for _, v in stage.overhead_parts) == pytest.approx(stage.overhead_bytes)
    assert dict(split.overhead_parts)["nccl_buffers"] == 2 * dict(alone.overhead_parts)["nccl_buffers"]


def test_a_layout_fits_only_under_the_usable_memory_over_the_band():
    b = planner.evaluate(model="llama3-8b", hardware="h100-sxm-80gb", gpus=8, global_batch=16, seq_len=4096,
                         layout=planner.Layout(dp=8, num_microbatches=2))
    assert b.memory_band_upper > 0
    assert b.memory_capacity_bytes * (1 + b.memory_band_upper) == pytest.approx(b.memory_usable_bytes)
    assert b.fits == (b.peak_memory_bytes * (1 + b.memory_band_upper) <= b.memory_usable_bytes * (1 + 1e-12))
