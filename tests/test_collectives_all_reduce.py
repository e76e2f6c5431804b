"""NCCL's all-reduce algorithms (``costmodels.collectives_all_reduce``) against hand-worked values,
and the choice among them as NCCL's tuner makes it."""

import dataclasses
import math

import pytest

from costmodels.assumptions import Assumptions
from costmodels.collectives import collective_time_s
from costmodels.collectives_all_reduce import (AllReduceLinks, all_reduce_s, nvls_all_reduce_s, ring_all_reduce_s,
                                               sharp_all_reduce_s, tree_all_reduce_s)
from hardware_specs import load_node, make_cluster

GIB, MIB = 2**30, 2**20
# H100-like links at face value: NVLink 450 GB/s, 3 µs; 8 x 50 GB/s NICs per node, 5 µs.
PLAIN = AllReduceLinks(alpha_intra_s=3e-6, beta_intra_bytes_per_s=450e9, alpha_inter_s=5e-6,
                       beta_net_bytes_per_s=8 * 50e9)
NVLS = dataclasses.replace(PLAIN, nvls_efficiency=0.85)
SHARP = dataclasses.replace(PLAIN, sharp=True)


def test_ring_inside_a_node_is_thakur_ring():
    # 2(n-1)α + 2(n-1)/n·S/β = 14 x 3 µs + 1.75 x 2^30 / 450e9
    assert ring_all_reduce_s(GIB, 8, 1, PLAIN) == pytest.approx(42e-6 + 1.75 * GIB / 450e9)
    assert all_reduce_s(GIB, 8, 1, PLAIN) == (ring_all_reduce_s(GIB, 8, 1, PLAIN), "ring")


def test_nvls_moves_each_byte_once_each_way():
    # NVLS on one node: intraLat + 2·S / (2 x 0.85 x 450e9) = 3 µs + 2.807 ms, 1.49x the ring's 4.218 ms
    assert nvls_all_reduce_s(GIB, 8, 1, NVLS) == pytest.approx(3e-6 + GIB / (0.85 * 450e9))
    seconds, algorithm = all_reduce_s(GIB, 8, 1, NVLS)
    assert algorithm == "nvls" and seconds == pytest.approx(2.8102e-3, rel=1e-4)
    assert math.isinf(nvls_all_reduce_s(GIB, 8, 1, PLAIN))  # no NVLS on the switch
    assert math.isinf(nvls_all_reduce_s(GIB, 1, 8, NVLS))  # one rank per node: nothing to reduce in the switch


def test_tree_beats_the_ring_at_scale():
    # 512 ranks = 8 per node x 64 nodes, bus bandwidth min(450, 400) GB/s.
    # ring latency 2(512 - 64) x 3 µs + 2 x 63 x 5 µs = 3.318 ms; tree 2 x (7 x 3 + 6 x 5) µs = 102 µs.
    ring_small = 3.318e-3 + 2 * 511 / 512 * MIB / 400e9
    tree_small = 102e-6 + 2 * MIB / (0.92 * 400e9)
    assert ring_all_reduce_s(MIB, 8, 64, PLAIN) == pytest.approx(ring_small)
    assert tree_all_reduce_s(MIB, 8, 64, PLAIN) == pytest.approx(tree_small)
    assert all_reduce_s(MIB, 8, 64, PLAIN)[1] == "tree"
    # two nodes, 1 GiB: the ring's 0.875 B/S beats the tree's bandwidth, 2(16-2)·3 + 2·5 = 94 µs of latency
    assert ring_all_reduce_s(GIB, 8, 2, PLAIN) == pytest.approx(94e-6 + 2 * 15 / 16 * GIB / 400e9)
    assert all_reduce_s(GIB, 8, 2, PLAIN)[1] == "ring"


def test_sharp_sends_the_node_data_once_each_way():
    # k 8, N 64, 1 GiB: latency 2 x (3 + 7 x 0.4) µs + 5 µs = 16.6 µs; NVLink part 1.75 x 2^30 / 450e9 =
    # 4.176 ms outlasts the network part 2^30 / 400e9 = 2.684 ms.
    expected = 16.6e-6 + 1.75 * GIB / 450e9
    assert sharp_all_reduce_s(GIB, 8, 64, SHARP) == pytest.approx(expected)
    assert all_reduce_s(GIB, 8, 64, SHARP) == (pytest.approx(expected), "collnet")
    assert math.isinf(sharp_all_reduce_s(GIB, 8, 1, SHARP))  # inside a node there is no switch to reduce in
    assert math.isinf(sharp_all_reduce_s(GIB, 8, 64, PLAIN))


def test_the_cluster_spec_reaches_the_choice():
    # H100 ships nvls_efficiency 0.85 (NCCL's Hopper figure): the TP all-reduce inside a node is NVLS.
    exact = Assumptions(link_efficiency=1.0, network_efficiency=1.0)
    h100 = make_cluster(load_node("h100-sxm-80gb"), 8)
    assert collective_time_s("all_reduce", GIB, 8, 1, h100, assumptions=exact) == pytest.approx(
        nvls_all_reduce_s(GIB, 8, 1, NVLS))
    a100 = make_cluster(load_node("a100-sxm-80gb"), 8)
    assert load_node("a100-sxm-80gb").intra_node.nvls_efficiency == 0.0
    assert collective_time_s("all_reduce", GIB, 8, 1, a100, assumptions=exact) == pytest.approx(
        42e-6 + 1.75 * GIB / 300e9)


def test_spec_fields_are_checked_where_they_enter():
    from autoplan_base.errors import SpecError
    from hardware_specs.files import read_toml
    from hardware_specs.loader import DATA_DIR, parse_node

    raw = read_toml(DATA_DIR / "h100-sxm-80gb.toml", what="hardware file")
    raw["inter_node"]["sharp"] = True
    assert parse_node(raw, origin="t").inter_node.sharp is True
    raw["inter_node"]["sharp"] = "yes"
    with pytest.raises(SpecError, match="'inter_node.sharp' must be true or false"):
        parse_node(raw, origin="t")
    raw["inter_node"]["sharp"] = True
    del raw["sources"]["inter_node.sharp"]
    with pytest.raises(SpecError, match="'inter_node.sharp' has no entry in \\[sources\\]"):
        parse_node(raw, origin="t")
    raw["intra_node"]["nvls_efficiency"] = 1.5
    with pytest.raises(SpecError, match="nvls_efficiency"):
        parse_node(raw, origin="t")
