"""Memo keys of the search's memory floors hold every input of what they keep: a value computed
through a memo shared by many layouts equals the value computed afresh."""

import random
from dataclasses import astuple, replace
from itertools import product

import pytest

from costmodels.estimate import CostModel
from costmodels.job import Job
from costmodels.layer_costs import LayerKey
from costmodels.memory_bounds import activation_vector, buffer_vector
from costmodels.presets import load_model
from costmodels.rank_memory import activation_shape
from costmodels.runtimes import CONVENTIONS
from costmodels.training import TrainingSpec
from hardware_specs import load_node, make_cluster
from planner.search.space import SearchOptions, all_layouts


def _job(model_name: str, runtime: str, gpus: int) -> tuple[Job, list]:
    model = load_model(model_name)
    training = TrainingSpec(global_batch_size=16, seq_len=512, runtime=runtime)
    cluster = make_cluster(load_node("h100-sxm-80gb"), gpus, 4)
    job = Job(model=model, training=training, cluster=cluster, convention=CONVENTIONS[runtime])
    layouts = list(all_layouts(model, training, gpus, 4, SearchOptions()))
    return job, random.Random(gpus).sample(layouts, min(300, len(layouts)))


@pytest.mark.parametrize("model,runtime,gpus", [("tiny-llama", "megatron", 8), ("tiny-mixtral", "torch", 8),
                                                ("tiny-llama", "torchtitan", 4)])
def test_memoised_activation_shapes_and_vectors_equal_fresh_ones(model, runtime, gpus):
    job, layouts = _job(model, runtime, gpus)
    shared = CostModel(job)
    # full recomputation of a few layers per stage: its count reads v (``assignment.recomputed_layers``)
    partial = [replace(layout, recompute_num_layers=1) for layout in layouts if layout.recompute == "full"]
    assert any(layout.virtual_stages > 1 for layout in partial)
    # uneven splits of the 4 layers over 2 stages, both ways
    skewed = [replace(layout, layers_per_chunk=split) for layout in layouts
              if layout.pp == 2 and layout.virtual_stages == 1 for split in ((1, 3), (3, 1))]
    assert skewed
    for layout in layouts + partial + skewed:
        fresh = CostModel(job)
        assert activation_shape(shared, layout) == activation_shape(fresh, layout)
        assert activation_vector(shared, layout) == activation_vector(fresh, layout)
        assert shared.peak_memory_bytes(layout) == fresh.peak_memory_bytes(layout)
        assert shared.model_state_peak_bytes(layout) == fresh.model_state_peak_bytes(layout)


def test_tp_overlap_twins_share_their_activations_as_the_memory_floors_key_them():
    # planner.search.floors keeps a schedule choice's activation vector by a key without TP
    # overlap (``floors._acts_key``): the twins' vectors must be equal
    job, _ = _job("tiny-llama", "megatron", 8)
    cm, twins = CostModel(job), 0
    for layout in all_layouts(job.model, job.training, 8, 4, SearchOptions()):
        if layout.tp > 1 and layout.sequence_parallel and not layout.tp_comm_overlap:
            twin = replace(layout, tp_comm_overlap=True)
            assert activation_vector(cm, twin) == activation_vector(CostModel(job), layout)
            twins += 1
    assert twins > 10


@pytest.mark.parametrize("model,runtime,gpus", [("tiny-llama", "megatron", 8), ("tiny-mixtral", "torch", 8),
                                                ("tiny-llama", "torchtitan", 4)])
def test_layouts_that_differ_in_recomputation_alone_share_their_buffers_as_the_memory_floors_key_them(
        model, runtime, gpus):
    # planner.search.floors keeps a layout's buffer vector by a key without recomputation
    # (``floors._buffers_key``): each layout's must equal its twin's without recomputation
    job, layouts = _job(model, runtime, gpus)
    recomputed = [layout for layout in layouts if layout.recompute != "none"]
    assert len({layout.recompute for layout in recomputed}) >= 2
    for layout in recomputed:
        assert buffer_vector(CostModel(job), layout) == buffer_vector(CostModel(job), replace(layout, recompute="none"))


@pytest.mark.parametrize("model,runtime", [("tiny-llama", "megatron"), ("tiny-mixtral", "megatron"),
                                           ("tiny-deepseek", "megatron"), ("tiny-mixtral", "torch")])
def test_layer_forwards_equal_fresh_ones_when_twins_filled_the_shared_compute_memo(model, runtime):
    """``LayerCosts._add_compute`` keeps the GEMMs and attention core by a key without TP overlap, the
    dispatcher or (but under MLA) SP: every layer key's forward, costed after all its twins, equals the
    same key costed on a fresh cost model, field for field."""
    job, _ = _job(model, runtime, 8)
    shared, keys = CostModel(job), []
    for moe in ((False, True) if job.model.moe is not None else (False,)):
        for b, s_local, tp, cp in ((1, 512, 2, 1), (2, 256, 4, 2), (1, 128, 1, 4), (2, 512, 2, 1), (1, 512, 2, 4)):
            for ep, sp, overlap, dispatcher in product((1, 2) if moe else (1,), (False, True) if tp > 1 else (False,),
                                                       (False, True), ("alltoall", "deepep") if moe else ("alltoall",)):
                if sp or not overlap:
                    keys.append(LayerKey(moe=moe, b=b, s_local=s_local, tp=tp, sp=sp, cp=cp, ep=ep,
                                         tp_overlap=overlap, dispatcher=dispatcher))
    computed = [shared.layers.forward(key) for key in keys]
    assert len(shared.layers._compute_memo) < len(keys)  # twins shared their compute
    for key, got in zip(keys, computed):
        assert got == CostModel(job).layers.forward(key), key


def test_dense_core_sums_kept_across_meshes_equal_the_layouts_own():
    """``groups.dense_core_sums`` keeps a dense model's core sums by the mesh's shape and placement, the
    micro-batch size, SP, TP overlap and DualPipe's halving: each (mesh, choice), asked after every
    other, equals ``bounds.core_sums`` of its own layout (up to the rounding of the order in which the
    ranks' pieces add, on a fresh cost model)."""
    from costmodels.bounds import core_sums
    from planner.search.groups import dense_core_sums
    from planner.search.space import make_layout, mesh_choices, schedule_choices, state_choices

    job, _ = _job("tiny-llama", "megatron", 8)
    options = replace(SearchOptions(), schedules=("1f1b", "interleaved", "dualpipe"))
    shared, asked = CostModel(job), []
    for mesh in mesh_choices(job.model, job.training, 8, 4, options):
        state = state_choices(mesh, 4, options, job.model, job.training)[0]
        for sched in schedule_choices(mesh, job.model, job.training, options):  # on its placement, as searched
            asked.append((mesh, state, sched, dense_core_sums(shared.placed(mesh.gpus_per_nvlink_domain), mesh, state,
                                                              sched)))
    assert any(sched.schedule == "dualpipe" for _, _, sched, _ in asked)
    for mesh, state, sched, sums in asked:  # core sums add the ranks' pieces in their order: equal up to rounding
        layout = make_layout(mesh, state, replace(sched, recompute="none"))
        assert sums == core_sums(shared.placed(mesh.gpus_per_nvlink_domain), layout)
        fresh = core_sums(CostModel(job).placed(mesh.gpus_per_nvlink_domain), layout)
        assert all(a == pytest.approx(b, rel=1e-12) for a, b in zip(astuple(sums), astuple(fresh)))
