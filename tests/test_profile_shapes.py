"""What the harness measures: transformer GEMM shapes, group layouts, sizes (pure, no torch)."""

from __future__ import annotations

import pytest

from profiles.shapes import (LAYER_FAMILIES, backward_gemms, fit_family, fit_to_memory, group_layouts,
                             make_plan)


def test_llama3_8b_layer_gemms_by_hand() -> None:
    llama3_8b = LAYER_FAMILIES[2]
    # QKV: n = q 4096 + 2 x (8 kv heads x 128) = 6144; gated MLP up+gate: n = 2 x 14336.
    assert llama3_8b.forward_gemms(512) == [(512, 6144, 4096), (512, 4096, 4096),
                                            (512, 28672, 4096), (512, 4096, 14336)]
    # Backward of (m, n, k): input grad (m, k, n), weight grad (k, n, m).
    assert backward_gemms((512, 6144, 4096)) == [(512, 4096, 6144), (4096, 6144, 512)]


def test_families_too_big_for_the_budget_are_scaled_by_powers_of_two() -> None:
    llama3_70b = LAYER_FAMILIES[3]
    scaled = fit_family(llama3_70b, 512, budget_flops=2e9)
    factor = llama3_70b.hidden // scaled.hidden
    assert factor & (factor - 1) == 0 and factor > 1
    assert max(2 * m * n * k for m, n, k in scaled.forward_gemms(512)) <= 2e9
    # One power of two less would not fit.
    bigger = llama3_70b.scaled(factor // 2)
    assert max(2 * m * n * k for m, n, k in bigger.forward_gemms(512)) > 2e9


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_plans_step_sizes_by_sqrt2_from_4_kib_and_quick_is_smaller(device: str) -> None:
    """Full: √2 steps (each within a 256 B rounding of 4 KiB·2^(k/2), the powers of two exact);
    quick: powers of two."""
    quick, full = make_plan(device, quick=True), make_plan(device, quick=False)
    sizes = quick.collective_sizes_bytes
    assert sizes[0] == 4096 and all(b == 2 * a for a, b in zip(sizes, sizes[1:]))
    sizes = full.collective_sizes_bytes
    assert sizes[0] == 4096 and sizes[::2] == tuple(4096 * 2**k for k in range(len(sizes[::2])))
    for k, size in enumerate(sizes):
        assert abs(size - 4096 * 2 ** (k / 2)) <= 128 and size % 256 == 0
    for plan in (quick, full):
        assert plan.gemm_shapes and plan.attention_shapes and plan.memory_sizes_bytes
    assert len(quick.gemm_shapes) < len(full.gemm_shapes)
    assert quick.collective_sizes_bytes[-1] < full.collective_sizes_bytes[-1]
    assert set(quick.attention_shapes) <= set(full.attention_shapes)


def test_fit_to_memory_drops_buffers_above_a_sixteenth_of_memory() -> None:
    plan = fit_to_memory(make_plan("cuda", quick=False), 16 * 2**30)
    assert max(plan.collective_sizes_bytes) == 2**30 and max(plan.memory_sizes_bytes) <= 2**30


def test_group_layouts_on_one_node() -> None:
    (only,) = group_layouts(2, 2)
    assert (only.num_ranks, only.ranks_per_node, only.num_nodes, only.groups) == (2, 2, 1, ((0, 1),))


def test_group_layouts_on_two_nodes_of_eight() -> None:
    layouts = group_layouts(16, 8)
    assert [(x.num_ranks, x.ranks_per_node, x.num_nodes) for x in layouts] == [
        (2, 1, 2), (2, 2, 1), (4, 2, 2), (4, 4, 1), (8, 4, 2), (8, 8, 1), (16, 8, 2)]
    for layout in layouts:
        members = sorted(r for g in layout.groups for r in g)
        assert members == list(range(16))  # a partition: every rank in exactly one group
        assert all(len(g) == layout.num_ranks for g in layout.groups)
        nodes_per_group = {len({r // 8 for r in g}) for g in layout.groups}
        assert nodes_per_group == {layout.num_nodes}


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_gpu_plans_hold_tp_sharded_layer_gemms(tp: int) -> None:
    """Megatron TP splits QKV and MLP-up by columns (n / tp) and attention-out and MLP-down by
    rows (k / tp); the hidden size stays whole. Llama 3 70B QKV at 4096 tokens: n = 10240 / tp."""
    shapes = set(make_plan("cuda", quick=False).gemm_shapes)
    assert (4096, 10240 // tp, 8192) in shapes       # 70B QKV
    assert (4096, 8192, 8192 // tp) in shapes        # 70B attention output
    assert (4096, 4096, 14336 // tp) in shapes       # 8B MLP down
    if tp == 8:  # the quick plan scales the 70B family at tp 2 down to its smaller budget
        assert (4096, 10240 // tp, 8192) in set(make_plan("cuda", quick=True).gemm_shapes)
