"""Uneven pipeline stages: the split forms, their rank assignment, the CLI options and the exports."""

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from costmodels.assignment import rank_layers
from costmodels.estimate import CostModel
from costmodels.job import Job
from costmodels.layout import Layout, check_layout
from costmodels.presets import load_model
from costmodels.stage_split import (StageSplitError, describe_split, first_last_split, megatron_first_last,
                                    parse_layers, weighted_split)
from costmodels.training import TrainingSpec
from hardware_specs import load_node, make_cluster
from planner.cli import main
from planner.launch import frameworks
from planner.search.space import SearchOptions, all_layouts


def test_megatron_first_last_on_the_405b_layout():
    # 126 layers, pp 16: 7 on the first and last rank, (126 - 14) / 14 = 8 on each middle rank.
    assert first_last_split(126, 16, 1, 7, 7) == (7,) + (8,) * 14 + (7,)
    assert megatron_first_last((7,) + (8,) * 14 + (7,), 16, 1) == (7, 7)


def test_megatron_first_last_spreads_a_rank_over_its_chunks():
    # pp 2 x v 2 over 20 layers, first rank 8: its chunks 0 and 2 take 4 each; rank 1 takes 12 (6 + 6).
    assert first_last_split(20, 2, 2, 8, None) == (4, 6, 4, 6)
    # pp 4 x v 2 over 28 layers, first 4 and last 6: middle ranks take (28 - 10) / 2 = 9, not divisible by v
    with pytest.raises(StageSplitError, match="middle pipeline ranks"):
        first_last_split(28, 4, 2, 4, 6)
    assert first_last_split(30, 4, 2, 4, 6) == (2, 5, 5, 3, 2, 5, 5, 3)
    assert megatron_first_last((2, 5, 5, 3, 2, 5, 5, 3), 4, 2) == (4, 6)


def test_first_last_split_errors_name_the_option():
    with pytest.raises(StageSplitError, match="first_stage_layers=7 must be a positive multiple of the 2"):
        first_last_split(126, 16, 2, 7, 7)
    with pytest.raises(StageSplitError, match="sum to 10"):
        first_last_split(10, 2, 1, 4, 4)


def test_forms_outside_megatrons_are_recognised():
    assert megatron_first_last((3, 4, 4, 3), 2, 2) is None  # rank 0 holds 3 and 4: unequal chunks
    assert megatron_first_last((1, 2, 3), 3, 1) == (1, 3) and megatron_first_last((1, 2, 3, 4), 4, 1) is None


def test_weighted_split_is_torchtitans_form():
    # (126 + 1 + 1) / 32 = 4 per chunk, the embedding and head one layer each on the end chunks
    assert weighted_split(126, 32, 1, 1) == (3,) + (4,) * 30 + (3,)
    # (10 + 2 + 0) over 4: 3 each; the first chunk gives 2 to the embedding
    assert weighted_split(10, 4, 2, 0) == (1, 3, 3, 3)
    assert weighted_split(4, 4, 2, 0) is None  # (6 over 4: 2,2,1,1) leaves the first chunk 0 layers
    assert describe_split((3,) + (4,) * 30 + (3,)) == "3,4x30,3"


def _cost_model(model="llama3-8b"):
    return CostModel(Job(model=load_model(model), training=TrainingSpec(global_batch_size=16, seq_len=1024),
                     cluster=make_cluster(load_node("h100-sxm-80gb"), 4)))


def test_uneven_interleaved_chunks_go_round_robin_to_ranks():
    # 32 layers as 5,3,4,4,... : chunk c of rank i is stage c*pp + i (pp 2, v 4)
    counts = (5, 3, 4, 4, 4, 4, 4, 4)
    layout = Layout(dp=2, pp=2, num_microbatches=8, schedule="interleaved", virtual_stages=4,
                    layers_per_chunk=counts)
    ranks = rank_layers(_cost_model(), layout)
    assert ranks[0].chunks == ((0, 5), (8, 12), (16, 20), (24, 28)) and ranks[0].num_layers == 17
    assert ranks[1].chunks == ((5, 8), (12, 16), (20, 24), (28, 32)) and ranks[1].num_layers == 15


def test_the_embedding_and_head_cost_where_they_sit():
    cm = _cost_model()
    layout = Layout(dp=2, pp=2, num_microbatches=8, schedule="interleaved", virtual_stages=2,
                    layers_per_chunk=(8, 8, 8, 8))
    even = cm.estimate(layout).stages
    # moving two layers off the head's rank lowers its memory and raises the first rank's
    moved = cm.estimate(Layout(dp=2, pp=2, num_microbatches=8, schedule="interleaved", virtual_stages=2,
                               layers_per_chunk=(9, 7, 9, 7))).stages
    assert moved[1].params_bytes < even[1].params_bytes and moved[0].params_bytes > even[0].params_bytes
    # with equal layers the head's rank holds more parameters (the 128k-vocabulary output layer)
    assert even[1].params_bytes > even[0].params_bytes


def test_interleaved_no_longer_needs_pp_v_to_divide_the_layers():
    model, training = load_model("llama3-405b"), TrainingSpec(global_batch_size=2048, seq_len=8192)
    layout = Layout(dp=128, tp=8, pp=16, num_microbatches=16, schedule="interleaved", virtual_stages=2,
                    sequence_parallel=True)
    check_layout(layout, model, training, 16384, 8)
    assert layout.chunk_layers(126) == (4,) * 30 + (3, 3)


def test_the_space_holds_interleaved_layouts_for_126_layers():
    model, training = load_model("tiny-llama"), TrainingSpec(global_batch_size=8, seq_len=256)
    from dataclasses import replace
    odd = replace(model, num_layers=7)
    found = {(L.pp, L.virtual_stages) for L in all_layouts(odd, training, 2, 2, SearchOptions())
             if L.schedule == "interleaved"}
    assert found == {(2, 2)}  # ceil(7 / 2) = 4: v in {2, 4}, and pp 2 x v 4 = 8 > 7 layers


def _exports(layout, model="llama3-8b"):
    """Megatron's arguments and torchtitan's ``[parallelism]`` for ``layout``'s pipeline, each under a
    ZeRO stage its job runs with pp (Megatron: the distributed optimizer; torchtitan: FSDP, no ZeRO-1)."""
    m, t = load_model(model), TrainingSpec(global_batch_size=16, seq_len=1024)
    args, _ = frameworks.megatron_args(m, t, replace(layout, zero_stage=1), 1024)
    config, _ = frameworks.torchtitan_config(model, m, t, replace(layout, zero_stage=3), 1024)
    return dict(zip(args, args[1:])), set(a for a in args if a.startswith("--")), config["parallelism"]


def test_exports_state_megatrons_uneven_form():
    layout = Layout(dp=2, pp=2, num_microbatches=8, schedule="interleaved", virtual_stages=2,
                    layers_per_chunk=(6, 10, 6, 10))
    value, options, titan = _exports(layout)
    assert value["--decoder-first-pipeline-num-layers"] == "12" and value["--decoder-last-pipeline-num-layers"] == "20"
    assert value["--num-virtual-stages-per-pipeline-rank"] == "2"
    assert "--num-layers-per-virtual-pipeline-stage" not in options and options <= frameworks.MEGATRON_OPTIONS
    parts = titan["module_fqns_per_model_part"]
    assert parts[0][:2] == ["tok_embeddings", "layers.0"] and len(parts[0]) == 7
    assert parts[-1][-3:] == ["layers.31", "norm", "output"] and sum(len(p) for p in parts) == 32 + 3


def test_exports_state_other_splits_as_a_layout_string():
    layout = Layout(dp=2, pp=2, num_microbatches=8, schedule="interleaved", virtual_stages=2,
                    layers_per_chunk=(7, 8, 9, 8))
    value, options, _ = _exports(layout)
    assert value["--pipeline-model-parallel-layout"] == "Et*7|t*8|t*9|t*8L"
    assert "--num-virtual-stages-per-pipeline-rank" not in options and options <= frameworks.MEGATRON_OPTIONS


def test_even_torchtitan_export_does_not_weigh_the_ends():
    _, _, titan = _exports(Layout(dp=2, pp=2, num_microbatches=8))
    assert titan["pipeline_parallel_layers_per_stage"] == 16
    assert titan["pipeline_parallel_first_stage_less_layers"] == 0 == titan["pipeline_parallel_last_stage_less_layers"]


JOB = ["--model", "llama3-8b", "--hardware", "h100-sxm-80gb", "--gpus", "4", "--global-batch", "16",
       "--seq-len", "1024", "--dp", "2", "--pp", "2", "--tp", "1", "--format", "json"]


def _cli(*extra):
    return CliRunner().invoke(main, ["evaluate", *JOB, *extra])


def test_cli_layers_per_chunk_reaches_the_layout():
    proc = _cli("--schedule", "interleaved", "--virtual-stages", "2", "--layers-per-stage", "7,9,7,9")
    assert proc.exit_code == 0, proc.output
    assert json.loads(proc.output)["layout"]["layers_per_chunk"] == [7, 9, 7, 9]


def test_layers_are_read_in_the_notation_plan_prints():
    for counts in [(3,) + (4,) * 30 + (3,), (7, 9, 7, 9), (8,) * 4, (1,)]:
        assert parse_layers(describe_split(counts)) == counts
    assert parse_layers("3, 4x2 ,3") == (3, 4, 4, 3)
    for bad in ("4x0", "4x", "x4", "4x2x2", "4y2", ""):
        with pytest.raises(StageSplitError, match="NxK"):
            parse_layers(bad)


def test_cli_accepts_the_printed_split_notation():
    a = _cli("--schedule", "interleaved", "--virtual-stages", "2", "--layers-per-stage", "7,9,7,9")
    b = _cli("--schedule", "interleaved", "--virtual-stages", "2", "--layers-per-stage", "7,9x1,7x1,9")
    c = _cli("--layers-per-stage", "16x2")
    assert a.exit_code == 0 and a.output == b.output
    assert c.exit_code == 0 and json.loads(c.output)["layout"]["layers_per_chunk"] == [16, 16]


def test_cli_first_last_form_equals_the_explicit_list():
    a = _cli("--first-stage-layers", "14")
    b = _cli("--layers-per-stage", "14,18")
    assert a.exit_code == 0 and a.output == b.output


@pytest.mark.parametrize("extra, message", [
    (("--layers-per-stage", "7,x"), "--layers-per-stage '7,x'"),
    (("--layers-per-stage", "10,10"), "must list 2 positive counts summing to 32"),
    (("--layers-per-stage", "16,16", "--first-stage-layers", "16"), "not both"),
    (("--first-stage-layers", "40"), "leave -8 of the 32 layers for the other 1 pipeline ranks"),
])
def test_cli_bad_splits_exit_2_with_one_line(extra, message):
    proc = _cli(*extra)
    assert proc.exit_code == 2 and message in proc.output and len(proc.output.strip().splitlines()) == 1


PLAN = ["plan", "--model", "tiny-llama", "--hardware", "a100-sxm-40gb", "--gpus", "4", "--global-batch", "8",
        "--seq-len", "256", "--format", "json"]


def test_plan_keeps_a_requested_first_last_split_and_both_solvers_agree():
    import planner
    kwargs = dict(model="tiny-llama", hardware="a100-sxm-40gb", gpus=4, global_batch=8, seq_len=256,
                  first_stage_layers=1, last_stage_layers=1)
    fast, slow = planner.plan(**kwargs), planner.plan(solver="brute-force", **kwargs)
    assert fast.best is not None
    assert fast.to_dict()["best"] == slow.to_dict()["best"]
    for plan in (fast.best, *fast.candidates):
        L = plan.layout
        assert L.pp > 1 and megatron_first_last(L.chunk_layers(4), L.pp, L.virtual_stages) == (1, 1)


def test_plan_cli_layers_per_chunk_restricts_pp_times_v():
    proc = CliRunner().invoke(main, [*PLAN, "--layers-per-stage", "1,3"])
    assert proc.exit_code == 0, proc.output
    doc = json.loads(proc.output)
    for plan in (doc["best"], *doc["candidates"]):
        assert plan["layout"]["layers_per_chunk"] == [1, 3] and plan["layout"]["pp"] == 2
    both = CliRunner().invoke(main, [*PLAN, "--layers-per-stage", "1,3", "--last-stage-layers", "3"])
    assert both.exit_code == 2 and "not both" in both.output
