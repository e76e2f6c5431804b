"""The branch-and-bound search returns exactly what brute force returns, on many small cases."""

import random
from dataclasses import replace

import pytest

from costmodels.estimate import CostModel
from costmodels.job import Job
from costmodels.layout import Layout, check_layout
from costmodels.presets import load_model
from costmodels.training import TrainingSpec
from hardware_specs import load_node, make_cluster
from planner.search.brute_force import solve_brute_force
from costmodels.runtimes import CONVENTIONS
from planner.search.solve import solve
from planner.search.space import SearchOptions, all_layouts


def _case(seed):
    rng = random.Random(seed)
    model = load_model(rng.choice(["tiny-llama", "tiny-gpt", "tiny-mixtral", "llama2-7b", "gpt3-1.3b"]))
    gpus = rng.choice([1, 2, 4, 8])
    hardware = rng.choice(["a100-sxm-40gb", "h100-sxm-80gb", "l40s", "v100-sxm-32gb"])
    training = TrainingSpec(global_batch_size=rng.choice([4, 8, 16]), seq_len=rng.choice([256, 512, 2048]),
                            precision="fp16" if hardware.startswith("v100") else rng.choice(["bf16", "fp32"]),
                            optimizer=rng.choice(["adamw", "sgd"]), attention=rng.choice(["fused", "eager"]),
                            runtime=rng.choice(["megatron", "torch"]))
    cluster = make_cluster(load_node(hardware), gpus, rng.choice([None, 2, 4]) if gpus >= 4 else None)
    memory_fraction = rng.choice([0.02, 0.1, 0.5, 0.95])
    return model, training, cluster, memory_fraction


@pytest.mark.parametrize("seed", range(30))
def test_search_equals_brute_force(seed):
    model, training, cluster, fraction = _case(seed)
    options = SearchOptions()
    fast = solve(CostModel(Job(model=model, training=training, cluster=cluster, memory_fraction=fraction,
                                  convention=CONVENTIONS[training.runtime])), cluster.num_gpus,
                 cluster.gpus_per_node, options, top_k=4)
    slow = solve_brute_force(CostModel(Job(model=model, training=training, cluster=cluster, memory_fraction=fraction,
                                              convention=CONVENTIONS[training.runtime])), cluster.num_gpus,
                             cluster.gpus_per_node, options, top_k=4)
    assert [b.layout for b in fast.ranked] == [b.layout for b in slow.ranked]
    assert [b.step_time_s for b in fast.ranked] == [b.step_time_s for b in slow.ranked]
    assert fast.tied_in_mesh == slow.tied_in_mesh  # each mesh's plan is its simplest within the tie band
    assert fast.num_candidates == slow.num_candidates
    assert sum(fast.rejected.values()) + len(fast.ranked) == fast.num_candidates
    assert bool(fast.closest_misses) == bool(slow.closest_misses)


@pytest.mark.parametrize("seed", [0, 11])
def test_pairs_passed_over_by_memory_hold_no_plan(seed, monkeypatch):
    # llama2-7b on 8 GPUs with a tenth of their memory: most (group, state) pairs of a visited mesh
    # have no member whose memory floor fits, and are passed over before their pipeline floor
    import planner.search.solve as search_solve
    from planner.search import groups

    passed_over = []

    def counting_pairs(*args, **kwargs):
        for pair in groups.pairs(*args, **kwargs):
            passed_over.append(pair.too_big)
            yield pair

    monkeypatch.setattr(search_solve, "pairs", counting_pairs)
    model, training, cluster, fraction = _case(seed)
    cm = lambda: CostModel(Job(model=model, training=training, cluster=cluster, memory_fraction=fraction,
                               convention=CONVENTIONS[training.runtime]))
    fast = solve(cm(), cluster.num_gpus, cluster.gpus_per_node, SearchOptions(), top_k=4)
    slow = solve_brute_force(cm(), cluster.num_gpus, cluster.gpus_per_node, SearchOptions(), top_k=4)
    assert sum(passed_over) > 100 and not all(passed_over)
    assert [b.layout for b in fast.ranked] == [b.layout for b in slow.ranked]
    assert fast.tied_in_mesh == slow.tied_in_mesh
    assert sum(fast.rejected.values()) + len(fast.ranked) == fast.num_candidates == slow.num_candidates


def _meshes_passed_to(monkeypatch, name: str) -> set:
    """The (dp, tp, pp, cp, ep) of every mesh the search passes to its function ``name`` (a mesh floor)."""
    import planner.search.solve as search_solve

    seen, function = set(), getattr(search_solve, name)

    def recording(cost_model, mesh, *args):
        seen.add((mesh.dp, mesh.tp, mesh.pp, mesh.cp, mesh.ep))
        return function(cost_model, mesh, *args)

    monkeypatch.setattr(search_solve, name, recording)
    return seen


def test_meshes_whose_model_states_cannot_fit_are_never_floored(monkeypatch):
    # llama2-7b on 8 GPUs with 35% of their memory (about 24 GiB), without optimizer offload and with ZeRO-1
    # at most under a pipeline (Megatron's): the model states of tp·pp = 2 with pp = 2 (7e9 / 2 · 18 B / 4
    # at best, 31.5 GB) pass it whatever the schedule; those meshes are counted as memory before any layer
    # of them is costed
    floored = _meshes_passed_to(monkeypatch, "_mesh_floor_s")
    model, training = load_model("llama2-7b"), TrainingSpec(global_batch_size=8, seq_len=512, runtime="megatron")
    cluster, fraction = make_cluster(load_node("a100-sxm-80gb"), 8), 0.35
    options = SearchOptions(allow_offload=False, pipelined_zero_stages=(0, 1))
    cm = lambda: CostModel(Job(model=model, training=training, cluster=cluster, memory_fraction=fraction,
                               convention=CONVENTIONS[training.runtime]))
    fast = solve(cm(), cluster.num_gpus, cluster.gpus_per_node, options, top_k=4)
    slow = solve_brute_force(cm(), cluster.num_gpus, cluster.gpus_per_node, options, top_k=4)
    model_cm, states_fit = cm(), set()
    every_mesh = set()
    for layout in all_layouts(model, training, cluster.num_gpus, cluster.gpus_per_node, options):
        mesh = (layout.dp, layout.tp, layout.pp, layout.cp, layout.ep)
        every_mesh.add(mesh)
        if model_cm.model_state_peak_bytes(layout) <= model_cm.capacity_bytes:
            states_fit.add(mesh)
    assert floored and every_mesh - states_fit and not floored & (every_mesh - states_fit)
    assert [b.layout for b in fast.ranked] == [b.layout for b in slow.ranked]
    assert sum(fast.rejected.values()) + len(fast.ranked) == fast.num_candidates == slow.num_candidates


def test_dense_meshes_whose_ring_exchanges_alone_lose_are_never_floored(monkeypatch):
    # llama2-7b at 16,384 tokens on 16 H100s: the meshes of 16 CP ranks, and of 8 with tp 2, move their
    # K/V around rings of 15 and 7 steps per layer (the latter across nodes), whose transfers alone
    # (``bounds.context_parallel_floor_s``) pass the cutoff the fast meshes set; those meshes are cut
    # before any layer of theirs is costed
    from costmodels.bounds import context_parallel_floor_s

    floored, cp_floored = (_meshes_passed_to(monkeypatch, name) for name in ("_mesh_floor_s", "_cp_floor_s"))
    model, training = load_model("llama2-7b"), TrainingSpec(global_batch_size=16, seq_len=16384, runtime="megatron")
    cluster = make_cluster(load_node("h100-sxm-80gb"), 16)
    options = SearchOptions(allow_offload=False)
    cm = lambda: CostModel(Job(model=model, training=training, cluster=cluster, convention=CONVENTIONS["megatron"]))
    fast = solve(cm(), cluster.num_gpus, cluster.gpus_per_node, options, top_k=3)
    slow = solve_brute_force(cm(), cluster.num_gpus, cluster.gpus_per_node, options, top_k=3)
    assert [b.layout for b in fast.ranked] == [b.layout for b in slow.ranked]
    assert sum(fast.rejected.values()) + len(fast.ranked) == fast.num_candidates == slow.num_candidates
    unfloored = cp_floored - floored
    assert unfloored and cp_floored & floored  # some CP meshes cut on it, some not
    assert all(mesh[3] > 1 for mesh in cp_floored)
    slowest_kept = max(b.step_time_s for b in fast.ranked)
    model_cm = cm()
    for layout in all_layouts(model, training, cluster.num_gpus, cluster.gpus_per_node, options):
        if (layout.dp, layout.tp, layout.pp, layout.cp, layout.ep) in unfloored:
            assert context_parallel_floor_s(model_cm, layout) <= model_cm.estimate(layout).step_time_s
            assert model_cm.estimate(layout).step_time_s > slowest_kept or not model_cm.estimate(layout).fits


@pytest.mark.parametrize("runtime,fraction", [("megatron", 0.5), ("megatron", 0.95), ("megatron-bridge", 0.5),
                                              ("deepspeed", 0.5)])
def test_micro_batch_sizes_left_out_hold_no_layout_that_passes_its_memory_floor(runtime, fraction):
    # llama2-7b at 8192 tokens, 64 sequences on 8 H100s, in each runtime's own space: the micro-batch
    # sizes ``micro_batch_sizes_that_may_fit`` leaves out of a mesh are those where every layout, with
    # every state whose model states may fit, passes the capacity on its memory floor
    from costmodels.capabilities import Narrowing, capabilities
    from planner.search.floors import MemoryFloors, micro_batch_sizes_that_may_fit
    from planner.search.groups import states_that_may_fit
    from planner.search.runtime_space import search_options
    from planner.search.space import (ep_overlap_values, mesh_choices, pipeline_choices, schedule_choices,
                                      sequence_parallel_values, state_choices)

    model, training = load_model("llama2-7b"), TrainingSpec(global_batch_size=64, seq_len=8192, runtime=runtime)
    cluster = make_cluster(load_node("h100-sxm-80gb"), 8)
    cm = CostModel(Job(model=model, training=training, cluster=cluster, memory_fraction=fraction,
                       convention=CONVENTIONS[runtime]))
    options = search_options(capabilities(runtime), Narrowing(), "cuda")
    left_out = kept = 0
    for mesh in mesh_choices(model, training, 8, 8, options):
        scheds = schedule_choices(mesh, model, training, options)
        states = states_that_may_fit(cm, mesh, state_choices(mesh, 8, options, model, training), scheds)
        if not states:
            continue
        sizes = micro_batch_sizes_that_may_fit(cm, mesh, states, pipeline_choices(mesh, model, training, options),
                                               options.recompute_modes, sequence_parallel_values(mesh, training),
                                               ep_overlap_values(mesh, model, options))
        floors = MemoryFloors(cm, mesh)
        for sched in scheds:
            if sched.micro_batch_size in sizes:
                kept += 1
                continue
            left_out += 1
            assert all(floors.too_big(state, sched) for state in states), (mesh, sched)
    assert left_out and kept


def test_when_no_model_states_fit_the_closest_misses_are_still_reported():
    # llama2-7b on 2 GPUs with 2% of their memory: no mesh's model states fit, so no mesh is floored
    # or visited; the misses come from the meshes left before their floor
    model, training = load_model("llama2-7b"), TrainingSpec(global_batch_size=8, seq_len=512)
    cluster = make_cluster(load_node("a100-sxm-40gb"), 2)
    cm = CostModel(Job(model=model, training=training, cluster=cluster, memory_fraction=0.02))
    layouts = list(all_layouts(model, training, 2, 2, SearchOptions()))
    assert all(cm.model_state_peak_bytes(layout) > cm.capacity_bytes for layout in layouts)
    result = solve(cm, 2, 2, SearchOptions(), top_k=3)
    assert not result.ranked and result.rejected == {"memory": len(layouts)}
    assert len(result.closest_misses) == 3
    assert all(not miss.fits and miss.layout in layouts for miss in result.closest_misses)


@pytest.mark.parametrize("seed", [5, 7, 10, 13, 16, 29, 33, 35])
def test_search_equals_brute_force_with_uneven_layers(seed):
    # 7 or 11 layers: interleaved layouts whose chunks cannot be equal (balanced to within one layer)
    model, training, cluster, fraction = _case(100 + seed)
    model = replace(model, num_layers=random.Random(seed).choice([5, 6, 7, 9, 11]))
    assert any(L.schedule == "interleaved" and model.num_layers % L.num_chunks
               for L in all_layouts(model, training, cluster.num_gpus, cluster.gpus_per_node, SearchOptions()))
    cm = lambda: CostModel(Job(model=model, training=training, cluster=cluster, memory_fraction=fraction,
                               convention=CONVENTIONS[training.runtime]))
    fast = solve(cm(), cluster.num_gpus, cluster.gpus_per_node, SearchOptions(), top_k=4)
    slow = solve_brute_force(cm(), cluster.num_gpus, cluster.gpus_per_node, SearchOptions(), top_k=4)
    assert [b.layout for b in fast.ranked] == [b.layout for b in slow.ranked]
    assert [b.step_time_s for b in fast.ranked] == [b.step_time_s for b in slow.ranked]
    assert fast.num_candidates == slow.num_candidates


def test_every_candidate_is_valid_and_meets_the_global_batch():
    model, training = load_model("tiny-mixtral"), TrainingSpec(global_batch_size=16, seq_len=256)
    n = 0
    for layout in all_layouts(model, training, 8, 8, SearchOptions()):
        check_layout(layout, model, training, 8, 8)
        assert Layout.from_dict(layout.to_dict()) == layout  # make_layout skips the field checks; they pass
        assert layout.dp * layout.micro_batch_size * layout.num_microbatches == 16
        n += 1
    assert n > 500


def test_search_prunes_most_of_a_large_space():
    model, training = load_model("llama3-70b"), TrainingSpec(global_batch_size=256, seq_len=4096)
    cluster = make_cluster(load_node("h100-sxm-80gb"), 32)
    result = solve(CostModel(Job(model=model, training=training, cluster=cluster)), 32, 8, SearchOptions(), top_k=3)
    # about 20% are costed in full (the memory floors and time bounds cut the rest); "most" is
    # three quarters, with room for the floors to move with the memory model
    assert result.ranked and result.num_evaluated < result.num_candidates / 4


@pytest.mark.parametrize("gpus,model", [(2, "tiny-llama"), (4, "tiny-gpt")])
def test_search_equals_brute_force_with_a_measured_profile(gpus, model):
    # With measured collective curves the alpha-beta identities behind the sequence-parallel
    # dominance rule need not hold, so the search must keep those candidates.
    from pathlib import Path

    from profiles import load_profile

    profile = load_profile(Path(__file__).resolve().parents[1] / "profiles/data/cpu-gloo-2proc.json")
    training = TrainingSpec(global_batch_size=8, seq_len=128, precision="fp32")
    cluster = make_cluster(load_node("cpu"), gpus)
    make = lambda: CostModel(Job(model=load_model(model), training=training, cluster=cluster, profile=profile))  # noqa: E731
    fast = solve(make(), gpus, cluster.gpus_per_node, SearchOptions(), top_k=3)
    slow = solve_brute_force(make(), gpus, cluster.gpus_per_node, SearchOptions(), top_k=3)
    assert [b.layout for b in fast.ranked] == [b.layout for b in slow.ranked]


def test_search_leaves_the_garbage_collector_as_it_found_it(monkeypatch):
    # solve pauses the cyclic collector while it searches (search.collector_paused): back on after,
    # also when the search raises, and still off when the caller had it off
    import gc

    import planner
    from planner.search import solve as search

    job = dict(model="tiny-llama", hardware="cpu", gpus=2, global_batch=8, seq_len=128)
    assert gc.isenabled()
    planner.plan(**job)
    assert gc.isenabled()
    gc.disable()
    try:
        planner.plan(**job)
        assert not gc.isenabled()
    finally:
        gc.enable()

    def fail(*args, **kwargs):
        assert not gc.isenabled()
        raise RuntimeError("stop")

    monkeypatch.setattr(search, "_solve", fail)
    with pytest.raises(RuntimeError):
        search.solve(None, 2, 2, SearchOptions(), top_k=1)
    assert gc.isenabled()


@pytest.mark.parametrize("model_name,gpus", [("tiny-llama", 16), ("tiny-mixtral", 16), ("tiny-gpt", 8)])
def test_search_equals_brute_force_on_nvlink_domains_of_several_nodes(model_name, gpus):
    # GB200 trays of 2 (--gpus-per-node 2) in NVLink domains of 18 x 2 = 36 GPUs, cut to 6 here: with
    # 16 GPUs the domains hold 6 + 6 + 4 ranks, so tp 4 and ep groups straddle domains
    node = replace(load_node("gb200-nvl72"), gpus_per_node=2, nodes_per_nvlink_domain=3)
    cluster = make_cluster(node, gpus)
    assert cluster.nvlink_domain_gpus == 6 and cluster.group_placement(4, 1) == (2, 2)
    training = TrainingSpec(global_batch_size=16, seq_len=512, precision="bf16", optimizer="adamw")
    cm = lambda: CostModel(Job(model=load_model(model_name), training=training, cluster=cluster, memory_fraction=0.5,
                               convention=CONVENTIONS[training.runtime]))
    fast = solve(cm(), gpus, cluster.nvlink_domain_gpus, SearchOptions(), top_k=4)
    slow = solve_brute_force(cm(), gpus, cluster.nvlink_domain_gpus, SearchOptions(), top_k=4)
    assert fast.ranked and [b.layout for b in fast.ranked] == [b.layout for b in slow.ranked]
    assert [b.step_time_s for b in fast.ranked] == [b.step_time_s for b in slow.ranked]
    assert fast.num_candidates == slow.num_candidates


@pytest.mark.parametrize("model,gpus,batch", [("tiny-llama", 8, 16), ("llama2-7b", 16, 64)])
def test_meshes_that_cannot_reach_the_threshold_are_cut_there_with_the_same_plans(monkeypatch, model, gpus, batch):
    """A mesh's floor, and a visit's remaining pairs, are held to the threshold where the mesh has no plan
    at or below it (``Standings.whole_cutoff_s``), not to the band above it: the same plans, in the same
    order and with the same ties, from fewer layouts costed than with the band's cutoff everywhere."""
    import planner
    from planner.search.standings import Standings

    job = dict(model=model, hardware="h100-sxm-80gb", gpus=gpus, global_batch=batch, seq_len=512 if gpus == 8 else 4096)
    cut = planner.plan(**job)
    monkeypatch.setattr(Standings, "whole_cutoff_s", Standings.cutoff_s)
    banded = planner.plan(**job)
    plans = lambda report: [(p.layout, p.step_time_s, p.peak_memory_bytes) for p in (report.best, *report.candidates)]
    assert plans(cut) == plans(banded) and cut.search["num_tied"] == banded.search["num_tied"]
    assert cut.search["evaluated"] < banded.search["evaluated"]
    assert cut.search["space_size"] == banded.search["space_size"] == sum(cut.rejected.values()) + len(plans(cut))
