"""The search's step-time bounds (costmodels/bounds.py) never exceed what ``estimate`` reports."""

import itertools
import random

import pytest

from costmodels.assumptions import DEFAULT_ASSUMPTIONS
from costmodels.bounds import (bubble_floor_s, mean_floor_s, pipeline_floor_s, state_floor_s, step_time_s,
                               tp_overlap_extra_bytes, tp_overlap_sign)
from costmodels.estimate import CostModel
from costmodels.job import Job
from costmodels.layout import SCHEDULES, Layout, LayoutError, check_layout
from costmodels.memory_bounds import memory_floor_bytes
from costmodels.overlap import exposed_comm_s
from costmodels.pipeline import DUALPIPE
from costmodels.presets import load_model
from costmodels.training import TrainingSpec
from dataclasses import replace
from hardware_specs import load_node, make_cluster
from costmodels.runtimes import CONVENTIONS
from planner.search.space import SearchOptions, all_layouts
from costmodels.layout import ep_overlap_runs

RELATIVE = 1e-12


def _sample(model_name, runtime, gpus, seed, count=150):
    model = load_model(model_name)
    training = TrainingSpec(global_batch_size=16, seq_len=512, runtime=runtime)
    cluster = make_cluster(load_node("h100-sxm-80gb"), gpus, 4)
    cm = CostModel(Job(model=model, training=training, cluster=cluster, convention=CONVENTIONS[runtime]))
    layouts = list(all_layouts(model, training, gpus, 4, SearchOptions()))
    return cm, random.Random(seed).sample(layouts, min(count, len(layouts)))


@pytest.mark.parametrize("model,runtime,gpus", [("tiny-llama", "megatron", 8), ("tiny-mixtral", "torch", 8),
                                                ("tiny-gpt", "megatron", 4)])
def test_floors_lie_below_the_estimate_and_the_fast_step_time_equals_it(model, runtime, gpus):
    # step >= pipeline floor + m · (least data-parallel time per micro-batch) + least tail, for
    # every layout: facts 1 and 2 of costmodels/bounds.py; the fast step time is the same sum
    cm, layouts = _sample(model, runtime, gpus, seed=len(model))
    for layout in layouts:
        step = cm.estimate(layout).step_time_s
        per_mb, tail = state_floor_s(cm, layout)
        assert pipeline_floor_s(cm, layout) + layout.num_microbatches * per_mb + tail <= step * (1 + RELATIVE)
        assert step_time_s(cm, layout) == pytest.approx(step, rel=RELATIVE)
        # the peak from the ranks holding the most and the fewest micro-batches in flight is the peak
        assert cm.peak_memory_bytes(layout) == cm.estimate(layout).peak_memory_bytes
        _assert_memory_floor(cm, layout)


def test_the_pipeline_floor_is_the_step_time_when_nothing_else_costs():
    # one GPU, ZeRO-0, no optimizer time to speak of: with dp = 1 there is no data-parallel term,
    # so step - floor is the optimizer step alone, which the state floor's tail is exactly
    cm, layouts = _sample("tiny-llama", "megatron", 1, seed=3, count=40)
    for layout in layouts:
        step = cm.estimate(layout).step_time_s
        per_mb, tail = state_floor_s(cm, layout)
        assert per_mb == 0.0
        assert pipeline_floor_s(cm, layout) + tail == pytest.approx(step, rel=RELATIVE)


@pytest.mark.parametrize("slowdown", [0.0, 0.1, 1.0, 1.5])
def test_exposed_communication_is_least_at_an_end_of_the_compute_range(slowdown):
    # fact 2 of costmodels/bounds.py: piecewise linear in compute, least at C = 0 (slowdown > 1)
    # or as C grows without bound (slowdown <= 1); pieces = 4, communication 8 s, so 2 s is never hidden
    assumptions = replace(DEFAULT_ASSUMPTIONS, overlap_fraction=0.5, overlap_slowdown=slowdown)
    end = 0.0 if slowdown > 1 else 1e300
    least = exposed_comm_s(8.0, end, 4, assumptions)
    assert least == pytest.approx(2.0 + min(1.0, slowdown) * 6.0)
    for compute_s in (0.0, 1.0, 6.0, 12.0, 13.0, 100.0):
        assert exposed_comm_s(8.0, compute_s, 4, assumptions) >= least


def _grid(schedules, runtime, model_name="tiny-mixtral"):
    """Every valid layout of ``schedules`` on 4 · pp GPUs (dp 2, tp 2) over pp, v, m, ZeRO stage,
    offload, recomputation and ep, with its cost model (one per pp and m, shared by the schedules in
    their order), for a 10-layer model (by default MoE): 10 layers split unevenly over 2 · 2 and
    4 · 2 chunks, the first and last ranks holding the embedding and the head."""
    model = replace(load_model(model_name), num_layers=10)
    for pp, m in itertools.product((2, 4), (4, 8)):
        training = TrainingSpec(global_batch_size=2 * m, seq_len=512, runtime=runtime)
        cluster = make_cluster(load_node("h100-sxm-80gb"), 4 * pp, 8)
        cm = CostModel(Job(model=model, training=training, cluster=cluster, convention=CONVENTIONS[runtime]))
        for v, zero, offload, recompute, ep, schedule in itertools.product(
                (1, 2, 5), (0, 1, 2, 3), (False, True), ("none", "selective", "full"), (1, 2), schedules):
            layout = Layout(dp=2, tp=2, pp=pp, ep=ep, zero_stage=zero, optimizer_offload=offload, micro_batch_size=1,
                            num_microbatches=m, schedule=schedule, virtual_stages=v, recompute=recompute,
                            sequence_parallel=True)
            try:
                check_layout(layout, model, training, 4 * pp, 8)
            except LayoutError:
                continue
            yield cm, layout


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("runtime", ["megatron", "deepspeed", "torch"])
def test_the_search_bound_lies_below_the_step_time_for_every_schedule(schedule, runtime):
    # The bound a (schedule group, state) pair gets in planner/search/solve.py: the pipeline floor of the
    # group's member without recomputation, plus m · the least data-parallel time per micro-batch
    # and the least tail of the state; and the mean floor that bounds a mesh before its groups.
    # Facts 1-3 of costmodels/bounds.py make them lower bounds for every schedule (the
    # split-backward and DualPipe bubbles too: states only add to B, and DualPipe's hidden time is
    # bounded by the most any rank's core hides); DeepSpeed's 16-bit gradient copy adds to compute,
    # FSDP2's offload tail grows with m.
    n = 0
    for cm, layout in _grid((schedule,), runtime):
        _assert_bounded(cm, layout)
        n += 1
    assert n >= 48  # pp 2 and 4, and several m, states and recomputation modes for each schedule


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_the_search_bound_lies_below_the_step_time_of_a_dense_model(schedule):
    # without MoE no core has EP time, so DualPipeV takes the bubble floor too (bounds.bubble_floor_s);
    # 4096-wide layers give the backward its usual two forwards' time, which the tiny models' fixed
    # per-layer costs hide
    n = 0
    for cm, layout in _grid((schedule,), "megatron", "llama2-7b"):
        _assert_bounded(cm, layout)
        n += 1
    assert n >= 24


@pytest.mark.parametrize("dispatcher", ["alltoall", "hybridep"])
def test_the_search_bound_lies_below_the_step_time_with_the_ep_overlap(dispatcher):
    # Megatron's EP overlap (costmodels/moe_overlap.py) hides EP time behind the merged pairs, off the
    # step like DualPipe's: the pipeline floor takes off the most a rank hides, and the mean floor the
    # most any v could hide (moe_overlap.most_overlapped_pairs) of the largest EP time of a rank
    n = 0
    for cm, layout in _grid(("1f1b", "interleaved"), "megatron"):
        if layout.ep == 1 or layout.recompute == "full" or not ep_overlap_runs(layout.pp, layout.schedule):
            continue
        _assert_bounded(cm, replace(layout, ep_comm_overlap=True, moe_dispatcher=dispatcher))
        n += 1
    assert n >= 24


def _assert_bounded(cm, layout):
    step = cm.estimate(layout).step_time_s
    per_mb, tail = state_floor_s(cm, layout)
    floor = pipeline_floor_s(cm, replace(layout, recompute="none"))
    assert floor + layout.num_microbatches * per_mb + tail <= step * (1 + RELATIVE), layout
    # the search's first floor, a mesh's mean floor, from any other placement (or the DualPipe layout itself)
    others = [replace(layout, schedule=schedule, virtual_stages=v)
              for schedule, v in (("1f1b", 1), ("zb-v", 2), ("interleaved", 5))]
    for other in [layout] if layout.schedule in DUALPIPE else others:
        assert mean_floor_s(cm, other) <= floor * (1 + RELATIVE), (layout, other)
    # a group's floor before its pipeline floor, from any member (any recomputation, GPipe for 1F1B),
    # below the pipeline floor of any split of the layers
    skewed = pipeline_floor_s(cm, replace(layout, recompute="none",
                                          layers_per_chunk=_skewed(layout, cm.model.num_layers)))
    for twin in [layout, replace(layout, schedule="gpipe")] if layout.schedule == "1f1b" else [layout]:
        assert mean_floor_s(cm, twin) <= bubble_floor_s(cm, twin) <= min(floor, skewed) * (1 + RELATIVE), twin
    assert step_time_s(cm, layout) == pytest.approx(step, rel=RELATIVE)
    _assert_memory_floor(cm, layout)


def _skewed(layout, num_layers):
    """A split of the layers other than the balanced one: as many as it may on the first chunk, one on each other."""
    chunks = layout.pp * layout.virtual_stages
    return (num_layers - chunks + 1,) + (1,) * (chunks - 1)


def test_the_bubble_floor_adds_the_flush_bubble_to_the_mean_floor():
    # 1F1B on equal stages: bubble (p - 1)/m of the ideal time (Narayanan et al. SC'21, eq. 1), over
    # the mean floor's ideal m·S/p; interleaving divides it by v
    for cm, layout in _grid(("1f1b", "interleaved"), "megatron"):
        if layout.recompute == "none":
            mean = mean_floor_s(cm, layout)
            bubble = (layout.pp - 1) / (layout.virtual_stages * layout.num_microbatches)
            assert bubble_floor_s(cm, layout) == pytest.approx(mean * (1 + bubble), rel=RELATIVE)


def _assert_memory_floor(cm, layout):
    # costmodels/memory_bounds.py: the peak less what the floor leaves out, the largest rank's
    # buffers with their fragmentation, <= floor <= peak
    breakdown = cm.estimate(layout)
    floor = memory_floor_bytes(cm, layout)
    assert floor <= breakdown.peak_memory_bytes * (1 + RELATIVE), layout
    # with the buffers, NCCL's buffers and the workspaces: still at most the peak, and within what
    # it leaves out (the fragmentation's block and, where freed, the gradients) and the backward's extra
    buffered = memory_floor_bytes(cm, layout, with_buffers=True)
    assert floor <= buffered <= breakdown.peak_memory_bytes * (1 + RELATIVE), layout
    block = max(dict(st.overhead_parts)["fragmentation"]
                - cm.assumptions.allocator_fragmentation * (st.activations_bytes + st.buffers_bytes)
                for st in breakdown.stages)
    grads = max(st.grads_bytes for st in breakdown.stages) if cm.convention.grads_freed_each_step else 0.0
    extra = max(max(0.0, st.activations_bytes - st.schedule_activations_bytes) for st in breakdown.stages)
    assert buffered >= (breakdown.peak_memory_bytes - block - grads - extra) * (1 - RELATIVE), layout
    # and the overhead parts past the CUDA context that do not scale with A: NCCL's buffers, the
    # GEMM workspaces and the fragmentation's block of the largest transient
    unscaled = max(sum(v for name, v in st.overhead_parts if name not in ("cuda_context", "fragmentation"))
                   + dict(st.overhead_parts)["fragmentation"]
                   - cm.assumptions.allocator_fragmentation * (st.activations_bytes + st.buffers_bytes)
                   for st in breakdown.stages)
    left_out = (1 + cm.assumptions.allocator_fragmentation) * max(st.buffers_bytes for st in breakdown.stages) \
        + unscaled
    if cm.convention.grads_freed_each_step:  # the floor's S leaves the gradients out (rank_memory.grads_live_at_peak)
        left_out += max(st.grads_bytes for st in breakdown.stages)
    # eager activations: a backward phase may hold more than the schedule's activations
    # (costmodels.backward_peak: a layer's transient, the clip's copy), which the floor leaves out
    left_out += max(max(0.0, st.activations_bytes - st.schedule_activations_bytes) for st in breakdown.stages)
    assert floor >= (breakdown.peak_memory_bytes - left_out) * (1 - RELATIVE), layout


def test_state_floors_of_one_virtual_stage_count_are_kept_apart_by_placement():
    # At v = 2, ZB-V's first rank holds the first and the last chunk (embedding and head, so the most
    # parameters and the longest tail); interleaved's holds chunks 0 and p. Memoised without the
    # schedule, interleaved layouts took ZB-V's state floors when those came first, and their bound
    # rose above their step time. Here ZB-V comes first on each shared memo.
    for cm, layout in _grid(("zb-v", "interleaved", "interleaved-zb"), "megatron"):
        _assert_bounded(cm, layout)


@pytest.mark.parametrize("model,runtime,seq_len,sign", [
    ("tiny-mixtral", "torch", 512, 1),  # GEMMs too small to hide a transfer: decomposition, exposed chunk
    ("llama2-7b", "megatron", 4096, -1),  # 4096 x 4096 GEMMs hide most of each transfer
])
def test_tp_overlap_twins_order_by_their_layers_tp_time_and_differ_in_memory_by_the_overlap_buffers(
        model, runtime, seq_len, sign):
    # the twin whose layers spend more TP time (bounds.tp_overlap_sign) has the larger or equal
    # pipeline floor and mean floor, and outside DualPipe the larger or equal step time; its peak
    # memory differs by the overlap's buffers beyond the one gathered block of s·b/cp·h·2 bytes
    # (bf16), with the allocator's fragmentation share φ on them: Megatron's 10 userbuffers,
    # 9 · block · (1 + φ); torch async TP's symmetric workspace, 2 · block / t · (1 + φ)
    training = TrainingSpec(global_batch_size=16, seq_len=seq_len, runtime=runtime)
    cluster = make_cluster(load_node("h100-sxm-80gb"), 8, 8)
    cm = CostModel(Job(model=load_model(model), training=training, cluster=cluster, convention=CONVENTIONS[runtime]))
    layouts = [L for L in all_layouts(cm.model, training, 8, 8, SearchOptions()) if L.tp_comm_overlap]
    for on in random.Random(7).sample(layouts, min(120, len(layouts))):
        off = replace(on, tp_comm_overlap=False)
        assert tp_overlap_sign(cm, on) == tp_overlap_sign(cm, off) == sign
        slow, fast = (on, off) if sign > 0 else (off, on)
        for floor in (pipeline_floor_s, mean_floor_s):
            assert floor(cm, slow) >= floor(cm, fast) * (1 - RELATIVE)
        if on.schedule not in DUALPIPE:
            assert cm.estimate(slow).step_time_s >= cm.estimate(fast).step_time_s * (1 - RELATIVE)
        block = 2 * on.micro_batch_size * seq_len / on.cp * cm.model.hidden_size
        extra = (9 * block if runtime == "megatron" else 2 * block / on.tp) * (1 + cm.assumptions.allocator_fragmentation)
        assert tp_overlap_extra_bytes(cm, on) == pytest.approx(extra, rel=RELATIVE)
        assert cm.peak_memory_bytes(on) - cm.peak_memory_bytes(off) == pytest.approx(extra, rel=1e-9)


@pytest.mark.parametrize("model_name,attention", [("llama2-7b", "ring"), ("llama2-7b", "all_gather"),
                                                  ("mistral-7b", "ring")])
def test_the_context_parallel_floor_lies_below_the_mean_floor_of_a_dense_model(model_name, attention):
    """``bounds.context_parallel_floor_s`` (the search's first floor of a dense mesh with cp > 1) is at
    most the mean floor and the step time, over cp, tp, micro-batch size, schedule, recomputation and
    SP; under a sliding window (mistral-7b, 4096 of 8192 tokens) the ring takes fewer steps. Where the
    ring's transfers dominate (many CP ranks, short local sequences) it is most of the mean floor."""
    from costmodels.bounds import context_parallel_floor_s
    model = load_model(model_name)
    training = TrainingSpec(global_batch_size=512, seq_len=8192, context_attention=attention)
    cm = CostModel(Job(model=model, training=training, cluster=make_cluster(load_node("h100-sxm-80gb"), 256, 8)))
    ratios = []
    for cp, tp, b, (schedule, v), recompute, sp in itertools.product(
            (2, 8, 32), (1, 2), (1, 2), (("1f1b", 1), ("interleaved", 2), ("dualpipe", 1)), ("none", "full"),
            (False, True)):
        if sp and tp == 1:
            continue
        pp = 4 if schedule != "1f1b" else 2
        dp = 256 // (cp * tp * pp)
        layout = Layout(dp=dp, tp=tp, pp=pp, cp=cp, micro_batch_size=b, num_microbatches=512 // dp // b,
                        schedule=schedule, virtual_stages=v, recompute=recompute, sequence_parallel=sp)
        check_layout(layout, model, training, 256, 8)
        floor = context_parallel_floor_s(cm, layout)
        assert 0 < floor <= mean_floor_s(cm, layout) * (1 + RELATIVE), layout
        assert floor <= cm.estimate(layout).step_time_s, layout
        ratios.append(floor / mean_floor_s(cm, layout))
    assert len(ratios) == 108 and max(ratios) > 0.5, max(ratios)
