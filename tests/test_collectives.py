"""Alpha-beta collective times against hand-computed values, and group placement."""

import pytest

from costmodels.assumptions import Assumptions
from costmodels.collectives import bytes_sent_per_rank, collective_time_s, ring_time_s
from costmodels.presets import load_model
from costmodels.training import TrainingSpec
from hardware_specs import load_node, make_cluster
from planner.search.space import SearchOptions, mesh_choices

EXACT = Assumptions(link_efficiency=1.0, network_efficiency=1.0)
H100 = make_cluster(load_node("h100-sxm-80gb"), 64)  # 8 nodes x 8, NVSwitch 450 GB/s, 8 x 400 Gb/s NICs


def test_ring_formulas():
    # Thakur et al. 2005: all-reduce 2(n-1)α + 2(n-1)/n·S/β; all-gather (n-1)α + (n-1)/n·S/β.
    assert ring_time_s("all_reduce", 8e9, 8, 1e-5, 1e11) == pytest.approx(14e-5 + 2 * 7 / 8 * 0.08)
    assert ring_time_s("all_gather", 8e9, 8, 1e-5, 1e11) == pytest.approx(7e-5 + 7 / 8 * 0.08)
    assert ring_time_s("send_recv", 1e9, 2, 1e-5, 1e11) == pytest.approx(1e-5 + 0.01)
    assert bytes_sent_per_rank("all_reduce", 8.0, 4) == 12.0


A100 = make_cluster(load_node("a100-sxm-80gb"), 64)  # NVSwitch 300 GB/s without NVLS, 8 x 200 Gb/s NICs


def test_group_inside_a_node_uses_nvswitch():
    # A100 has no NVLink SHARP: the ring, 2(n-1)α + 2(n-1)/n·S/β over NVSwitch.
    size = 1 << 30
    expected = ring_time_s("all_reduce", size, 8, 3e-6, 300e9)
    assert collective_time_s("all_reduce", size, 8, 1, A100, assumptions=EXACT) == pytest.approx(expected)


def test_group_across_nodes_shares_the_node_nics():
    # One rank per node (stride 8): 8 x 400 Gb/s per node shared by 8 GPUs = 50 GB/s each.
    size = 1 << 30
    expected = ring_time_s("all_reduce", size, 8, 5e-6, 8 * 400e9 / 8 / 8)
    assert collective_time_s("all_reduce", size, 8, 8, H100, assumptions=EXACT) == pytest.approx(expected)


def test_all_reduce_spanning_nodes_is_one_pipelined_ring():
    # 16 A100 ranks = 8 per node x 2 nodes, 1 GiB: NCCL's ring crosses NVLink (300 GB/s) and the node's
    # 8 x 25 GB/s NICs (200 GB/s) at once, so the slower bounds it (not the sum of phases):
    # 2(16 - 2)·3 µs + 2(2 - 1)·5 µs + 2·15/16·2^30 B / 200 GB/s = 84 µs + 10 µs + 10.066 ms.
    size = 1 << 30
    expected = 84e-6 + 10e-6 + 2 * 15 / 16 * size / 200e9
    assert collective_time_s("all_reduce", size, 16, 1, A100, assumptions=EXACT) == pytest.approx(expected)
    assert H100.group_placement(16, 1) == (8, 2)
    assert H100.group_placement(4, 2) == (4, 1)
    assert H100.group_placement(4, 16) == (1, 4)


def test_tensor_parallel_stays_inside_a_node_unless_allowed():
    model, training = load_model("llama3-70b"), TrainingSpec(global_batch_size=64, seq_len=4096)
    inside = mesh_choices(model, training, 64, 8, SearchOptions())
    assert max(m.tp for m in inside) == 8
    across = mesh_choices(model, training, 64, 8, SearchOptions(allow_cross_node_tp=True))
    assert max(m.tp for m in across) == 64


def test_zero3_gathers_pay_latency_once_per_fsdp_unit():
    # tiny-llama (4 layers) on the cpu preset, dp 2 ZeRO-3, fp32: each micro-batch gathers the 5
    # FSDP units (4 blocks + root) one by one in forward and again in backward, and
    # reduce-scatters their gradients, each piece paying gloo's latency (alpha = 30 µs).
    from costmodels.assignment import rank_layers, rank_params
    from costmodels.estimate import CostModel
    from costmodels.job import Job
    from costmodels.layout import Layout
    from costmodels.rank_time import rank_times

    cluster = make_cluster(load_node("cpu"), 2)
    training = TrainingSpec(global_batch_size=2, seq_len=64, precision="fp32")
    cm = CostModel(Job(model=load_model("tiny-llama"), training=training, cluster=cluster, assumptions=EXACT))
    layout = Layout(dp=2, zero_stage=3, num_microbatches=1)
    rank = rank_layers(cm, layout)[0]
    state_bytes = 4 * rank_params(cm, layout, rank).dense  # fp32 params, fp32 grads
    gather = 5 * collective_time_s("all_gather", state_bytes / 5, 2, 1, cluster, assumptions=EXACT)
    reduce = 5 * collective_time_s("reduce_scatter", state_bytes / 5, 2, 1, cluster, assumptions=EXACT)
    assert gather > collective_time_s("all_gather", state_bytes, 2, 1, cluster, assumptions=EXACT)
    t = rank_times(cm, layout, rank)
    from costmodels.overlap import exposed_comm_s

    expected = exposed_comm_s(gather, t.fwd_compute_s, 5, EXACT) + exposed_comm_s(gather + reduce, t.bwd_compute_s, 5, EXACT)
    assert t.dp_mb_s == pytest.approx(expected)


def test_cross_node_gathers_and_all_to_all_are_bound_by_the_gpus_nic_share():
    # 64 ranks = 8 per node x 8 nodes on H100 (50 GB/s NIC share per GPU), S = 1 GiB.
    # All-to-all: 56 of 64 slices are bound for other nodes: S*56/64 / 50e9 over one GPU's NIC.
    # All-gather: NCCL's flat ring sends (n-1)/n*S per rank over that NIC: S*63/64 / 50e9.
    # The hierarchical time (1/8 of S over the NIC plus an NVLink phase) is over 4x below both.
    size = 1 << 30
    a2a = collective_time_s("all_to_all", size, 64, 1, H100, assumptions=EXACT)
    ag = collective_time_s("all_gather", size, 64, 1, H100, assumptions=EXACT)
    assert a2a == pytest.approx(size * 56 / 64 / 50e9)
    assert ag == pytest.approx(size * 63 / 64 / 50e9)
    hierarchical = ring_time_s("all_gather", size / 8, 8, 5e-6, 50e9) + ring_time_s("all_gather", size, 8, 3e-6, 450e9)
    assert ag > 4 * hierarchical
    # All-reduce keeps the hierarchical algorithm (NCCL's tree/ring over node-level reductions).
    assert collective_time_s("all_reduce", size, 64, 1, H100, assumptions=EXACT) < ag


def test_overlapped_communication_exposes_its_last_piece_and_slows_compute():
    from costmodels.overlap import exposed_comm_s

    a = Assumptions(overlap_fraction=1.0, overlap_slowdown=0.1)
    # 4 pieces of 1 s beside 10 s of compute: 1 s exposed + 10% of the 3 s that overlap.
    assert exposed_comm_s(4.0, 10.0, 4, a) == pytest.approx(1.0 + 0.3)
    # 12 s beside 10 s, 4 pieces: 3 s exposed, 9 - 10 < 0 left over, 10% of 9 s overlapped.
    assert exposed_comm_s(12.0, 10.0, 4, a) == pytest.approx(3.0 + 0.0 + 0.9)
    # 20 s beside 10 s in one piece: nothing overlaps, all 20 s exposed.
    assert exposed_comm_s(20.0, 10.0, 1, a) == pytest.approx(20.0)
    assert exposed_comm_s(0.0, 10.0, 4, a) == 0.0


def test_zero2_reduce_scatters_every_micro_batch_when_accumulating():
    # Megatron-runtime ZeRO-2 (DeepSpeed stage 2), 4 micro-batches: the gradient reduce-scatter
    # is sent once per micro-batch (4x the bytes of one), ZeRO-1 once per step.
    from costmodels.estimate import CostModel
    from costmodels.job import Job
    from costmodels.layout import Layout

    cluster = make_cluster(load_node("h100-sxm-80gb"), 8)
    cm = CostModel(Job(model=load_model("llama2-7b"), training=TrainingSpec(global_batch_size=32, seq_len=1024),
                       cluster=cluster))
    sent = {z: cm.estimate(Layout(dp=8, zero_stage=z, num_microbatches=4)).comm_bytes_per_gpu["dp_reduce_scatter"]
            for z in (1, 2)}
    assert sent[2] == pytest.approx(4 * sent[1])
