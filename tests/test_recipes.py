"""planner/search/recipes.py: the frameworks' published recipes on a job, and the rule that the pick is
at least as fast as the one for its job or the plan says why not (issue #37, item 6)."""

from __future__ import annotations

import planner
from costmodels.presets import load_model
from planner.search.recipes import RECIPES, recipe_for, recipe_layout, verdict


def test_every_recipe_names_its_source_commit_and_a_known_runtime():
    from costmodels.capabilities import CAPABILITIES

    for recipe in RECIPES:
        assert "@" in recipe.source and set(recipe.runtimes) <= set(CAPABILITIES), recipe.name
        assert load_model(recipe.model).num_layers % (recipe.pp * recipe.virtual_stages) == 0, recipe.name


def test_the_recipe_takes_the_jobs_gpus_as_data_parallelism_and_its_batch_as_micro_batches():
    # Megatron-Bridge llama3_70b_pretrain_config: tp 4 · pp 4 · cp 2 · vp 5 · mbs 1 on 64 GPUs, batch
    # 512: dp = 64 / 32 = 2, micro-batches = 512 / (2 · 1) = 256, interleaved over 5 chunks
    recipe = recipe_for("megatron-bridge", load_model("llama3-70b"), 8192)
    layout = recipe_layout(recipe, gpus=64, global_batch=512)
    assert (layout.dp, layout.tp, layout.pp, layout.cp, layout.virtual_stages, layout.num_microbatches) == \
        (2, 4, 4, 2, 5, 256)
    assert layout.schedule == "interleaved" and layout.zero_stage == 1 and layout.sequence_parallel
    assert "does not divide 48 GPUs" in recipe_layout(recipe, gpus=48, global_batch=512)
    assert "not a multiple of dp 2" in recipe_layout(recipe, gpus=64, global_batch=7)


def test_a_recipe_is_found_by_architecture_runtime_and_sequence():
    from dataclasses import replace

    spec = load_model("llama3-70b")
    renamed = replace(spec, name="LLAMA3-70B", vocab_size=128000)  # a development-set row's spelling
    assert recipe_for("megatron", renamed, 8192).name == "llama3_70b_pretrain_config"
    assert recipe_for("megatron", spec, 4096) is None
    assert recipe_for("deepspeed", spec, 8192) is None  # Megatron-DeepSpeed publishes none for it
    assert recipe_for("torchtitan", spec, 8192).name == "llama3_70b.toml"


def test_a_recipe_that_does_not_fit_is_said_to_and_leaves_the_pick():
    # torchtitan's 70B recipe on 16 GPUs: FSDP 2 x tp 8 holds 70B over 16 ranks, more than an H100
    report = planner.plan(model="llama3-70b", hardware="h100-sxm-80gb", gpus=16, global_batch=16, seq_len=8192,
                          runtime="torchtitan")
    statement = report.search["recipe"]
    assert statement.startswith("recipe llama3_70b.toml (torchtitan): tp 8 · pp 1 · ZeRO-3 · mb 8")
    assert verdict(statement).startswith("does not fit")


def test_a_job_without_a_recipe_says_nothing_about_one():
    report = planner.plan(model="llama3-8b", hardware="h100-sxm-80gb", gpus=8, global_batch=64, seq_len=4096)
    assert report.search["recipe"] is None
    assert "recipe" not in report.to_plan_file().to_dict()["search"]


def test_a_recipe_the_request_narrowed_away_is_not_forced_on_it():
    report = planner.plan(model="llama3-70b", hardware="h100-sxm-80gb", gpus=64, global_batch=512, seq_len=8192,
                          tp=[8])
    assert report.best.layout.tp == 8
    assert verdict(report.search["recipe"]) == "does not apply: tp 4 is outside the request (8)"
