"""Issue 38: when the user's narrowing options leave nothing to search, the error names the option and
the rule that excludes its values (exit 2; the API raises ``NarrowingError``), apart from "nothing
fits" (exit 1; the API's ``best is None`` with ``no_fit``), which stays for capacity."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from planner import api
from planner.cli import main
from costmodels.stage_split import StageSplitError
from planner.search.runtime_space import NarrowingError

JOB = dict(model="llama3-70b", hardware="h100-sxm-80gb", gpus=64, global_batch=512, seq_len=8192)
ARGV = ["--model", "llama3-70b", "--hardware", "h100-sxm-80gb", "--gpus", "64", "--global-batch", "512",
        "--seq-len", "8192"]


@pytest.mark.parametrize("options, keywords, says", [
    (["--tp", "16"], dict(tp=[16]), "crosses the NVLink domain of 8 GPUs"),
    (["--zero-stages", "3", "--pp", "4"], dict(zero_stages=[3], pp=[4]),
     "megatron cannot combine ZeRO stage 3 with pipelining"),
    (["--runtime", "deepspeed", "--zero-stages", "2", "--pp", "2"], dict(runtime="deepspeed", zero_stages=[2], pp=[2]),
     "deepspeed cannot combine ZeRO stage 2 with pipelining"),
    (["--ep", "2,4"], dict(ep=[2, 4]), "llama3-70b is dense"),
    (["--moe-dispatchers", "deepep"], dict(moe_dispatchers=["deepep"]), "llama3-70b is dense"),
])
def test_a_narrowing_that_excludes_everything_is_bad_input_naming_the_option(options, keywords, says):
    result = CliRunner().invoke(main, ["plan", *ARGV, *options])
    assert result.exit_code == 2, result.output
    line = [ln for ln in result.output.splitlines() if ln.startswith("error:")]
    assert len(line) == 1 and says in line[0] and "change --gpus" not in line[0]
    narrowed = [o for o in options if o.startswith("--") and o != "--runtime"]
    assert all(o in line[0] for o in narrowed)
    with pytest.raises(NarrowingError, match=says) as raised:  # the API: a distinct error, naming tp= etc.
        api.plan(**JOB, **keywords)
    assert all(f"{k}=" in str(raised.value) for k in keywords if k != "runtime")


def test_a_pipeline_degree_past_the_layers_is_refused_only_when_no_other_is_left():
    from costmodels.capabilities import Narrowing, capabilities
    from costmodels.presets import load_model
    from costmodels.training import TrainingSpec
    from planner.search.narrowing_conflicts import narrowing_conflicts

    model, table = load_model("llama3-8b"), capabilities("megatron")
    training = TrainingSpec(global_batch_size=512, seq_len=4096)

    def conflicts(pp):
        return narrowing_conflicts(table, Narrowing(pp=pp), model, training, gpus=64, domain_gpus=8,
                                   cross_node_tp=False)

    assert conflicts((2, 64)) == []  # pp 2 is left to search
    [line] = conflicts((64,))
    assert line.startswith("--pp 64: pp 64 is more than the 32 layers")
    with pytest.raises(NarrowingError, match="pp 64 is more than the 32 layers"):
        api.plan(model="llama3-8b", hardware="h100-sxm-80gb", gpus=64, global_batch=512, seq_len=4096, pp=[64])


def test_capacity_is_still_nothing_fits():
    report = api.plan(model="llama3-405b", hardware="h100-sxm-80gb", gpus=8, global_batch=64, seq_len=4096)
    assert report.best is None and report.no_fit is not None
    assert report.no_fit.smallest_fitting_gpus is not None
    # the count found needs the optimizer states in CPU memory, and the reason says so
    assert report.no_fit.fitting_layout.optimizer_offload and "offloaded to CPU memory" in report.no_fit.reason


def test_virtual_stages_search_pipelines_only_and_name_the_rule_when_none_takes_them():
    small = dict(model="llama3-8b", hardware="h100-sxm-80gb", gpus=8, global_batch=64, seq_len=4096)
    best = api.plan(**small, virtual_stages=[2]).best.layout
    assert best.pp > 1 and best.virtual_stages == 2  # not a pp 1 layout, which has no virtual stages
    with pytest.raises(NarrowingError, match=r"virtual_stages= 3: virtual stages must divide the layers per "
                                             r"pipeline stage, which are 16, 8, 4"):
        api.plan(**small, virtual_stages=[3])


def test_evaluate_warns_of_a_layout_its_runtime_cannot_run():
    result = CliRunner().invoke(main, ["evaluate", *ARGV, "--dp", "16", "--tp", "2", "--pp", "2",
                                                       "--schedule", "zb-v", "--virtual-stages", "2"])
    assert result.exit_code == 0, result.output
    assert "warning: layout.schedule = zb-v: megatron runs 1f1b, interleaved only" in result.stderr
    assert "'autoplan launch' refuses it" in result.stderr and "warning" not in result.stdout


def test_a_peak_over_the_cap_never_reads_fits():
    """evaluate printed 'peak memory 64.6 ... of 63.6 the fit rule allows (fits, but ... memory risk)'."""
    from rich.console import Console

    from planner.plan.plan_file import PlanEntry
    from planner.plan.render import print_plan
    from costmodels.layout import Layout

    report = api.plan(model="llama3-8b", hardware="h100-sxm-80gb", gpus=8, global_batch=64, seq_len=4096)
    predicted = json.loads(report.to_json())["best"]["predicted"]
    predicted.update(fits=False, peak_memory_gib=64.6, memory_capacity_gib=63.6)
    predicted["band"]["memory_risk"] = True
    console = Console(record=True, width=200)
    print_plan(console, PlanEntry(layout=Layout(dp=8, micro_batch_size=1, num_microbatches=8), predicted=predicted),
               "best")
    text = console.export_text()
    assert "of 63.6 the fit rule allows (does not fit)" in text and "fits, but" not in text


@pytest.mark.parametrize("options, keywords, says", [
    (["--layers-per-stage", "40,41", "--pp", "2"], dict(layers_per_chunk=(40, 41), pp=[2]), "adds up to 81 layers"),
    (["--layers-per-stage", "1,1"], dict(layers_per_chunk=(1, 1)), "adds up to 2 layers; llama3-70b has 80"),
    (["--layers-per-stage", "40,40", "--pp", "4"], dict(layers_per_chunk=(40, 40), pp=[4]),
     "its 2 chunks need a pipeline of pp x virtual stages = 2"),
    (["--first-stage-layers", "100"], dict(first_stage_layers=100), "from 1 to 79"),
    (["--first-stage-layers", "50", "--last-stage-layers", "40"], dict(first_stage_layers=50, last_stage_layers=40),
     "is 90; llama3-70b has 80 layers"),
])
def test_a_split_no_pipeline_takes_is_bad_input_naming_it(options, keywords, says):
    """A split to keep (``--layers-per-stage``, ``--first/last-stage-layers``) that does not add up to
    the model's layers, or that no pipeline the other options allow takes, is refused before or
    instead of a search, naming the option (it planned a smaller model, or crashed, or blamed the
    global batch)."""
    result = CliRunner().invoke(main, ["plan", *ARGV, *options])
    assert result.exit_code == 2, result.output
    line = [ln for ln in result.output.splitlines() if ln.startswith("error:")]
    assert len(line) == 1 and says in line[0], result.output
    assert options[0] in line[0] and "--global-batch" not in line[0]
    with pytest.raises(StageSplitError, match=says):
        api.plan(**JOB, **keywords)


def test_a_split_that_adds_up_is_kept():
    report = api.plan(**JOB, layers_per_chunk=(40, 40))
    assert report.best.layout.layers_per_chunk == (40, 40)


def test_a_split_is_not_blamed_when_no_mesh_takes_the_batch():
    """With a global batch no data-parallel degree divides, nothing is searched whatever the split:
    the answer stays 'nothing to search' on the batch (exit 1), not an error on the split."""
    report = api.plan(model="tiny-llama", hardware="h100-sxm-80gb", gpus=128, global_batch=1, seq_len=2,
                      layers_per_chunk=(2, 2))  # 4 layers, tp <= 8, cp | 2: dp >= 4
    assert report.best is None and "not a multiple of any data-parallel degree" in report.no_fit.reason
