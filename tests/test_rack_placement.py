"""Rack-scale placement (issue #37 item 4): how many GPUs of each NVLink domain a job fills is a
searched choice the user can fix; groups inside one domain run on NVLink, and the plan names the
placement. GB200 NVL72: trays of 4 GPUs, racks of 72 (``hardware_specs/data/gb200-nvl72.toml``)."""

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

import planner
from planner.api import layout_for_batch
from costmodels.assumptions import Assumptions
from costmodels.collectives import ring_time_s
from costmodels.estimate import CostModel
from costmodels.job import Job
from costmodels.presets import load_model
from costmodels.runtimes import CONVENTIONS
from costmodels.training import TrainingSpec
from hardware_specs import SpecError, load_node, make_cluster
from hardware_specs.placement import domain_sizes, even_split_gpus, placement_choices
from planner.cli import main
from planner.search.brute_force import solve_brute_force
from planner.search.solve import solve
from planner.search.space import SearchOptions, mesh_choices

GB200 = load_node("gb200-nvl72")
EXACT = Assumptions(link_efficiency=1.0)
QWEN3_JOB = ["--model", "qwen3-235b-a22b", "--hardware", "gb200-nvl72", "--gpus", "128", "--global-batch", "8192",
             "--seq-len", "4096", "--precision", "mxfp8", "--runtime", "megatron-bridge"]
"""The issue's job: Qwen3-235B on 128 GB200 (32 trays), MXFP8, as Megatron-Bridge runs it."""


@pytest.mark.parametrize("gpus,choices", [(128, (0, 64)), (256, (0, 64)), (96, (0, 48)), (144, (0,)), (72, (0,)),
                                          (64, (0,)), (160, (0, 40))])
def test_the_search_tries_filling_racks_and_equal_segments(gpus, choices):
    # equal segments: the most trays of one rack (18) that divide the job's trays (Megatron-Bridge's
    # --segment rule): 32 trays -> 16 (64 GPUs), 24 -> 12 (48), 40 -> 10 (40); 36 trays fill two racks
    assert placement_choices(72, 4, gpus) == choices
    assert placement_choices(8, 8, gpus) == (0,)  # a DGX node is its own domain: nothing to choose
    assert even_split_gpus(72, 4, 128) == 64 and domain_sizes(128, 64) == (64, 64) and domain_sizes(128, 72) == (72, 56)


def test_a_placement_of_64_keeps_an_ep64_group_inside_one_rack():
    filled, placed = make_cluster(GB200, 128), make_cluster(GB200, 128).placed(64)
    # ranks 64-127 straddle racks 0 (64-71) and 1 when racks fill 72 at a time
    assert filled.group_placement(64, 1) == (32, 2)
    assert placed.group_placement(64, 1) == (64, 1) and placed.nvlink_domain_gpus == 64
    assert filled.placed(0) is filled


@pytest.mark.parametrize("value", [62, 76, -4])
def test_a_placement_that_is_not_whole_trays_of_one_rack_names_the_field(value):
    with pytest.raises(SpecError, match="gpus_per_nvlink_domain.*whole nodes of 4 GPUs.*up to 72"):
        make_cluster(GB200, 128).placed(value)


def test_the_issue_job_ep_all_to_all_moves_off_the_nics_with_64_per_rack():
    """dp 128 · ep 64 (issue #37): the EP all-to-all was costed on the NICs (ranks 64-127 span two
    racks); 64 GPUs of each rack put each EP group in one rack, so it runs at NVLink rates and every
    other term stays the same."""
    filled, placed = (planner.evaluate(model="qwen3-235b-a22b", hardware="gb200-nvl72", gpus=128, global_batch=8192,
                                       seq_len=4096, precision="mxfp8", runtime="megatron-bridge",
                                       layout=layout_for_batch(8192, dp=128, ep=64, zero_stage=1,
                                                                       gpus_per_nvlink_domain=u)) for u in (0, 64))
    assert placed.ep_comm_s < filled.ep_comm_s / 4
    assert placed.compute_s == filled.compute_s and placed.peak_memory_bytes == filled.peak_memory_bytes
    assert placed.placement.groups == (("ep", 64, 1), ("dp", 128, 2))
    assert filled.placement.groups == (("ep", 64, 2), ("dp", 128, 2))


def test_the_placed_all_to_all_is_the_nvlink_ring():
    # one EP group of 64 inside a rack: 63·α + 63/64·S/β on NVLink (900 GB/s, 3 µs)
    from costmodels.collectives import collective_time_s

    size = 2 ** 28
    placed = make_cluster(GB200, 128).placed(64)
    assert collective_time_s("all_to_all", size, 64, 1, placed, assumptions=EXACT) == pytest.approx(
        ring_time_s("all_to_all", size, 64, 3e-6, 900e9))


def _plan_json(*extra: str) -> dict:
    result = CliRunner().invoke(main, ["plan", *QWEN3_JOB, *extra, "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_plan_keeps_ep64_inside_racks_and_says_so_in_the_header():
    """The issue's done-when: with EP 64 (tp 1) on 128 GB200, the plan uses 64 GPUs of each rack, and
    its header names the placement."""
    table = CliRunner().invoke(main, ["plan", *QWEN3_JOB, "--ep", "64", "--tp", "1"])
    assert table.exit_code == 0, table.output
    text = " ".join(table.output.split())  # rich wraps at the terminal's width
    assert "placement: 64 of each 72-GPU NVLink domain (2 domains: 64 + 64); inside one: ep 64" in text
    doc = _plan_json("--ep", "64", "--tp", "1")
    best = doc["best"]
    assert best["layout"]["gpus_per_nvlink_domain"] == 64
    assert best["predicted"]["placement"]["groups"]["ep"] == {"degree": 64, "domains": 1}
    assert best["predicted"]["placement"]["domains"] == [64, 64]


def test_a_fixed_placement_is_searched_alone_and_recorded():
    doc = _plan_json("--ep", "64", "--tp", "1", "--gpus-per-nvlink-domain", "72")
    assert doc["inputs"]["narrowing"]["gpus_per_nvlink_domain"] == [72]
    assert all(plan["layout"]["gpus_per_nvlink_domain"] == 72 for plan in [doc["best"], *doc["candidates"]])
    assert doc["best"]["predicted"]["placement"]["groups"]["ep"]["domains"] == 2


@pytest.mark.parametrize("command", ["plan", "evaluate"])
def test_a_bad_placement_is_one_line_and_exit_2(command):
    layout = ["--dp", "128", "--tp", "1", "--pp", "1", "--ep", "64"] if command == "evaluate" else []
    result = CliRunner().invoke(main, [command, *QWEN3_JOB, *layout, "--gpus-per-nvlink-domain", "70"])
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1 and "--gpus-per-nvlink-domain 70" in result.output
    with pytest.raises(planner.AutoplanError, match="gpus_per_nvlink_domain=70"):
        planner.plan(model="qwen3-235b-a22b", hardware="gb200-nvl72", gpus=128, global_batch=8192, seq_len=4096,
                     gpus_per_nvlink_domain=[70])


def test_search_equals_brute_force_with_placements_dispatchers_and_ep_overlap():
    """A small rack-scale node (2 GPUs a node, 3 nodes a domain): 8 GPUs fill domains 6 + 2 or split
    4 + 4; both placements, the flex dispatcher and the EP overlap enter both solvers alike."""
    node = replace(GB200, gpus_per_node=2, nodes_per_nvlink_domain=3)
    cluster = make_cluster(node, 8)
    assert placement_choices(cluster.node.nvlink_domain_gpus, 2, 8) == (0, 4)
    training = TrainingSpec(global_batch_size=16, seq_len=512, runtime="megatron")
    model = load_model("tiny-mixtral")
    options = SearchOptions(gpus_per_nvlink_domain=(0, 4), moe_dispatchers=("alltoall", "hybridep"),
                            ep_comm_overlap=True)
    meshes = mesh_choices(model, training, 8, cluster.nvlink_domain_gpus, options)
    assert {m.gpus_per_nvlink_domain for m in meshes} == {0, 4} and "hybridep" in {m.moe_dispatcher for m in meshes}

    def cost_model() -> CostModel:
        return CostModel(Job(model=model, training=training, cluster=cluster, convention=CONVENTIONS["megatron"]))

    fast = solve(cost_model(), 8, cluster.nvlink_domain_gpus, options, top_k=4)
    slow = solve_brute_force(cost_model(), 8, cluster.nvlink_domain_gpus, options, top_k=4)
    assert [b.layout for b in fast.ranked] == [b.layout for b in slow.ranked]
    assert [b.step_time_s for b in fast.ranked] == [b.step_time_s for b in slow.ranked]
    assert fast.num_candidates == slow.num_candidates and fast.tied_in_mesh == slow.tied_in_mesh


def test_the_threshold_cut_is_kept_to_meshes_alone_in_their_band(monkeypatch):
    """Placements and dispatchers of one mesh share its band (``ranking.mesh_of``), so a twin visited
    later may still bring the band a plan at or below the threshold, and then its band: the cut of a
    whole mesh at the threshold (``Standings.whole_cutoff_s``) is asked only for degrees that one
    searched mesh holds (``test_search_equals_brute_force_with_placements_dispatchers_and_ep_overlap``
    checks the answer)."""
    import planner.search.solve as search_solve
    from planner.search.standings import Standings

    node = replace(GB200, gpus_per_node=2, nodes_per_nvlink_domain=3)
    cluster = make_cluster(node, 8)
    training = TrainingSpec(global_batch_size=16, seq_len=512, runtime="megatron")
    model = load_model("tiny-mixtral")
    options = SearchOptions(gpus_per_nvlink_domain=(0, 4), moe_dispatchers=("alltoall", "hybridep"))
    floored: dict[tuple, set] = {}
    whole: set = set()
    for name in ("_mesh_floor_s", "_cp_floor_s"):
        function = getattr(search_solve, name)

        def recording(cost_model, mesh, *args, function=function):
            floored.setdefault(mesh.degrees, set()).add(mesh)
            return function(cost_model, mesh, *args)
        monkeypatch.setattr(search_solve, name, recording)
    whole_cutoff_s = Standings.whole_cutoff_s

    def recording_whole(self, degrees, slack):
        whole.add(degrees)
        return whole_cutoff_s(self, degrees, slack)
    monkeypatch.setattr(Standings, "whole_cutoff_s", recording_whole)
    cost_model = lambda: CostModel(Job(model=model, training=training, cluster=cluster,
                                       convention=CONVENTIONS["megatron"]))
    assert solve(cost_model(), 8, cluster.nvlink_domain_gpus, options, top_k=3).ranked
    assert whole and any(len(meshes) > 1 for meshes in floored.values())
    assert all(len(floored[degrees]) == 1 for degrees in whole)


def test_the_slurm_job_asks_for_the_placement(tmp_path):
    plan = tmp_path / "plan.json"
    result = CliRunner().invoke(main, ["evaluate", *QWEN3_JOB, "--dp", "128", "--tp", "1",
                                       "--pp", "1", "--ep", "64", "--zero", "1", "--micro-batch", "8", "--recompute",
                                       "full", "--gpus-per-nvlink-domain", "64", "--out", str(plan)])
    assert result.exit_code == 0, result.output
    launched = CliRunner().invoke(main, ["launch", str(plan), "--out", str(tmp_path / "job")])
    assert launched.exit_code == 0, launched.output
    assert "#SBATCH --segment=16" in (tmp_path / "job" / "slurm.sbatch").read_text()  # 16 trays of each rack
