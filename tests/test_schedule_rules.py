"""The search's schedule choices under the job rules (``planner.search.schedule_rules``) equal the plain
ones (``space.schedule_choices``): counted in closed form, built with the rules asked once per value
of the fields they read; and those fields (``framework_rules.SCHEDULE_READS``) are all a rule reads."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest

from costmodels.capabilities import Narrowing, capabilities
from costmodels.layout import Layout
from costmodels.presets import load_model
from costmodels.training import TrainingSpec
from planner.search.framework_rules import MESH_READS, SCHEDULE_READS, layout_rule_problems
from planner.search.runtime_space import search_options
from planner.search.schedule_rules import SharedRuleChecks, num_runnable_schedules, runnable_schedules
from planner.search.space import (MeshChoice, PipelineChoice, ScheduleChoice, all_layouts, mesh_choices,
                                  pipeline_choices, schedule_choices)

RUNTIMES = tuple(SCHEDULE_READS)
CASES = [
    # (model, gpus, global batch, seq len, precision, options beside the runtime's)
    ("tiny-llama", 8, 16, 128, "bf16", {}),
    ("tiny-mixtral", 8, 16, 64, "bf16", {"ep_comm_overlap": True}),
    ("tiny-mixtral", 8, 16, 64, "fp32", {"ep_comm_overlap": True}),  # Megatron's EP overlap needs bf16
    ("tiny-gpt", 6, 12, 64, "bf16", {}),  # pp 3 of 4 layers: uneven splits (DeepSpeed splits evenly only)
    ("tiny-llama", 8, 16, 128, "bf16", {"first_stage_layers": 1}),  # Megatron's uneven form
]


def _options(runtime: str, extra: dict):
    return replace(search_options(capabilities(runtime), Narrowing(), "cuda"), **extra)


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("model_name, gpus, batch, seq, precision, extra", CASES)
def test_counted_and_built_schedules_equal_the_plain_ones(runtime, model_name, gpus, batch, seq, precision, extra):
    model = load_model(model_name)
    training = TrainingSpec(global_batch_size=batch, seq_len=seq, precision=precision, runtime=runtime)
    options = _options(runtime, extra)
    meshes = mesh_choices(model, training, gpus, 4, replace(options, job_rules=""))
    assert meshes
    shared = {rules: SharedRuleChecks(rules, model, training) for rules in (options, replace(options, job_rules=""))}
    for mesh in meshes:  # the meshes share their checks as the search shares them
        pipes = pipeline_choices(mesh, model, training, options)
        for rules in (options, replace(options, job_rules="")):
            check = shared[rules].of(mesh)
            plain = schedule_choices(mesh, model, training, rules, pipes)
            assert num_runnable_schedules(check, mesh, model, training, rules, pipes) == len(plain)
            assert runnable_schedules(check, mesh, model, training, rules, pipes) == plain
            kept_sp = (True,) if mesh.tp > 1 and seq % mesh.tp == 0 else (False,)
            assert runnable_schedules(check, mesh, model, training, rules, pipes, kept_sp) == \
                schedule_choices(mesh, model, training, rules, pipes, kept_sp)


def test_the_count_is_closed_form_in_the_pipeline_choices():
    """Megatron's rules read no micro-batching: the rules are asked once per (recomputation, SP,
    overlap) value and v, however many micro-batch sizes the mesh has."""
    model = load_model("llama3-8b")
    training = TrainingSpec(global_batch_size=4096, seq_len=4096, runtime="megatron")
    options = _options("megatron", {})
    mesh = next(m for m in mesh_choices(model, training, 64, 8, options) if m.pp == 4 and m.tp == 2)
    pipes = pipeline_choices(mesh, model, training, options)
    check = SharedRuleChecks(options, model, training).of(mesh)
    count = num_runnable_schedules(check, mesh, model, training, options, pipes)
    assert count == len(schedule_choices(mesh, model, training, options, pipes)) > 200
    assert len(check.answers) <= len({p.virtual_stages for p in pipes}) * 3 * 3


SCHEDULE_ONLY = tuple(f.name for f in fields(ScheduleChoice))


def _answer_classes(runtime: str, unread: set[str], **option_fields) -> list[tuple[int, int, bool]]:
    """For each case: (layouts, classes of layouts equal but in ``unread``, whether every class got one
    answer from the runtime's rules and some class passes), over the unfiltered space with ``option_fields``."""
    kept = [f.name for f in fields(Layout) if f.name not in unread]
    out = []
    for model_name, gpus, batch, seq, precision, extra in CASES:
        model = load_model(model_name)
        training = TrainingSpec(global_batch_size=batch, seq_len=seq, precision=precision, runtime=runtime)
        options = replace(_options(runtime, extra), job_rules="", **option_fields)
        answers: dict[tuple, set[bool]] = {}
        layouts = list(all_layouts(model, training, gpus, 4, options))
        for layout in layouts:
            key = tuple(getattr(layout, name) for name in kept)
            answers.setdefault(key, set()).add(not layout_rule_problems(runtime, model, training, layout))
        out.append((len(layouts), len(answers), all(len(seen) == 1 for seen in answers.values())
                    and any(True in seen for seen in answers.values())))
    return out


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_the_rules_read_no_schedule_field_beyond_their_reads(runtime):
    """Layouts of the unfiltered space that differ only in schedule fields a runtime's rules do not
    read (``SCHEDULE_READS``) get the same answer from its rules."""
    for layouts, classes, one_answer in _answer_classes(runtime, set(SCHEDULE_ONLY) - set(SCHEDULE_READS[runtime])):
        assert one_answer and classes < layouts, runtime


def test_pipeline_fields_are_schedule_fields():
    assert set(f.name for f in fields(PipelineChoice)) <= set(SCHEDULE_ONLY)


MESH_ONLY = tuple(f.name for f in fields(MeshChoice))


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_the_rules_read_no_mesh_field_beyond_their_reads(runtime):
    """Layouts of the unfiltered space that differ only in mesh fields a runtime's rules do not read
    (``MESH_READS``: what lets ``SharedRuleChecks`` share one set of answers among meshes) get the same
    answer from its rules, over two NVLink placements."""
    unread = set(MESH_ONLY) - set(MESH_READS[runtime])
    assert unread and set(MESH_READS[runtime]) <= set(MESH_ONLY)
    results = _answer_classes(runtime, unread, gpus_per_nvlink_domain=(0, 2))
    assert all(one_answer for _, _, one_answer in results), runtime
    assert any(classes < layouts for layouts, classes, _ in results)  # meshes differing in unread fields were met


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_meshes_share_a_check_only_where_they_agree_on_the_read_fields_and_the_neutral_state(runtime):
    model = load_model("tiny-llama")
    training = TrainingSpec(global_batch_size=16, seq_len=128, runtime=runtime)
    options = replace(_options(runtime, {}), gpus_per_nvlink_domain=(0, 2))
    shared = SharedRuleChecks(options, model, training)
    meshes = mesh_choices(model, training, 8, 4, options)
    checks = [shared.of(mesh) for mesh in meshes]
    assert len({id(c) for c in checks}) < len(meshes)
    for mesh, check in zip(meshes, checks):
        assert all(getattr(mesh, name) == getattr(check.mesh, name) for name in MESH_READS[runtime])
        assert check.state == SharedRuleChecks(options, model, training).of(mesh).state
