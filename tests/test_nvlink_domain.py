"""NVLink domains that are not nodes (issue #28 part 5): a GB200/GB300 NVL72 node is a compute tray
of 4 GPUs with its own NICs and host memory; the NVLink domain is the rack of 72 GPUs (18 trays).
Groups inside one domain run on NVLink even across trays; groups crossing racks use the network."""

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

import planner
from costmodels.assumptions import Assumptions
from costmodels.collectives import collective_time_s, ring_time_s
from hardware_specs import SpecError, load_node, make_cluster
from hardware_specs.loader import DATA_DIR
from planner.cli import main

EXACT = Assumptions(link_efficiency=1.0, network_efficiency=1.0)
GB200 = load_node("gb200-nvl72")
NVLINK_BYTES_PER_S, NVLINK_S = 900e9, 3e-6  # gb200-nvl72.toml [intra_node]
NIC_BYTES_PER_S, NIC_S = 400e9 / 8, 5e-6  # one 400 Gb/s ConnectX-7 per GPU, [inter_node]
GIB = 1 << 30
ROOT = Path(__file__).resolve().parents[1]


def test_gb200_node_is_a_tray_of_four_in_a_72_gpu_domain():
    for name in ("gb200-nvl72", "gb300-nvl72"):
        node = load_node(name)
        assert (node.gpus_per_node, node.nvlink_domain_gpus, node.nodes_per_nvlink_domain) == (4, 72, 18)
        assert node.inter_node.nics_per_node == 4  # one NIC per GPU, as when the node was the rack
    assert load_node("h100-sxm-80gb").nvlink_domain_gpus == 8  # absent = the node


def test_any_whole_number_of_trays_is_accepted():
    cluster = make_cluster(GB200, 256)  # refused before: 256 is not a multiple of 72
    assert (cluster.num_nodes, cluster.gpus_per_node, cluster.nvlink_domain_gpus) == (64, 4, 72)
    assert make_cluster(GB200, 128).num_nodes == 32
    assert make_cluster(GB200, 2).nvlink_domain_gpus == 2  # part of one tray
    with pytest.raises(SpecError, match="not a multiple of 4 GPUs per node"):
        make_cluster(GB200, 130)
    half_trays = make_cluster(GB200, 36, gpus_per_node=2)  # --gpus-per-node: 2 of each tray's 4 used
    assert (half_trays.num_nodes, half_trays.nvlink_domain_gpus) == (18, 36)


def test_ranks_fill_domain_by_domain_and_the_worst_group_sets_the_placement():
    c = make_cluster(GB200, 256)  # domains: ranks 0-71, 72-143, 144-215, 216-255 (40 GPUs)
    assert c.group_placement(8, 1) == (8, 1)  # 8 divides 72 and 40: every group inside a domain
    assert c.group_placement(4, 1) == (4, 1)
    assert c.group_placement(16, 1) == (8, 2)  # ranks 64-79 straddle the first boundary, 8 + 8
    assert c.group_placement(4, 64) == (1, 4)  # ranks 63, 127, 191, 255 lie in four domains
    # dp 32 over tp 8 (stride 8): 9 + 9 + 9 + 5 ranks in the four domains, costed as 8 in each of 4
    assert c.group_placement(32, 8) == (8, 4)
    full = make_cluster(GB200, 144)  # two whole racks
    assert full.group_placement(72, 1) == (72, 1) and full.group_placement(2, 72) == (1, 2)


def test_tp_group_across_trays_inside_a_rack_is_costed_at_nvlink_rates():
    # tp 8 = two trays of 4 in rack 0 of a 128-GPU job: ring all-gather over NVLink,
    # (n-1)·α + (n-1)/n·S/β = 7·3 µs + 7/8·2^30 B / 900 GB/s = 21 µs + 1.0439 ms = 1.0649 ms.
    c = make_cluster(GB200, 128)
    expected = 7 * NVLINK_S + 7 / 8 * GIB / NVLINK_BYTES_PER_S
    assert collective_time_s("all_gather", GIB, 8, 1, c, assumptions=EXACT) == pytest.approx(expected)
    assert expected == pytest.approx(1.0649e-3, rel=1e-4)
    # EP all-to-all of 24 across 6 trays (24 divides 72): 23·3 µs + 23/24·S / 900 GB/s
    expected_a2a = 23 * NVLINK_S + 23 / 24 * GIB / NVLINK_BYTES_PER_S
    assert collective_time_s("all_to_all", GIB, 24, 1, make_cluster(GB200, 144), assumptions=EXACT) \
        == pytest.approx(expected_a2a)


def test_tp_all_reduce_inside_a_rack_uses_nvlink_sharp():
    # NVLS (collectives_all_reduce.nvls_all_reduce_s): α + 2·S / (2·e·β), e = 0.74
    c = make_cluster(GB200, 128)
    expected = NVLINK_S + 2 * GIB / (2 * 0.74 * NVLINK_BYTES_PER_S)
    assert collective_time_s("all_reduce", GIB, 8, 1, c, assumptions=EXACT) == pytest.approx(expected)
    assert expected < ring_time_s("all_reduce", GIB, 8, NVLINK_S, NVLINK_BYTES_PER_S)


def test_the_same_group_across_racks_is_costed_at_network_rates():
    # One rank in each of 8 domains (stride 72 on 576 GPUs = 8 racks): a ring over the NICs,
    # 7·5 µs + 7/8·S / 50 GB/s, 18x slower per byte than NVLink.
    c = make_cluster(GB200, 576)
    expected = 7 * NIC_S + 7 / 8 * GIB / NIC_BYTES_PER_S
    assert collective_time_s("all_gather", GIB, 8, 72, c, assumptions=EXACT) == pytest.approx(expected)
    # tp 16 on 256 GPUs: the group on ranks 64-79 is 8 + 8 across racks 0 and 1; the hierarchical
    # 2-D sum and the per-GPU NIC bound, the slower: max(α_n + 1/2·(S/8)/β_n + 7α + 7/8·S/β,
    # 15/16·S/β_n) = the NIC bound, 20.1 ms, against 1.09 ms had it stayed inside one rack.
    c = make_cluster(GB200, 256)
    hierarchical = NIC_S + 1 / 2 * GIB / 8 / NIC_BYTES_PER_S + 7 * NVLINK_S + 7 / 8 * GIB / NVLINK_BYTES_PER_S
    nic_bound = 15 / 16 * GIB / NIC_BYTES_PER_S
    assert collective_time_s("all_gather", GIB, 16, 1, c, assumptions=EXACT) \
        == pytest.approx(max(hierarchical, nic_bound))
    assert nic_bound > hierarchical


def test_a_group_inside_a_rack_costs_what_it_did_when_the_node_was_the_rack():
    # the old gb200-nvl72.toml: one 72-GPU "node" with 72 NICs; same links, so the same times
    rack = replace(GB200, gpus_per_node=72, nodes_per_nvlink_domain=1,
                   inter_node=replace(GB200.inter_node, nics_per_node=72))
    old, new = make_cluster(rack, 144), make_cluster(GB200, 144)
    for op, degree, stride in (("all_reduce", 8, 1), ("all_gather", 36, 2), ("all_to_all", 18, 4),
                               ("reduce_scatter", 2, 72), ("all_reduce", 2, 72)):
        assert collective_time_s(op, GIB, degree, stride, new) == pytest.approx(
            collective_time_s(op, GIB, degree, stride, old)), (op, degree, stride)


@pytest.mark.parametrize("value,needle", [
    ("70", "node.nvlink_domain_gpus' must be a multiple of node.gpus_per_node \\(4\\)"),
    ("72.5", "node.nvlink_domain_gpus' must be a whole number"),
    ('"72"', "node.nvlink_domain_gpus' must be a number"),
])
def test_bad_nvlink_domain_names_the_field(tmp_path, value, needle):
    bad = tmp_path / "node.toml"
    bad.write_text((DATA_DIR / "gb200-nvl72.toml").read_text().replace("nvlink_domain_gpus = 72",
                                                                       f"nvlink_domain_gpus = {value}"))
    with pytest.raises(SpecError, match=needle):
        load_node(str(bad))
    result = CliRunner().invoke(main, ["plan", "--model", "llama3-8b", "--hardware", str(bad), "--gpus", "8",
                                       "--global-batch", "16", "--seq-len", "4096"])
    assert result.exit_code == 2 and "nvlink_domain_gpus" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_an_unsourced_nvlink_domain_is_refused(tmp_path):
    bad = tmp_path / "node.toml"
    bad.write_text((DATA_DIR / "gb200-nvl72.toml").read_text().replace('"node.nvlink_domain_gpus" =', '# "node.nvlink_domain_gpus" ='))
    with pytest.raises(SpecError, match="node.nvlink_domain_gpus.*sources"):
        load_node(str(bad))


@pytest.mark.parametrize("gpus", [128, 256])
def test_llama3_70b_plans_on_gb200_racks(gpus):
    report = planner.plan(model="llama3-70b", hardware="gb200-nvl72", gpus=gpus, global_batch=512, seq_len=8192,
                          top_k=1)
    best = report.best
    assert best is not None and best.layout.world_size == gpus and best.fits
    assert best.layout.tp <= 8  # 72 = 9 x 8: larger power-of-two TP groups straddle racks
    assert 0.3 < best.mfu < 0.8


def test_cli_plans_256_gpus_on_gb200_as_a_subprocess():
    result = subprocess.run([sys.executable, "-m", "planner.cli", "plan", "--model", "llama3-70b", "--hardware",
                             "gb200-nvl72", "--gpus", "256", "--global-batch", "512", "--seq-len", "8192",
                             "--format", "json"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert '"gpus": 256' in result.stdout and '"gpus_per_node": 4' in result.stdout


def test_plan_header_names_the_nvlink_domain_where_it_spans_nodes():
    args = ["plan", "--model", "llama3-8b", "--global-batch", "64", "--seq-len", "2048", "--top", "1"]
    rack = CliRunner().invoke(main, [*args, "--hardware", "gb200-nvl72", "--gpus", "128"])
    assert rack.exit_code == 0, rack.output
    assert "on 128 x gb200-nvl72 (4 per node, NVLink domain of 72)" in rack.output.splitlines()[0]
    node = CliRunner().invoke(main, [*args, "--hardware", "h100-sxm-80gb", "--gpus", "16"])
    assert node.exit_code == 0 and "(8 per node)" in node.output.splitlines()[0]
