"""Zero-bubble and DualPipe schedules (#12): layout rules, chunk placement, costing, launch rule,
exports and the plan file's record of a forced split."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

import planner
from costmodels.layout import SCHEDULES, Layout, LayoutError, check_layout
from costmodels.pipeline import PassTimes, schedule_bubble_s
from costmodels.presets import load_model
from costmodels.stage_split import rank_chunks
from costmodels.training import TrainingSpec
from planner.cli import main
from planner.launch import frameworks
from planner.search.launchable import launch_problems
from planner.plan.plan_file import PlanFileError

EVAL = dict(model="llama3-8b", hardware="h100-sxm-80gb", gpus=8, global_batch=64, seq_len=4096)
"""llama3-8b, 32 layers, on one node: pp 4 × dp 2, 16 micro-batches of 2 sequences."""


def _evaluate(schedule: str, v: int = 1, **layout) -> planner.CostBreakdown:
    base = dict(dp=2, pp=4, num_microbatches=16, micro_batch_size=2)
    return planner.evaluate(**EVAL, layout=Layout(**{**base, **layout}, schedule=schedule, virtual_stages=v))


def test_cli_schedule_names_are_the_layouts():
    from planner.cli.plan import SCHEDULE_NAMES

    assert SCHEDULE_NAMES == SCHEDULES


def test_cli_moe_dispatcher_names_are_the_layouts():
    from costmodels.layout import MOE_DISPATCHERS
    from planner.cli.plan import MOE_DISPATCHER_NAMES

    assert MOE_DISPATCHER_NAMES == MOE_DISPATCHERS


@pytest.mark.parametrize("layout, words", [
    (Layout(pp=2, num_microbatches=4, schedule="zb-v"), "needs --virtual-stages 2"),
    (Layout(pp=2, num_microbatches=2, schedule="zb-v", virtual_stages=2), "at least 3 micro-batches"),
    (Layout(pp=2, num_microbatches=3, schedule="dualpipe-v", virtual_stages=2), "at least 4 micro-batches"),
    (Layout(pp=2, num_microbatches=5, schedule="dualpipe"), "even"),
    (Layout(pp=2, num_microbatches=4, schedule="interleaved-zb"), "2 or more"),
    (Layout(pp=2, num_microbatches=4, schedule="zb-h1", virtual_stages=2), "need --schedule interleaved"),
    (Layout(pp=1, num_microbatches=4, schedule="zb-h1"), "needs pp > 1"),
])
def test_layout_rules_mirror_torchs_requirements(layout, words):
    with pytest.raises(LayoutError, match=re.escape(words)):
        check_layout(layout, load_model("tiny-llama"), TrainingSpec(global_batch_size=layout.num_microbatches,
                                                                    seq_len=64), layout.world_size, 8)


def test_v_and_dualpipe_placements():
    """V: rank i holds chunks i and 2p − 1 − i (torch's style="v"); DualPipe: i and p − 1 − i."""
    assert rank_chunks("zb-v", 4, 2) == [[0, 7], [1, 6], [2, 5], [3, 4]]
    assert rank_chunks("dualpipe", 4, 1) == [[0, 3], [1, 2], [2, 1], [3, 0]]
    assert rank_chunks("interleaved-zb", 2, 3) == [[0, 2, 4], [1, 3, 5]]


def test_dualpipe_holds_two_parameter_copies_and_dualpipev_one():
    """llama3-8b at pp 4: DualPipe rank 1 holds chunks 1 and 2 (16 of 32 layers), 1F1B rank 1 holds 8 and
    DualPipeV rank 1 holds chunks 1 and 6 of 8 (8 layers): parameters 2x, 1x."""
    one, dual, v = (_evaluate("1f1b"), _evaluate("dualpipe"), _evaluate("dualpipe-v", 2))
    assert dual.stages[1].params_bytes == pytest.approx(2 * one.stages[1].params_bytes)
    assert v.stages[1].params_bytes == pytest.approx(one.stages[1].params_bytes)


def test_zero_bubble_bubbles_are_the_closed_forms_on_hand_numbers():
    """p = 4, equal ranks with F = 2, B = 3, W = 1 s per micro-batch (all chunks):
    1F1B 3·(2+3+1) = 18; ZB-H1 3·(2+3−1) = 12; interleaved ZB v = 2: 12/2 = 6;
    ZB-V (chunks of half): 3·max(1.5, 2·(1.5−0.5)) = 6; DualPipeV 3·(2 + 6 − 1)/2 = 10.5;
    DualPipe (p/2 − 1)(F + 2B − W) = 1·7 = 7."""
    ranks = [PassTimes(forward_s=2.0, input_grad_s=3.0, weight_grad_s=1.0)] * 4
    got = {s: schedule_bubble_s(s, 4, v, ranks) for s, v in (("1f1b", 1), ("zb-h1", 1), ("interleaved-zb", 2),
                                                              ("zb-v", 2), ("dualpipe-v", 2), ("dualpipe", 1))}
    assert got == {"1f1b": 18.0, "zb-h1": 12.0, "interleaved-zb": 6.0, "zb-v": 6.0, "dualpipe-v": 10.5,
                   "dualpipe": 7.0}


def test_split_backward_keeps_the_step_and_shrinks_the_bubble():
    """Same work per micro-batch (compute equal to 1F1B's), smaller bubble; the terms still sum."""
    base, zb = _evaluate("1f1b"), _evaluate("zb-h1")
    assert zb.compute_s == pytest.approx(base.compute_s)
    assert 0 < zb.bubble_s < base.bubble_s
    cm = planner.api.resolve_job(**EVAL).cost_model()
    from costmodels.assignment import rank_layers
    from costmodels.rank_time import rank_times

    layout = zb.layout
    t = rank_times(cm, layout, rank_layers(cm, layout)[1])
    passes = t.passes()
    assert passes.total_s == pytest.approx(t.per_microbatch_s)
    assert 0 < passes.weight_grad_s <= passes.forward_s <= passes.input_grad_s  # the regime the forms assume


def test_dualpipe_overlap_hides_expert_all_to_all():
    """A MoE model with ep 2: DualPipeV's exposed EP time is below ZB-V's (same placement and memory
    rule, no overlap), and by no more than the EP time itself."""
    kw = dict(model="tiny-mixtral", hardware="h100-sxm-80gb", gpus=8, global_batch=32, seq_len=512)
    common = dict(dp=4, ep=2, pp=2, num_microbatches=8, micro_batch_size=1, virtual_stages=2)
    zbv = planner.evaluate(**kw, layout=Layout(**common, schedule="zb-v"))
    dpv = planner.evaluate(**kw, layout=Layout(**common, schedule="dualpipe-v"))
    assert zbv.ep_comm_s > 0
    assert 0 <= dpv.ep_comm_s < zbv.ep_comm_s


def test_launch_refuses_dualpipe_with_an_option_that_exists():
    from planner.cli.plan import evaluate_command, plan_command

    real = {opt for cmd in (plan_command, evaluate_command) for p in cmd.params for opt in p.opts}
    problems = launch_problems(load_model("tiny-llama"), TrainingSpec(global_batch_size=4, seq_len=64),
                               Layout(pp=2, num_microbatches=4, schedule="dualpipe"))
    assert len(problems) == 1 and "no DualPipe schedule" in problems[0]
    assert set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", problems[0])) <= real
    for schedule, v in (("zb-h1", 1), ("interleaved-zb", 2), ("zb-v", 2), ("dualpipe-v", 2)):
        assert not launch_problems(load_model("tiny-llama"), TrainingSpec(global_batch_size=4, seq_len=64),
                                   Layout(pp=2, num_microbatches=4, schedule=schedule, virtual_stages=v))


def test_exports_name_the_schedules():
    """torchtitan takes torch's schedule class names; what a framework cannot run (Megatron-LM: any of
    these; torchtitan: zb-h1 and DualPipe) is refused in one line naming the schedule, never exported
    as another schedule."""
    model, training = load_model("llama3-8b"), TrainingSpec(global_batch_size=64, seq_len=4096)
    names = {}
    for schedule, v in (("zb-h1", 1), ("interleaved-zb", 2), ("zb-v", 2), ("dualpipe-v", 2), ("dualpipe", 1)):
        kw = dict(dp=2, pp=4, num_microbatches=16, micro_batch_size=2, schedule=schedule, virtual_stages=v)
        refused = rf"^layout\.schedule = {schedule}: torchtitan runs 1f1b, gpipe, interleaved, interleaved-zb, zb-v, " \
                  r"dualpipe-v only \(the torchtitan job cannot run it as costed\)$"
        if schedule in ("zb-h1", "dualpipe"):
            with pytest.raises(PlanFileError, match=refused):
                frameworks.torchtitan_config("llama3-8b", model, training, Layout(zero_stage=3, **kw), 4096)
        else:
            config, _ = frameworks.torchtitan_config("llama3-8b", model, training, Layout(zero_stage=3, **kw), 4096)
            names[schedule] = config["parallelism"]["pipeline_parallel_schedule"]
        with pytest.raises(PlanFileError, match=rf"^layout\.schedule = {schedule}: megatron runs 1f1b, interleaved "
                                                r"only \(the megatron job cannot run it as costed\)$"):
            frameworks.megatron_args(model, training, Layout(zero_stage=1, **kw), 4096)
    assert names == {"interleaved-zb": "InterleavedZeroBubble", "zb-v": "ZBVZeroBubble", "dualpipe-v": "DualPipeV"}


def test_plan_file_records_the_forced_split():
    args = ["plan", "--model", "tiny-llama", "--hardware", "a100-sxm-40gb", "--gpus", "4", "--global-batch", "8",
            "--seq-len", "256", "--format", "json"]
    forced = json.loads(CliRunner().invoke(main, [*args, "--layers-per-chunk", "1,3"]).output)
    assert forced["inputs"]["layers_per_chunk"] == [1, 3]
    megatron = json.loads(CliRunner().invoke(main, [*args, "--first-stage-layers", "1"]).output)
    assert megatron["inputs"]["first_stage_layers"] == 1 and "layers_per_chunk" not in megatron["inputs"]
    free = json.loads(CliRunner().invoke(main, args).output)
    assert "layers_per_chunk" not in free["inputs"] and "first_stage_layers" not in free["inputs"]
    again = planner.read_plan_file.__module__  # the reader parses the field back
    from planner.plan.plan_file import PlanInputs

    assert PlanInputs.from_dict(forced["inputs"]).layers_per_chunk == (1, 3), again


def test_search_picks_a_new_schedule_and_brute_force_agrees():
    """tiny-llama on 4 CPU ranks: the new schedules are in the space, one of them wins, and branch and
    bound returns exactly what evaluating every layout returns."""
    kw = dict(model="tiny-llama", hardware="cpu", gpus=4, global_batch=8, seq_len=128, precision="fp32")
    fast, slow = planner.plan(**kw), planner.plan(solver="brute-force", **kw)
    assert fast.to_dict()["best"] == slow.to_dict()["best"]
    assert [c.layout for c in fast.candidates] == [c.layout for c in slow.candidates]
    # with no tie band a new schedule is the fastest plan of some mesh, in both solvers (inside the
    # measured band the plainer schedule wins the tie: the schedule's between-layout error is large)
    from costmodels.tie_band import MECHANISMS_IN_USE, TieBand
    from planner.api import resolve_job
    from planner.search.brute_force import solve_brute_force
    from planner.search.solve import solve
    from planner.search.space import SearchOptions

    exact = TieBand(band_rel=0.0, source="test: no band", mechanism_error_rel={m: 0.0 for m in MECHANISMS_IN_USE})
    cost_model = resolve_job(**kw).cost_model()
    results = [run(cost_model, 4, 4, SearchOptions(), 6, band=exact) for run in (solve, solve_brute_force)]
    assert [b.layout for b in results[0].ranked] == [b.layout for b in results[1].ranked]
    chosen = {b.layout.schedule for b in results[0].ranked}
    assert chosen & {"zb-h1", "interleaved-zb", "zb-v", "dualpipe-v", "dualpipe"}
