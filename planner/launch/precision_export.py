"""A plan's precision recipe in each framework's own option names, and what does not map.

Megatron-LM (``megatron/training/arguments.py``, ``_add_transformer_engine_args``):
``--fp8-format`` {e4m3, hybrid}, ``--fp8-recipe`` {tensorwise, delayed, mxfp8, blockwise},
``--fp8-param-gather`` (keeps the compute parameter in fp8 and all-gathers it so; ``validate_args``
requires the distributed optimizer or FSDP), ``--fp4-format`` {e2m1}, ``--fp4-recipe`` {nvfp4},
``--fp4-param-gather``; bf16 Adam moments by ``--use-precision-aware-optimizer`` with
``--exp-avg-dtype`` / ``--exp-avg-sq-dtype`` (optimizer group; ``validate_args`` maps the dtype
names). torchtitan v0.2.2 (``torchtitan/config/job_config.py``; converters registered as
``quantize.linear.float8`` / ``quantize.linear.mx`` in ``components/quantization/``): ``model.converters``,
``[quantize.linear.float8]``
``recipe_name`` {tensorwise, rowwise, rowwise_with_gw_hp}, ``enable_fsdp_float8_all_gather``,
``precompute_float8_dynamic_scale_for_fsdp``, ``filter_fqns``; ``[quantize.linear.mx]`` ``recipe_name`` {mxfp8},
``filter_fqns`` (skips ``output`` by default).
"""

from __future__ import annotations

from costmodels.layout import Layout
from costmodels.model_spec import ModelSpec
from costmodels.training import TrainingSpec

MEGATRON_PRECISION_OPTIONS = frozenset({
    "--fp8-format", "--fp8-recipe", "--fp8-param-gather", "--fp4-format", "--fp4-recipe", "--fp4-param-gather",
    "--use-precision-aware-optimizer", "--exp-avg-dtype", "--exp-avg-sq-dtype",
})
"""Megatron-LM options the precision export writes (module docstring)."""

TORCHTITAN_PRECISION_KEYS = frozenset({
    "model.converters", "quantize.linear.float8.recipe_name", "quantize.linear.float8.enable_fsdp_float8_all_gather",
    "quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp", "quantize.linear.float8.filter_fqns",
    "quantize.linear.mx.recipe_name", "quantize.linear.mx.filter_fqns",
})
"""torchtitan fields the precision export writes (``JobConfig.model``, ``Float8``, ``MX`` at 000204a4)."""

_MEGATRON_FP8 = {"fp8-delayed": ("hybrid", "delayed"), "fp8-tensorwise": ("hybrid", "tensorwise"),
                 "fp8-blockwise": ("e4m3", "blockwise"), "mxfp8": ("e4m3", "mxfp8")}
"""Recipe -> (--fp8-format, --fp8-recipe). hybrid = E4M3 forward, E5M2 gradients (Transformer
Engine's default for per-tensor scaling); DeepSeek-V3 (Sec. 3.3.2) and MXFP8 use E4M3 throughout."""


def megatron_precision_args(training: TrainingSpec, layout: Layout) -> tuple[list[str], list[str]]:
    """(argument tokens, untranslated notes) for the plan's precision recipe."""
    recipe, sharded = training.recipe, layout.zero_stage > 0
    if not recipe.is_low_precision:
        return {"bf16": ["--bf16"], "fp16": ["--fp16"]}.get(training.precision, []), []
    args, notes = ["--bf16"], []
    if recipe.name in _MEGATRON_FP8:
        fmt, name = _MEGATRON_FP8[recipe.name]
        args += ["--fp8-format", fmt, "--fp8-recipe", name] + (["--fp8-param-gather"] if sharded else [])
    elif recipe.name == "nvfp4":
        args += ["--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"] + (["--fp4-param-gather"] if sharded else [])
        notes.append("nvfp4: the NVFP4 paper keeps some first and last layers in bf16 "
                     "(--first-last-layers-bf16); the plan costs every layer in NVFP4")
    if recipe.optimizer_moment_bytes == 2:  # export_problems: only with the distributed optimizer (zero 1)
        args += ["--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"]
    return args, notes


def torchtitan_precision_sections(model: ModelSpec, training: TrainingSpec,
                                  layout: Layout) -> tuple[dict, list[str]]:
    """({section: {field: value}} to merge into the config, untranslated notes)."""
    recipe = training.recipe
    if not recipe.is_low_precision:
        return {}, []
    skip = ["output", "lm_head"] + (["router.gate"] if model.moe is not None else [])
    if recipe.name in ("fp8-tensorwise", "fp8-rowwise"):
        fsdp = layout.dp > 1 and layout.zero_stage > 0 and recipe.fsdp2_low_precision_all_gather
        float8 = {"recipe_name": recipe.name.removeprefix("fp8-"), "filter_fqns": skip}
        if fsdp:
            float8 |= {"enable_fsdp_float8_all_gather": True, "precompute_float8_dynamic_scale_for_fsdp": True}
        return {"model": {"converters": ["quantize.linear.float8"]}, "quantize.linear.float8": float8}, []
    if recipe.name == "mxfp8":
        return {"model": {"converters": ["quantize.linear.mx"]},
                "quantize.linear.mx": {"recipe_name": "mxfp8", "filter_fqns": skip}}, []
    raise AssertionError(f"recipe {recipe.name}: export_problems refuses it for torchtitan")
