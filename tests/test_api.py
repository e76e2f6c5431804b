"""The Python API: light import, names or specs, same answer as the CLI, no mutation."""

import subprocess
import sys
from pathlib import Path

import pytest

import planner
from costmodels.presets import load_model
from hardware_specs import load_node
from planner.plan.plan_file import PlanFile

ROOT = Path(__file__).resolve().parents[1]


def test_import_and_plan_load_no_torch():
    code = ("import sys, planner; planner.plan(model='tiny-llama', hardware='cpu', gpus=2, global_batch=4, "
            "seq_len=128); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("package", ["planner", "costmodels", "profiles", "hardware_specs", "autoplan_base"])
def test_packages_import_from_this_repository(package):
    module = __import__(package)
    assert Path(module.__file__).resolve().parent == ROOT / package


def test_plan_accepts_spec_objects_and_matches_names():
    by_name = planner.plan(model="llama3-8b", hardware="h100-sxm-80gb", gpus=8, global_batch=64, seq_len=4096)
    by_spec = planner.plan(model=load_model("llama3-8b"), hardware=load_node("h100-sxm-80gb"), gpus=8,
                           global_batch=64, seq_len=4096)
    assert by_name.best.layout == by_spec.best.layout


def test_evaluate_step_time_is_microbatches_times_the_rank_time_plus_its_tail():
    # Without pipelining the step is m · (one micro-batch on the one rank) + that rank's per-step
    # tail (data-parallel sync left exposed, optimizer), computed here from the per-rank time
    # functions rather than from the breakdown's own terms.
    from costmodels.assignment import rank_layers
    from costmodels.rank_time import rank_times

    layout = planner.Layout(dp=4, tp=2, sequence_parallel=True, num_microbatches=16)
    job = planner.api.resolve_job(model="llama3-8b", hardware="h100-sxm-80gb", gpus=8, global_batch=64, seq_len=4096)
    b = planner.evaluate(model="llama3-8b", hardware="h100-sxm-80gb", gpus=8, global_batch=64, seq_len=4096,
                         layout=layout)
    cm = job.cost_model()
    (rank,) = rank_layers(cm, layout)
    t = rank_times(cm, layout, rank)
    assert t.tp_s > 0 and t.tail_s > 0
    assert b.step_time_s == pytest.approx(16 * t.per_microbatch_s + t.tail_s + b.overhead_s, rel=1e-12)
    assert b.bubble_s == 0
    for stage in b.stages:
        parts = [stage.params_bytes, stage.grads_bytes, stage.optimizer_bytes, stage.activations_bytes,
                 stage.buffers_bytes, stage.overhead_bytes]
        assert sum(parts) == pytest.approx(stage.total_bytes)
    assert 0 < b.mfu <= b.hfu < 1


def test_errors_are_value_errors_naming_the_field():
    with pytest.raises(ValueError, match="^gpus= must be"):
        planner.plan(model="llama3-8b", hardware="h100-sxm-80gb", gpus=-1, global_batch=64, seq_len=4096)
    with pytest.raises(planner.LayoutError, match="tp 3"):
        planner.evaluate(model="llama3-8b", hardware="h100-sxm-80gb", gpus=6, global_batch=6, seq_len=4096,
                         gpus_per_node=6, layout=planner.Layout(dp=2, tp=3, num_microbatches=3))


def test_report_json_round_trips():
    """Written, read back through the plan-file reader, written again: the same plan and bytes."""
    report = planner.plan(model="mixtral-8x7b", hardware="h100-sxm-80gb", gpus=32, global_batch=128, seq_len=4096)
    back = PlanFile.from_json(report.to_json())
    assert back.best.layout == report.best.layout and back.best.layout.ep == report.best.layout.ep
    assert [c.layout for c in back.candidates] == [c.layout for c in report.candidates]
    assert back.inputs.model_spec.moe == report.inputs.model_spec.moe
    assert back.to_json() == report.to_json()
    assert report.search["space_size"] == sum(report.rejected.values()) + 1 + len(report.candidates)


def test_moe_plan_uses_expert_parallelism_where_it_pays():
    report = planner.plan(model="mixtral-8x7b", hardware="h100-sxm-80gb", gpus=64, global_batch=256, seq_len=4096)
    layouts = [report.best.layout] + [c.layout for c in report.candidates]
    assert any(l.ep > 1 for l in layouts)


def test_sources_name_only_the_terms_the_layout_has():
    # The search costs many layouts on one cost model; a tp=1 plan must not list tp_comm.
    report = planner.plan(model="llama3-8b", hardware="h100-sxm-80gb", gpus=16, global_batch=64, seq_len=4096)
    for plan in (report.best, *report.candidates):
        sources = plan.sources
        assert ("tp_comm" in sources) == (plan.layout.tp > 1)
        assert ("pp_comm" in sources) == (plan.layout.pp > 1)
        assert sources["compute"] == "datasheet"


def test_import_and_plan_load_no_click_or_rich_either():
    # nor numpy: a plan without a profile reads no profile module (``profiles.fit`` imports numpy)
    code = ("import sys, planner; planner.plan(model='tiny-llama', hardware='cpu', gpus=2, global_batch=4, "
            "seq_len=128); print(sorted(m for m in ('click', 'rich', 'torch', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_profile_of_the_wrong_type_is_refused_naming_the_field():
    with pytest.raises(planner.SpecError, match="profile.*expected a name, a path or a spec object"):
        planner.plan(model="tiny-llama", hardware="cpu", gpus=2, global_batch=4, seq_len=128, profile=42)


def test_an_infeasible_plan_says_the_smallest_gpu_count_that_fits_as_a_number():
    report = planner.plan(model="llama3-70b", hardware="a100-sxm-40gb", gpus=4, global_batch=64, seq_len=8192)
    assert report.best is None and not report.feasible
    fit = report.no_fit
    assert isinstance(fit.smallest_fitting_gpus, int) and fit.smallest_fitting_gpus > 4
    # the count it names does fit, with the layout it names, and half of it does not
    again = planner.plan(model="llama3-70b", hardware="a100-sxm-40gb", gpus=fit.smallest_fitting_gpus,
                         global_batch=64, seq_len=8192)
    assert again.best is not None and again.no_fit is None
    L = fit.fitting_layout
    assert L.dp * L.tp * L.pp * L.cp == fit.smallest_fitting_gpus
    half = planner.plan(model="llama3-70b", hardware="a100-sxm-40gb", gpus=fit.smallest_fitting_gpus // 2,
                        global_batch=64, seq_len=8192)
    assert half.best is None
    # 70e9 params x (2 + 2 + 12) bytes of mixed-precision Adam states ~ 1.1 TB
    assert 1000 < fit.model_state_gib < 1200
    assert f"--gpus {fit.smallest_fitting_gpus} fits" in report.closest_misses[0].suggestions[1]


def test_the_fitting_gpu_count_is_found_inside_the_requested_micro_batch_sizes():
    report = planner.plan(model="llama3-70b", hardware="a100-sxm-40gb", gpus=4, global_batch=64, seq_len=8192,
                          micro_batch_sizes=[2])
    assert report.best is None and report.no_fit.fitting_layout.micro_batch_size == 2


def test_a_request_with_nothing_to_search_says_why_in_no_fit():
    report = planner.plan(model="tiny-llama", hardware="cpu", gpus=64, global_batch=1, seq_len=7)
    assert report.best is None and report.search["space_size"] == 0
    assert "nothing to search" in report.no_fit.reason and report.no_fit.smallest_fitting_gpus is None


@pytest.mark.parametrize("kwargs, api_words, flag_words", [
    (dict(model="llama9-8b"), "model=: unknown name", "--model: unknown name"),
    (dict(hardware="h100-sxm-80gbx"), "hardware=: unknown name", "--hardware: unknown name"),
    (dict(gpus=12), "gpus=12 is not a multiple", "--gpus 12 is not a multiple"),
    (dict(memory_fraction=2.0), "memory_fraction= must be", "'--memory-fraction'"),  # click checks the range
    (dict(first_stage_layers=8, layers_per_chunk=(8, 24)), "give either layers_per_chunk= or", "give either --layers-per-stage or"),
    (dict(top_k=0), "top_k= must be", "'--top'"),
])
def test_api_errors_name_keywords_and_the_cli_names_flags(kwargs, api_words, flag_words):
    from click.testing import CliRunner
    from planner.cli import main

    job = dict(model="llama3-8b", hardware="h100-sxm-80gb", gpus=16, global_batch=64, seq_len=4096)
    with pytest.raises(planner.AutoplanError) as err:
        planner.plan(**{**job, **kwargs})
    assert api_words in str(err.value) and "--" not in str(err.value).split(";")[0]
    flags = {"model": "--model", "hardware": "--hardware", "gpus": "--gpus", "memory_fraction": "--memory-fraction",
             "first_stage_layers": "--first-stage-layers", "layers_per_chunk": "--layers-per-stage", "top_k": "--top"}
    args = ["plan", "--global-batch", "64", "--seq-len", "4096"]
    for key, value in {**job, **kwargs}.items():
        if key not in ("global_batch", "seq_len"):
            args += [flags[key], ",".join(map(str, value)) if isinstance(value, tuple) else str(value)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and flag_words in result.output, result.output
