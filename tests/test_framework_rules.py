"""Each runtime's job rules filter its search space level by level, and keep exactly what the rules accept."""

from __future__ import annotations

from dataclasses import replace

import pytest

import planner
from costmodels.capabilities import Narrowing, capabilities
from costmodels.presets import load_model
from costmodels.training import TrainingSpec
from planner.launch.export_problems import export_problems
from planner.search.framework_rules import layout_rule_problems
from planner.search.runtime_space import search_options
from planner.search.space import all_layouts

CASES = [
    # (runtime, model, gpus, global batch, seq len, precision): each has layouts its job rules refuse
    ("torchtitan", "tiny-llama", 8, 16, 128, "bf16"),  # DDP beside tp/pp/cp; tp without SP; ZeRO-0 with cp
    ("torchtitan", "tiny-mixtral", 8, 16, 64, "bf16"),
    ("megatron", "tiny-mixtral", 8, 16, 64, "bf16"),  # ep with tp needs SP; offload needs ZeRO-1
    ("megatron", "tiny-llama", 8, 16, 128, "fp8-blockwise"),  # bf16 Adam moments need ZeRO-1
    ("deepspeed", "tiny-gpt", 6, 12, 64, "bf16"),  # layers split evenly over stages only (pp 3 of 4 layers)
    ("torch", "tiny-mixtral", 8, 16, 64, "bf16"),
]


def _training(runtime: str, batch: int, seq: int, precision: str) -> TrainingSpec:
    if precision.startswith("fp8-"):
        return TrainingSpec(global_batch_size=batch, seq_len=seq, precision="fp8",
                            fp8_recipe=precision.removeprefix("fp8-"), runtime=runtime)
    return TrainingSpec(global_batch_size=batch, seq_len=seq, precision=precision, runtime=runtime)


@pytest.mark.parametrize("runtime, model_name, gpus, batch, seq, precision", CASES)
def test_runtime_space_is_its_table_space_filtered_by_its_job_rules(runtime, model_name, gpus, batch, seq,
                                                                    precision):
    """``planner.search.space`` checks the rules on the mesh, the state and the schedule choice apart;
    the layouts it keeps are exactly those of the table's space the rules accept as a whole."""
    model, training = load_model(model_name), _training(runtime, batch, seq, precision)
    options = search_options(capabilities(runtime), Narrowing(), "cuda")
    kept = list(all_layouts(model, training, gpus, 4, options))
    everything = list(all_layouts(model, training, gpus, 4, replace(options, job_rules="")))
    accepted = [L for L in everything if not layout_rule_problems(runtime, model, training, L)]
    assert kept == accepted and 0 < len(kept) < len(everything)


def test_torchtitan_plan_never_offers_what_its_job_refuses():
    """Before the search applied the job rules, torchtitan picks used DDP beside tp and pp (torchtitan's
    parallelize.py: 'DDP has not supported > 1D parallelism') and async TP in an eager job."""
    report = planner.plan(model="llama3-8b", hardware="h100-sxm-80gb", gpus=8, global_batch=64, seq_len=4096,
                          runtime="torchtitan", top_k=20)
    plan = report.to_plan_file()
    for entry in (plan.best, *plan.candidates):
        assert export_problems("torchtitan", plan.inputs.model_spec, plan.inputs.training, entry.layout) == []
