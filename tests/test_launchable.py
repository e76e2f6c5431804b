"""One launchability rule: every layout ``plan --launchable`` returns is one ``launch`` accepts."""

from __future__ import annotations

import pytest

import planner
from planner.launch.job import check_plan

CASES = [
    # gpt3-1.3b ties its embeddings: the launched job splits them over tp and shares them across pp
    dict(model="gpt3-1.3b", hardware="a100-sxm-80gb", gpus=16, global_batch=64, seq_len=2048),
    dict(model="tiny-gpt", hardware="cpu", gpus=4, global_batch=8, seq_len=64, precision="fp32"),
    dict(model="tiny-llama", hardware="cpu", gpus=4, global_batch=8, seq_len=128, precision="fp32"),
    dict(model="tiny-mixtral", hardware="cpu", gpus=4, global_batch=8, seq_len=64, precision="fp32"),
    dict(model="llama3-8b", hardware="h100-sxm-80gb", gpus=16, global_batch=32, seq_len=4096),
]


@pytest.mark.parametrize("case", CASES, ids=[c["model"] for c in CASES])
def test_every_launchable_plan_is_accepted_by_launch(case):
    report = planner.plan(launchable=True, top_k=8, **case)
    assert report.best is not None
    plan = report.to_plan_file()
    for entry in (plan.best, *plan.candidates):
        check_plan(plan.with_best(entry))  # raises PlanFileError naming the first problem


def test_offload_lora_and_tied_embeddings_under_tp_and_pp_are_launchable():
    """Issue 13 lifted these refusals: the job applies FSDP2 CPU offload, LoRA (also under tp), and a
    tied table split over tp (vocab-parallel) or shared across pp (gradient summed)."""
    from costmodels.layout import Layout
    from costmodels.presets import load_model
    from costmodels.training import TrainingSpec
    from planner.search.launchable import launch_problems

    tied, full = load_model("tiny-gpt"), TrainingSpec(global_batch_size=8, seq_len=64)
    lora = TrainingSpec(global_batch_size=8, seq_len=64, lora_rank=8)
    accepted = [(tied, full, Layout(dp=1, tp=2, pp=2, num_microbatches=8)),
                (tied, full, Layout(dp=4, zero_stage=3, optimizer_offload=True, num_microbatches=2)),
                (tied, lora, Layout(dp=2, pp=2, num_microbatches=4))]
    accepted.append((tied, lora, Layout(dp=1, tp=2, sequence_parallel=True, num_microbatches=8)))
    for model, training, layout in accepted:
        assert launch_problems(model, training, layout) == [], layout


@pytest.mark.parametrize("case", CASES[1:], ids=[c["model"] for c in CASES[1:]])
def test_launchable_space_is_the_space_filtered_by_launch_problems(case):
    """The level-by-level filter in ``planner.search.space`` keeps exactly the layouts the rule accepts."""
    from costmodels.presets import load_model
    from costmodels.training import TrainingSpec
    from planner.search.launchable import launch_problems
    from planner.search.space import LAUNCHABLE, SearchOptions, all_layouts

    model = load_model(case["model"])
    training = TrainingSpec(global_batch_size=case["global_batch"], seq_len=case["seq_len"], runtime="torch")
    gpus, per_node = case["gpus"], 2
    kept = list(all_layouts(model, training, gpus, per_node, SearchOptions(**LAUNCHABLE)))
    everything = list(all_layouts(model, training, gpus, per_node, SearchOptions()))
    accepted = [L for L in everything if not launch_problems(model, training, L)]
    assert kept == accepted and 0 < len(kept) < len(everything)


def test_refusals_name_only_options_that_exist():
    import re

    from costmodels.layout import Layout
    from costmodels.presets import load_model
    from costmodels.training import TrainingSpec
    from planner.cli.plan import evaluate_command, plan_command
    from planner.search.launchable import launch_problems

    real = {opt for cmd in (plan_command, evaluate_command) for p in cmd.params for opt in p.opts}
    layouts = [Layout(dp=1, cp=3, num_microbatches=8), Layout(dp=4, ep=2, hsdp_shard_degree=2, zero_stage=3,
                                                               num_microbatches=2),
               Layout(dp=2, optimizer_offload=True, num_microbatches=4), Layout(dp=1, pp=2, num_microbatches=1),
               Layout(dp=1, tp=2, num_microbatches=8)]
    for model in ("tiny-gpt", "tiny-mixtral"):
        for layout in layouts:
            for problem in launch_problems(load_model(model), TrainingSpec(global_batch_size=8, seq_len=64), layout):
                named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", problem))
                assert named and named <= real, problem
