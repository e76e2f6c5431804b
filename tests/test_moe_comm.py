"""MoE as Megatron's recipes run it (issue #37 item 5): the EP overlap of Megatron-Core's combined
1F1B schedule and the DeepEP / HybridEP flex dispatcher, each a capability with its release,
costed, searched and written as Megatron's own options."""

import json
from dataclasses import replace

import pytest

import planner
from planner.api import layout_for_batch
from costmodels.assumptions import Assumptions
from costmodels.capabilities import capabilities, features_used
from costmodels.collectives import ring_time_s
from costmodels.moe_dispatch import available_dispatchers, dispatch, remote_domains_per_token
from costmodels.moe_overlap import ep_overlap_hidden_s, most_overlapped_pairs, overlapped_pairs
from costmodels.pipeline import PassTimes
from hardware_specs import load_node, make_cluster
from planner.search.framework_rules import layout_rule_problems
from planner.search.runtime_space import search_options
from costmodels.capabilities import Narrowing

EXACT = Assumptions(link_efficiency=1.0, network_efficiency=1.0)
QWEN3 = dict(model="qwen3-235b-a22b", hardware="gb200-nvl72", gpus=128, global_batch=8192, seq_len=4096,
             precision="mxfp8", runtime="megatron-bridge")


def test_each_feature_has_the_release_that_introduced_it():
    megatron = capabilities("megatron")
    assert megatron.feature("ep_comm_overlap").since == "core_v0.14.0"
    assert megatron.feature("ep_comm_overlap").option == "--overlap-moe-expert-parallel-comm --delay-wgrad-compute"
    assert megatron.feature("hybridep").since == "core_v0.16.0"
    assert megatron.feature("alltoall").option == "--moe-token-dispatcher-type alltoall"
    old = capabilities("megatron", "core_v0.13.0")
    assert not old.has("ep_comm_overlap") and not old.has("hybridep") and old.has("alltoall")
    assert not search_options(old, Narrowing(), "cuda").ep_comm_overlap
    assert search_options(megatron, Narrowing(), "cuda").ep_comm_overlap
    assert not capabilities("torchtitan").has("ep_comm_overlap")


def test_deepep_runs_on_nvlink_nodes_of_8_and_hybridep_on_racks():
    assert available_dispatchers(load_node("h100-sxm-80gb")) == ("alltoall", "deepep", "hybridep")
    assert available_dispatchers(load_node("gb200-nvl72")) == ("alltoall", "hybridep")  # DeepEP: 8 NVLink peers
    assert available_dispatchers(load_node("v100-sxm-32gb")) == ("alltoall",)  # compute capability 7.0
    assert available_dispatchers(load_node("cpu")) == ("alltoall",)


def test_a_token_crosses_to_each_remote_domain_once():
    # k' = 8 copies over D = 2 domains: the other domain is missed only if all 8 land at home, 2^-8
    assert remote_domains_per_token(8, 2) == pytest.approx(1 - 2 ** -8)
    assert remote_domains_per_token(8, 1) == 0.0
    # D = 8 nodes (ep 64 over DGX nodes), k' = 8: 7·(1 − (7/8)^8) = 4.59 against the 7 the all-to-all sends
    assert remote_domains_per_token(8, 8) == pytest.approx(7 * (1 - (7 / 8) ** 8))


def test_the_flex_exchange_is_the_slower_of_its_nic_and_nvlink_legs():
    """ep 16 over two DGX H100 nodes (stride 1): 8 ranks a node. S = 1 GiB per rank, k' = 8. NIC leg:
    S/8 · E[remote nodes] over one 400 Gb/s NIC (one per GPU) plus one network latency; NVLink leg:
    the ring all-to-all of S over the node's 8 GPUs."""
    cluster = make_cluster(load_node("h100-sxm-80gb"), 16)
    size, copies = 2 ** 30, 8.0
    collective = lambda op, s, d, st: ("nccl", s, d, st)  # noqa: E731  must not be called across nodes
    seconds, sent, source = dispatch("deepep", size, copies, 16, 1, cluster, EXACT, collective)
    remote = size / copies * remote_domains_per_token(copies, 2)
    nic_s = remote / 50e9 + 5e-6
    nvlink_s = ring_time_s("all_to_all", size, 8, 3e-6, 450e9)
    assert seconds == pytest.approx(max(nic_s, nvlink_s)) and source == "datasheet"
    assert sent == pytest.approx(remote + size * 7 / 8)
    # inside one node the flex dispatcher is the all-to-all itself
    assert dispatch("deepep", size, copies, 8, 1, cluster, EXACT, collective) == ("nccl", size, 8, 1)
    assert dispatch("alltoall", size, copies, 16, 1, cluster, EXACT, collective) == ("nccl", size, 16, 1)


def test_merged_pairs_count_the_steady_state():
    assert overlapped_pairs(1, 1, 64) == 63  # Megatron's phases 1 .. m-1 without pipelining
    # pp 4, v 2: 2·16 chunk steps less rank 0's (v + 1)·pp − 2 = 10 warm-up forwards, over v
    assert overlapped_pairs(4, 2, 16) == (32 - 10) / 2
    assert overlapped_pairs(1, 1, 24) == most_overlapped_pairs(1, 24)  # without pipelining v is 1
    for pp in (2, 4, 8):  # the bound the mean floor uses covers every v
        assert all(overlapped_pairs(pp, v, 24) <= most_overlapped_pairs(pp, 24) for v in (1, 2, 3, 4, 6, 12))
    passes = PassTimes(forward_s=1.0, input_grad_s=2.0, weight_grad_s=1.0, compute_s=3.0, ep_comm_s=0.5)
    assert ep_overlap_hidden_s(passes, pp=1, v=1, m=8, slowdown=0.1) == pytest.approx(7 * 0.9 * 0.5)


def _qwen3(**fields):
    return planner.evaluate(layout=layout_for_batch(8192, dp=128, ep=64, zero_stage=1,
                                                            gpus_per_nvlink_domain=64, **fields), **QWEN3)


def test_the_ep_overlap_hides_what_the_merged_pairs_can():
    """pp 1, m = 64: (m − 1) pairs each hide (1 − σ)·min(e, C) of the per-micro-batch EP time e behind
    the compute C; everything else is unchanged but one more layer of activations."""
    plain, merged = _qwen3(), _qwen3(ep_comm_overlap=True)
    m = plain.layout.num_microbatches
    e, c = plain.ep_comm_s / m, (plain.compute_s + plain.recompute_s) / m
    sigma = planner.resolve_job(**QWEN3).cost_model().assumptions.overlap_slowdown  # as shipped (calibrated)
    assert merged.ep_comm_s == pytest.approx(plain.ep_comm_s - (m - 1) * (1 - sigma) * min(e, c))
    assert merged.compute_s == plain.compute_s and merged.dp_comm_s == plain.dp_comm_s
    assert 0 < merged.peak_memory_bytes - plain.peak_memory_bytes < plain.peak_stage.activations_bytes / 20


def test_the_flex_dispatcher_takes_the_nics_less_where_ep_spans_racks():
    filled = dict(gpus_per_nvlink_domain=0)  # EP 64 over ranks 64-127 spans two racks
    alltoall = planner.evaluate(layout=layout_for_batch(8192, dp=128, ep=64, zero_stage=1, **filled), **QWEN3)
    hybrid = planner.evaluate(layout=layout_for_batch(8192, dp=128, ep=64, zero_stage=1, moe_dispatcher="hybridep",
                                                              **filled), **QWEN3)
    assert hybrid.ep_comm_s < alltoall.ep_comm_s / 2
    inside = _qwen3(moe_dispatcher="hybridep")
    assert inside.ep_comm_s == _qwen3().ep_comm_s  # inside one rack there is nothing to deduplicate


def test_what_megatron_refuses_is_never_offered():
    model = planner.resolve_job(**QWEN3).model
    training = planner.resolve_job(**QWEN3).training
    full = layout_for_batch(8192, dp=128, ep=64, zero_stage=1, ep_comm_overlap=True, recompute="full")
    assert any("disable full recomputation" in p for p in layout_rule_problems("megatron", model, training, full))
    with pytest.raises(planner.LayoutError, match="pp 1 or --schedule interleaved"):
        planner.evaluate(layout=layout_for_batch(8192, dp=64, pp=2, ep=64, zero_stage=1, ep_comm_overlap=True),
                         **QWEN3)
    with pytest.raises(planner.LayoutError, match="--moe-dispatcher deepep|moe_dispatcher=deepep"):
        _qwen3(moe_dispatcher="deepep")  # a GB200 rack: DeepEP reaches 8 NVLink peers


def test_the_export_writes_the_dispatcher_and_the_overlap_as_costed():
    from planner.launch.megatron_export import megatron_args
    from planner.launch.megatron_fields import bridge_override_lines

    job = planner.resolve_job(**QWEN3)
    layout = layout_for_batch(8192, dp=64, tp=2, ep=64, zero_stage=1, moe_dispatcher="hybridep",
                                      ep_comm_overlap=True)
    args, notes = megatron_args(job.model, job.training, layout, 4096)
    text = " ".join(args)
    assert "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep" in text
    assert "--overlap-moe-expert-parallel-comm --delay-wgrad-compute" in text
    assert any("CUDA_DEVICE_MAX_CONNECTIONS" in n for n in notes)
    named = {t for f in features_used(capabilities("megatron"), layout) for t in f.option.split() if t.startswith("--")}
    assert named <= set(args)
    written = dict(line.split("=", 1) for line in bridge_override_lines(args))
    assert json.loads(written["comm_overlap.overlap_moe_expert_parallel_comm"]) is True
    assert json.loads(written["model.moe_flex_dispatcher_backend"]) == "hybridep"
    plain, _ = megatron_args(job.model, job.training, replace(layout, moe_dispatcher="alltoall", ep_comm_overlap=False),
                             4096)
    assert "--moe-token-dispatcher-type alltoall" in " ".join(plain)  # Megatron's default is allgather
    assert "--overlap-moe-expert-parallel-comm" not in plain


def test_the_flex_legs_take_the_calibrated_link_scales():
    """``autoplan calibrate``'s inter- and intra-node factors reach the flex dispatcher's two legs."""
    from dataclasses import replace

    cluster = make_cluster(load_node("h100-sxm-80gb"), 16)
    size, copies = 2 ** 30, 8.0

    def collective(*_):  # pragma: no cover - the flex path does not call it across nodes
        raise AssertionError("the flex path costs its own legs")

    def seconds(**scales: float) -> float:
        return dispatch("deepep", size, copies, 16, 1, cluster, replace(EXACT, **scales), collective)[0]

    base = seconds()
    assert seconds(inter_node_comm_scale=50.0) > base and seconds(intra_node_comm_scale=50.0) > base
    assert seconds(network_efficiency=0.5) > base
