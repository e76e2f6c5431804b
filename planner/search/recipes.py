"""The frameworks' own published recipes, and the rule that a pick is at least as fast as the one
for its job.

A recipe is a framework's published layout for a model at a sequence length: parallel degrees,
micro-batch, ZeRO stage, recomputation, read in the framework's source at a commit. It fixes no GPU
count or global batch: on a job it takes every GPU its degrees leave as data parallelism and the
micro-batches the job's batch needs (``recipe_layout``), or does not apply, and says why.

The rule (``apply_recipe``, issue #37 item 6): when the runtime's recipe for the job fits and the
model rates it faster than the pick, the pick is the least risky plan (``ranking.tie_key``) among
those at least as fast, the recipe itself among them; otherwise the plan states why the recipe lost
or did not apply (``SearchStats.recipe``).
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan_base.errors import AutoplanError
from costmodels.bands import Band
from costmodels.breakdown import CostBreakdown
from costmodels.estimate import CostModel
from costmodels.layout import Layout, check_layout
from costmodels.model_spec import ModelSpec
from costmodels.presets import load_model
from costmodels.tie_band import TieBand
from .framework_rules import layout_rule_problems
from .ranking import rank_key, tie_key
from .space import SearchOptions

_MB = "NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/recipes/llama/llama3.py @0d5f5558"
_TT = "pytorch/torchtitan torchtitan/models/llama3/train_configs/{} @{}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Recipe:
    """One framework's published layout for one model at one sequence length."""

    name: str
    """The recipe's name in its framework (a config function or file)."""
    runtimes: tuple[str, ...]
    """The runtimes it is the framework's recipe for (``TrainingSpec.runtime``)."""
    model: str
    """The model preset it trains (``ModelSpec.name``)."""
    seq_len: int
    """Tokens per sequence it is written for."""
    tp: int = 1
    pp: int = 1
    cp: int = 1
    virtual_stages: int = 1
    """Model chunks per pipeline rank (interleaved 1F1B above 1)."""
    micro_batch_size: int = 1
    zero_stage: int = 0
    """Autoplan's ZeRO stage for its data-parallel sharding (``costmodels.capabilities``)."""
    recompute: str = "none"
    sequence_parallel: bool = False
    tp_comm_overlap: bool = False
    source: str
    """File and commit the values were read from."""


RECIPES: tuple[Recipe, ...] = (
    # Megatron-Bridge (and Megatron-Core, which it runs: Megatron-LM publishes no Llama-3 70B recipe):
    # llama3_70b_pretrain_config: TP 4, PP 4, VPP 5, CP 2, SP, tp_comm_overlap, mbs 1, distributed optimizer,
    # recompute_granularity None, seq 8192
    Recipe(name="llama3_70b_pretrain_config", runtimes=("megatron-bridge", "megatron"), model="llama3-70b",
           seq_len=8192, tp=4, pp=4, cp=2, virtual_stages=5, zero_stage=1, sequence_parallel=True,
           tp_comm_overlap=True, source=_MB),
    # llama3_8b_pretrain_config: TP 1, PP 1, CP 2, mbs 1, distributed optimizer, seq 8192
    Recipe(name="llama3_8b_pretrain_config", runtimes=("megatron-bridge",), model="llama3-8b", seq_len=8192, cp=2,
           zero_stage=1, source=_MB),
    # Megatron-LM's own example: TP 1, CP 1, PP 1, mbs 1, --use-distributed-optimizer, seq 8192
    Recipe(name="examples/llama/train_llama3_8b_h100_fp8.sh", runtimes=("megatron",), model="llama3-8b",
           seq_len=8192, zero_stage=1, source="NVIDIA/Megatron-LM examples/llama/train_llama3_8b_h100_fp8.sh @157006d6"),
    # torchtitan: FSDP over every data-parallel rank (data_parallel_shard_degree = -1, resharded after
    # forward: ZeRO-3), TP with sequence-parallel norms; training.batch_size per rank, seq 8192
    Recipe(name="llama3_8b.toml", runtimes=("torchtitan",), model="llama3-8b", seq_len=8192, zero_stage=3,
           recompute="op-sac", source=_TT.format("llama3_8b.toml", "f3534d77")),
    Recipe(name="llama3_70b.toml", runtimes=("torchtitan",), model="llama3-70b", seq_len=8192, tp=8,
           micro_batch_size=8, zero_stage=3, recompute="full", sequence_parallel=True,
           source=_TT.format("llama3_70b.toml", "f3534d77")),
    Recipe(name="llama3_405b.toml", runtimes=("torchtitan",), model="llama3-405b", seq_len=8192, tp=8,
           micro_batch_size=2, zero_stage=3, recompute="full", sequence_parallel=True, tp_comm_overlap=True,
           source=_TT.format("llama3_405b.toml", "e0d2de68")),
)
"""The recipes autoplan knows, each checked in its framework's source (``Recipe.source``)."""


ARCHITECTURE = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_kv_heads",
                "gated_mlp", "tied_embeddings", "moe", "mla")
"""The ``ModelSpec`` fields that make a model the one a recipe trains, whatever its name (a
development-set row names Llama 3 70B ``LLAMA3-70B``) or its tokenizer's vocabulary (Megatron-Bridge's
recipes train on a null tokenizer of their own size)."""


def recipe_for(runtime: str, model: ModelSpec, seq_len: int) -> Recipe | None:
    """The recipe of ``runtime``'s framework for ``model`` (its architecture, ``ARCHITECTURE``) at
    ``seq_len``, if it published one."""
    for recipe in RECIPES:
        if runtime in recipe.runtimes and recipe.seq_len == seq_len:
            preset = load_model(recipe.model)
            if all(getattr(model, f) == getattr(preset, f) for f in ARCHITECTURE):
                return recipe
    return None


def recipe_layout(recipe: Recipe, *, gpus: int, global_batch: int) -> Layout | str:
    """The recipe on a job of ``gpus`` GPUs and ``global_batch`` sequences, or why it does not apply:
    dp = gpus / (tp · pp · cp), micro-batches = global_batch / (dp · micro_batch_size)."""
    model_ranks = recipe.tp * recipe.pp * recipe.cp
    dp, left = divmod(gpus, model_ranks)
    if left or dp == 0:
        return f"its tp {recipe.tp} x pp {recipe.pp} x cp {recipe.cp} does not divide {gpus} GPUs"
    per_replica, left = divmod(global_batch, dp * recipe.micro_batch_size)
    if left or per_replica == 0:
        return f"global batch {global_batch} is not a multiple of dp {dp} x micro-batch {recipe.micro_batch_size}"
    return Layout(dp=dp, tp=recipe.tp, pp=recipe.pp, cp=recipe.cp, zero_stage=recipe.zero_stage,
                  micro_batch_size=recipe.micro_batch_size, num_microbatches=per_replica,
                  schedule="interleaved" if recipe.virtual_stages > 1 else "1f1b",
                  virtual_stages=recipe.virtual_stages, recompute=recipe.recompute,
                  sequence_parallel=recipe.sequence_parallel and recipe.tp > 1,
                  tp_comm_overlap=recipe.tp_comm_overlap and recipe.tp > 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class RecipeCheck:
    """The ranked plans after the rule, and what the plan says about the recipe."""

    ranked: tuple[CostBreakdown, ...]
    """The ranked plans, the pick first (unchanged unless the recipe was faster)."""
    statement: str
    """One line on the recipe and the pick (``SearchStats.recipe``): the recipe, then after ``; `` the
    verdict (``verdict``); empty without a recipe."""
    moved: bool = False
    """The rule changed the pick."""


def outside_request(layout: Layout, options: SearchOptions) -> str:
    """Why ``layout`` lies outside the space a request searched (its narrowing of the runtime's
    table, ``SearchOptions``), or "" where it lies inside."""
    degrees = (("tp", layout.tp, options.tp_degrees), ("pp", layout.pp, options.pp_degrees),
               ("cp", layout.cp, options.cp_degrees), ("ep", layout.ep, options.ep_degrees),
               ("micro-batch", layout.micro_batch_size, options.micro_batch_sizes))
    for name, value, allowed in degrees:
        if allowed and value not in allowed:
            return f"{name} {value} is outside the request ({', '.join(map(str, allowed))})"
    if layout.pp > 1 and options.virtual_stages and layout.virtual_stages not in options.virtual_stages:
        return f"vp {layout.virtual_stages} is outside the request"
    stages = options.pipelined_zero_stages if layout.pp > 1 else options.zero_stages
    if layout.zero_stage not in stages or layout.zero_stage not in options.zero_stages:
        return f"ZeRO-{layout.zero_stage} is outside the request or the runtime's table"
    if layout.recompute not in options.recompute_modes or layout.schedule not in options.schedules:
        return f"recompute {layout.recompute} or schedule {layout.schedule} is outside the request"
    if layout.tp_comm_overlap and not options.tp_comm_overlap:
        return "TP overlap is not searched here"
    if options.fixed_split:
        return "the request fixes the pipeline split"
    return ""


def apply_recipe(cost_model: CostModel, ranked: tuple[CostBreakdown, ...], *, gpus: int, band: TieBand,
                 memory_band: Band | None, options: SearchOptions) -> RecipeCheck:
    """The rule of the module docstring on ``ranked`` (the pick first), for ``cost_model``'s job and
    the space ``options`` searched: a recipe outside it (the request narrowed it away) is said to be."""
    model, training = cost_model.model, cost_model.training
    recipe = recipe_for(training.runtime, model, training.seq_len)
    if recipe is None:
        return RecipeCheck(ranked=ranked, statement="")
    named = f"{recipe.name} ({recipe.source.split(' ')[0].split('/')[-1]})"
    layout = recipe_layout(recipe, gpus=gpus, global_batch=training.global_batch_size)
    if isinstance(layout, str):
        return RecipeCheck(ranked=ranked, statement=f"recipe {named}; does not apply: {layout}")
    try:
        check_layout(layout, model, training, gpus, cost_model.cluster.gpus_per_node)
        costed = cost_model.estimate(layout)
    except AutoplanError as err:
        return RecipeCheck(ranked=ranked, statement=f"recipe {named}; does not apply: {str(err).split(';')[0]}")
    outside = outside_request(layout, options) or "; ".join(
        layout_rule_problems(training.runtime, model, training, layout, options.runtime_version))
    if outside:
        return RecipeCheck(ranked=ranked, statement=f"recipe {named}; does not apply: {outside}")
    shown = f"recipe {named}: {recipe_summary(recipe)}, {costed.step_time_s:.3f} s"
    if not costed.fits:
        return RecipeCheck(ranked=ranked, statement=f"{shown}; does not fit ({costed.peak_memory_bytes / 2**30:.1f} "
                                                    f"GiB against the fit rule's {costed.memory_capacity_bytes / 2**30:.1f})")
    if not ranked or rank_key(ranked[0]) <= rank_key(costed):
        pick = f"{ranked[0].step_time_s:.3f} s" if ranked else "none"
        return RecipeCheck(ranked=ranked, statement=f"{shown}; the pick is at least as fast ({pick})")
    as_fast = [b for b in ranked if rank_key(b) <= rank_key(costed)]
    same = next((b for b in as_fast if b.layout == costed.layout), None)
    candidates = as_fast + ([] if same else [costed])
    pick = min(candidates, key=lambda b: tie_key(b, memory_band, band))
    rest = tuple(sorted((b for b in ranked + ((costed,) if same is None else ()) if b is not pick), key=rank_key))
    which = "the recipe itself" if pick.layout == costed.layout else f"at least as fast ({pick.step_time_s:.3f} s)"
    return RecipeCheck(ranked=(pick,) + rest, moved=pick is not ranked[0],
                       statement=f"{shown}; faster than the tie rule's pick ({ranked[0].step_time_s:.3f} s): "
                                 f"picked {which}")


def recipe_summary(recipe: Recipe) -> str:
    """The recipe's own fields in one short phrase: ``tp 4 · pp 4 · cp 2 · vp 5 · ZeRO-1 · mb 1``."""
    parts = [f"tp {recipe.tp}", f"pp {recipe.pp}"] + ([f"cp {recipe.cp}"] if recipe.cp > 1 else []) \
        + ([f"vp {recipe.virtual_stages}"] if recipe.virtual_stages > 1 else []) \
        + [f"ZeRO-{recipe.zero_stage}", f"mb {recipe.micro_batch_size}"] \
        + ([f"recompute {recipe.recompute}"] if recipe.recompute != "none" else [])
    return " · ".join(parts)


def verdict(statement: str) -> str:
    """The verdict part of a ``RecipeCheck.statement`` (after its first ``; ``)."""
    return statement.split("; ", 1)[1] if "; " in statement else statement
