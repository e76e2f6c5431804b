"""Which machine a profile describes: the profile/cluster rule (issue 20, findings 1, 4 and 11).

Pure functions and the planner API; no torch.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import planner
import profiles
from costmodels.collectives import collective_time_and_source
from costmodels.layout import Layout
from hardware_specs import load_node, make_cluster
from planner.cli import main
from profiles import ProfileError, load_profile
from profiles.build import build_profile
from profiles.match import device_model, mixed_device_problems, profile_mismatches
from profiles.shapes import group_layouts

SHIPPED = Path(profiles.__file__).parent / "data" / "cpu-gloo-2proc.json"
H100_JOB = dict(model="llama3-8b", hardware="h100-sxm-80gb", gpus=8, global_batch=64, seq_len=4096)
H100_ARGS = ["--model", "llama3-8b", "--hardware", "h100-sxm-80gb", "--gpus", "8", "--global-batch", "64",
             "--seq-len", "4096", "--profile", str(SHIPPED)]


def _h100_profile(per_node: int = 8, nodes: int = 1, curves: list[dict] | None = None):
    """A made-up H100 profile (not a measurement): one all-reduce curve per given placement."""
    sizes = [4096 * 2**i for i in range(6)]
    raw = {"collectives": [{"op": "all_reduce", "dtype": "bf16", "sizes_bytes": sizes,
                            "median_time_s": [1e-5 + s / 1e11 for s in sizes], **c} for c in (curves or [])]}
    provenance = {"device_name": "NVIDIA H100 80GB HBM3", "num_devices": per_node * nodes,
                  "devices_per_node": per_node, "num_nodes": nodes}
    return build_profile(raw, device_type="cuda", provenance=provenance)


# --- finding 1: a profile is applied only to the machine it describes ---------------------------

def test_device_model_is_read_from_torch_and_datasheet_names() -> None:
    assert device_model("NVIDIA H100 80GB HBM3") == device_model("NVIDIA H100 SXM5 80GB (DGX H100)") == "H100"
    assert device_model("NVIDIA A100-SXM4-80GB") == "A100"
    assert device_model("AMD Instinct MI300X") == "MI300X"
    assert device_model("NVIDIA L40S") == "L40S"
    assert device_model("AMD EPYC") is None


def test_cpu_profile_on_h100_is_a_mismatch_naming_both_machines() -> None:
    cluster = make_cluster(load_node("h100-sxm-80gb"), 8)
    problems = profile_mismatches(load_profile(SHIPPED), cluster)
    assert problems and any("cpu" in p and "cuda" in p for p in problems)


def test_matching_profiles_have_no_problems() -> None:
    assert profile_mismatches(load_profile(SHIPPED), make_cluster(load_node("cpu"), 2)) == ()
    # One node of the profiled kind, planned as many nodes: the curves decide term by term.
    assert profile_mismatches(_h100_profile(), make_cluster(load_node("h100-sxm-80gb"), 64)) == ()


def test_other_gpu_model_and_bigger_nodes_are_mismatches() -> None:
    a100 = make_cluster(load_node("a100-sxm-80gb"), 8)
    assert any("A100" in p and "H100" in p for p in profile_mismatches(_h100_profile(), a100))
    four_per_node = _h100_profile(per_node=4)
    problems = profile_mismatches(four_per_node, make_cluster(load_node("h100-sxm-80gb"), 8))
    assert any("4" in p and "8" in p and "per node" in p for p in problems)


def test_plan_with_cpu_profile_on_h100_is_refused() -> None:
    with pytest.raises(ProfileError) as info:
        planner.plan(**H100_JOB, profile=str(SHIPPED))
    message = str(info.value)
    assert "\n" not in message
    assert "AMD EPYC" in message and "H100" in message and "profile_device_mismatch=ok" in message  # API wording


@pytest.mark.parametrize("command", ["plan", "evaluate"])
def test_cli_refuses_with_one_line_and_exit_2(command: str) -> None:
    layout = ["--dp", "8", "--tp", "1", "--pp", "1"] if command == "evaluate" else []
    result = CliRunner().invoke(main, [command, *H100_ARGS, *layout])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "AMD EPYC" in lines[0] and "H100" in lines[0]


def test_override_is_explicit_and_recorded_in_the_plan() -> None:
    report = planner.plan(**H100_JOB, profile=str(SHIPPED), profile_device_mismatch="ok", top_k=1)
    recorded = report.inputs.to_dict()["profile_device_mismatch"]
    assert recorded["allowed"] is True and any("cpu" in p for p in recorded["problems"])
    result = CliRunner().invoke(main, ["plan", *H100_ARGS, "--profile-device-mismatch", "ok", "--format", "json",
                                       "--top", "1"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["inputs"]["profile_device_mismatch"]["allowed"] is True
    with pytest.raises(ValueError, match="profile.device.mismatch"):
        planner.plan(**H100_JOB, profile=str(SHIPPED), profile_device_mismatch="maybe")


@pytest.mark.parametrize("command", ["plan", "evaluate"])
def test_the_table_marks_a_profile_of_other_devices(command: str) -> None:
    layout = ["--dp", "8", "--tp", "1", "--pp", "1"] if command == "evaluate" else []
    foreign = CliRunner().invoke(main, [command, *H100_ARGS, *layout, "--profile-device-mismatch", "ok"])
    assert foreign.exit_code == 0, foreign.output
    assert "warning: profile" in foreign.stdout and "measured on other devices" in foreign.stdout
    assert "device type cpu is not cuda" in foreign.stdout  # the problem is named
    matching = CliRunner().invoke(main, [command, *H100_ARGS[:-2], *layout])  # no profile: nothing to mark
    assert matching.exit_code == 0 and "other devices" not in matching.stdout


def test_matching_plans_record_nothing() -> None:
    report = planner.plan(model="tiny-llama", hardware="cpu", gpus=2, global_batch=8, seq_len=256,
                          profile=str(SHIPPED), top_k=1)
    assert "profile_device_mismatch" not in report.inputs.to_dict()


# --- finding 4: curves are keyed by (degree, ranks per node, node count) -----------------------

def test_a_curve_of_8_per_node_on_2_nodes_is_not_reused_for_16_nodes_of_one() -> None:
    profile = _h100_profile(per_node=8, nodes=2, curves=[{"num_ranks": 16, "ranks_per_node": 8, "num_nodes": 2}])
    h100 = load_node("h100-sxm-80gb")
    two_of_eight = make_cluster(h100, 16)
    sixteen_of_one = make_cluster(h100, 16, gpus_per_node=1)
    assert collective_time_and_source("all_reduce", 2**20, 16, 1, two_of_eight, profile)[1] == "profile"
    _, source = collective_time_and_source("all_reduce", 2**20, 16, 1, sixteen_of_one, profile)
    assert source == "datasheet"
    assert profile.collective_curve("all_reduce", 16, 1, 16) is None
    assert profile.collective_curve("all_reduce", 16, 8, 2) is not None


def test_group_layouts_carry_ranks_per_node_and_node_count() -> None:
    layouts = group_layouts(16, 8)
    keys = [(x.num_ranks, x.ranks_per_node, x.num_nodes) for x in layouts]
    assert (2, 1, 2) in keys and (2, 2, 1) in keys and (16, 8, 2) in keys and (4, 2, 2) in keys
    for layout in layouts:
        for group in layout.groups:
            per_node = {r // 8 for r in group}
            assert len(per_node) == layout.num_nodes
            assert max(sum(1 for r in group if r // 8 == n) for n in per_node) == layout.ranks_per_node


def test_version_2_files_migrate_spans_nodes_to_the_placement_they_measured(tmp_path: Path) -> None:
    shipped = load_profile(SHIPPED)
    assert {(c.op, c.num_ranks, c.ranks_per_node, c.num_nodes) for c in shipped.collectives} == \
        {(op, 2, 2, 1) for op in profiles.fit.COLLECTIVE_OPS}
    data = json.loads(SHIPPED.read_text())
    data["provenance"].update(num_devices=16, devices_per_node=8, num_nodes=2)
    data["collectives"] = [dict(data["collectives"][0], num_ranks=16, spans_nodes=True),
                           dict(data["collectives"][0], num_ranks=2, spans_nodes=True),
                           dict(data["collectives"][0], num_ranks=2, spans_nodes=False)]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    migrated = load_profile(old)
    assert [(c.num_ranks, c.ranks_per_node, c.num_nodes) for c in migrated.collectives] == \
        [(16, 8, 2), (2, 1, 2), (2, 2, 1)]


def test_old_cross_node_curve_without_node_shape_is_one_line_error(tmp_path: Path) -> None:
    data = json.loads(SHIPPED.read_text())
    del data["provenance"]["devices_per_node"]
    data["collectives"][0]["spans_nodes"] = True
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match="devices_per_node"):
        load_profile(old)


def test_evaluate_on_the_shipped_profile_still_uses_its_in_node_curve() -> None:
    b = planner.evaluate(model="tiny-llama", hardware="cpu", gpus=2, global_batch=8, seq_len=256,
                         layout=Layout(dp=1, tp=2, pp=1, num_microbatches=8), profile=SHIPPED)
    assert b.sources["tp_comm"] == "profile"


# --- finding 11: every rank's device, and mixed devices --------------------------------------

def test_mixed_devices_are_named_and_equal_ones_pass() -> None:
    h100 = {"host": "a", "device_name": "NVIDIA H100 80GB HBM3", "capability": [9, 0], "memory_bytes": 85 * 10**9}
    a100 = {**h100, "host": "b", "device_name": "NVIDIA A100-SXM4-80GB", "capability": [8, 0]}
    assert mixed_device_problems([h100, dict(h100, host="b")]) == ()
    (problem,) = mixed_device_problems([h100, h100, a100])
    assert "H100" in problem and "A100" in problem and "rank 2" in problem


def test_a_plan_file_costed_again_keeps_the_rule(tmp_path: Path) -> None:
    """validate, explain --plot and calibration rebuild the job from the plan file: a profile of
    another machine is refused there too, unless the plan recorded the override."""
    from planner.api import Job
    from planner.plan.plan_file import PlanFile

    plain = PlanFile.from_json(planner.plan(**H100_JOB, top_k=1).to_json())
    with pytest.raises(ValueError, match="profile"):
        Job.from_inputs(plain.inputs, profile=str(SHIPPED))
    allowed = PlanFile.from_json(planner.plan(**H100_JOB, profile=str(SHIPPED), profile_device_mismatch="ok",
                                              top_k=1).to_json())
    assert Job.from_inputs(allowed.inputs, profile=str(SHIPPED)).profile is not None
