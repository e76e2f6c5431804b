"""Precision recipes: which GEMMs run in low precision, what the casts cost, what copies are kept.

A recipe is data. Each names the peak its low-precision GEMMs run at (``gemm_dtype``, a key of
``HardwareSpec.peak_flops_per_s``), the HBM bytes its cast kernels move per element quantised,
the extra weight copies a caching runtime keeps, whether FSDP2 (torchao) or Megatron's
distributed optimizer can all-gather the weights in low precision, and the optimizer-moment dtype.

What stays in 16 bits in every recipe (DeepSeek-V3 technical report, arXiv 2412.19437, Sec. 3.3.1:
"the embedding module, the output head, MoE gating modules, normalization operators, and
attention operators"; torchtitan's ``[mx] filter_fqns`` skips ``output`` by default; Transformer
Engine runs dot-product attention in bf16 unless ``NVTE_FP8_DPA`` is set): the LM head, the MoE
router, the attention core (scores and score-value product) and LoRA adapters. The weight GEMMs
of attention (q/k/v, output projection), of the MLP and of routed and shared experts run in low
precision.

Cast kernels (memory-bound, costed at HBM bandwidth by ``Rates.memory_time_s``), per 16-bit
element quantised (2 bytes read per pass); a GEMM ``(m×k)·(k×n)`` quantises its input X (m·k)
and weight W (k·n) in forward and its output gradient dY (m·n) in backward, each into the two
layouts the forward, input-gradient and weight-gradient GEMMs read (Hopper's FP8 GEMM takes only
the "TN" layout, so a transposed copy is written; block scales along K need a second
quantisation along the other axis):

- delayed tensorwise: the scale comes from the amax history, so one fused cast-transpose reads
  the tensor once and writes both fp8 layouts: 2 + 1 + 1 = 4 (Micikevicius et al. 2022, "FP8
  Formats for Deep Learning", arXiv 2209.05433, Sec. 4; Transformer Engine ``DelayedScaling``).
- current tensorwise: an amax pass first, then the cast-transpose: 2 + (2 + 1 + 1) = 6
  (Transformer Engine ``Float8CurrentScaling``; torchao ``tensorwise``).
- rowwise: each layout is scaled along its own axis, one fused amax+cast per layout:
  2 × (2 + 1) = 6 (torchao ``rowwise``, axiswise scales).
- blockwise (DeepSeek-V3 Sec. 3.3.2: 1×128 tiles for activations and gradients, 128×128 blocks
  for weights): tiles are local, so amax and cast fuse; X and dY need one quantisation per
  layout, 2 × (2 + 1) = 6; a 128×128 block's scale serves its transpose, so W is read once and
  written twice, 2 + 1 + 1 = 4.
- MXFP8 (OCP Microscaling spec v1.0: 32-element blocks, one E8M0 scale byte each): both layouts
  from one read, 2 + 2 × (1 + 1/32) = 4.0625 (Transformer Engine ``MXFP8BlockScaling``).
- NVFP4 (NVIDIA, "Pretraining Large Language Models with NVFP4", arXiv 2509.25149, Sec. 2-4:
  16-element blocks with an E4M3 scale byte and a per-tensor fp32 scale; 16×16 blocks for
  weights): an amax pass for the per-tensor scale, then both layouts from one read,
  2 + 2 + 2 × (0.5 + 1/16) = 5.125. Its random Hadamard transform (fused into the cast) and
  the bf16 layers it keeps are not costed.

Weight copies (bytes per low-precision weight element, on a runtime that caches them across
micro-batches, ``RuntimeConvention.caches_low_precision_weights``): Transformer Engine keeps the
quantised weight in both layouts with its scales for the whole step (``is_first_microbatch``):
2 bytes (fp8), 2 × (1 + 1/32) (MXFP8), 2 × (0.5 + 1/16) (NVFP4). With Megatron's
``--fp8-param-gather`` (the distributed optimizer's gather, ZeRO ≥ 1) the quantised parameter is
the compute parameter, replacing its 2-byte bf16 copy. torchao recasts each micro-batch and
frees the copies after the layer, so nothing persists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from autoplan_base.errors import SpecError

if TYPE_CHECKING:
    from .convention import RuntimeConvention

Fp8Recipe = Literal["delayed", "tensorwise", "rowwise", "blockwise"]
FP8_RECIPES: tuple[str, ...] = ("delayed", "tensorwise", "rowwise", "blockwise")
DEFAULT_FP8_RECIPE = "tensorwise"
"""What ``--precision fp8`` means without ``--fp8-recipe``: current tensorwise scaling (what the
cost model priced fp8 as before recipes existed)."""
LOW_PRECISION_GEMMS: tuple[str, ...] = ("attention_projections", "mlp", "experts")
HIGH_PRECISION_GEMMS: tuple[str, ...] = ("lm_head", "router", "attention_core", "lora")


@dataclass(frozen=True, slots=True, kw_only=True)
class PrecisionRecipe:
    """How one precision recipe computes, casts, holds and gathers (see the module docstring)."""

    name: str
    """``bf16``, ``fp16``, ``fp32``, ``fp8-delayed``, ``fp8-tensorwise``, ``fp8-rowwise``,
    ``fp8-blockwise``, ``mxfp8`` or ``nvfp4``."""
    gemm_dtype: str
    """Peak the low-precision GEMMs run at: ``fp8``, ``mxfp8``, ``nvfp4``; the 16/32-bit dtype otherwise."""
    low_precision_gemms: tuple[str, ...]
    """Which weight GEMMs run at ``gemm_dtype`` (``LOW_PRECISION_GEMMS``; empty for 16/32-bit)."""
    activation_cast_bytes_per_element: float
    """HBM bytes moved to quantise one element of X or dY into every layout it is read in."""
    weight_cast_bytes_per_element: float
    """HBM bytes moved to quantise one weight element into every layout it is read in."""
    weight_copy_bytes_per_param: float
    """Extra device bytes per low-precision weight element a caching runtime keeps (both layouts + scales)."""
    gathered_bytes_per_param: float
    """Bytes per low-precision weight element when the runtime all-gathers it quantised (0 = not supported)."""
    fsdp2_low_precision_all_gather: bool
    """torchao's ``enable_fsdp_float8_all_gather`` applies (tensorwise scaling only)."""
    optimizer_moment_bytes: int
    """Bytes per element of each Adam moment: 4 (fp32) or 2 (bf16, DeepSeek-V3 Sec. 3.3.1)."""
    source: str
    """Where the recipe is defined."""

    @property
    def is_low_precision(self) -> bool:
        return bool(self.low_precision_gemms)

    def cast_bytes(self, m: int, n: int, k: int) -> tuple[float, float]:
        """(forward, backward) HBM bytes of the cast kernels of one (m×k)·(k×n) GEMM: X and W in
        forward, dY in backward (module docstring)."""
        if not self.is_low_precision:
            return 0.0, 0.0
        a, w = self.activation_cast_bytes_per_element, self.weight_cast_bytes_per_element
        return a * m * k + w * k * n, a * m * n


def _sixteen_bit(name: str) -> PrecisionRecipe:
    return PrecisionRecipe(name=name, gemm_dtype=name, low_precision_gemms=(), activation_cast_bytes_per_element=0.0,
                           weight_cast_bytes_per_element=0.0, weight_copy_bytes_per_param=0.0,
                           gathered_bytes_per_param=0.0, fsdp2_low_precision_all_gather=False,
                           optimizer_moment_bytes=4, source="mixed precision (Micikevicius et al. 2018)")


def _low(name: str, dtype: str, *, act: float, weight: float, copy: float, gathered: float, fsdp2: bool,
         moment: int, source: str) -> PrecisionRecipe:
    return PrecisionRecipe(name=name, gemm_dtype=dtype, low_precision_gemms=LOW_PRECISION_GEMMS,
                           activation_cast_bytes_per_element=act, weight_cast_bytes_per_element=weight,
                           weight_copy_bytes_per_param=copy, gathered_bytes_per_param=gathered,
                           fsdp2_low_precision_all_gather=fsdp2, optimizer_moment_bytes=moment, source=source)


MX_BLOCK, NV_BLOCK = 32, 16
"""Elements per shared scale byte: OCP MX spec v1.0 (MXFP8), NVFP4 paper Sec. 2."""
_MX_BYTES = 1 + 1 / MX_BLOCK
_NV_BYTES = 0.5 + 1 / NV_BLOCK

RECIPES: dict[str, PrecisionRecipe] = {
    "fp32": _sixteen_bit("fp32"),
    "bf16": _sixteen_bit("bf16"),
    "fp16": _sixteen_bit("fp16"),
    "fp8-delayed": _low("fp8-delayed", "fp8", act=4, weight=4, copy=2, gathered=1, fsdp2=False, moment=4,
                        source="Transformer Engine DelayedScaling; Megatron --fp8-recipe delayed"),
    "fp8-tensorwise": _low("fp8-tensorwise", "fp8", act=6, weight=6, copy=2, gathered=1, fsdp2=True, moment=4,
                           source="Transformer Engine Float8CurrentScaling (Megatron --fp8-recipe tensorwise); "
                                  "torchao Float8Linear tensorwise (torchtitan [float8])"),
    "fp8-rowwise": _low("fp8-rowwise", "fp8", act=6, weight=6, copy=2, gathered=0, fsdp2=False, moment=4,
                        source="torchao Float8Linear rowwise (torchtitan [float8] recipe_name = \"rowwise\")"),
    "fp8-blockwise": _low("fp8-blockwise", "fp8", act=6, weight=4, copy=2, gathered=1, fsdp2=False, moment=2,
                          source="DeepSeek-V3 (arXiv 2412.19437) Sec. 3.3; Transformer Engine Float8BlockScaling "
                                 "(Megatron --fp8-recipe blockwise)"),
    "mxfp8": _low("mxfp8", "mxfp8", act=2 + 2 * _MX_BYTES, weight=2 + 2 * _MX_BYTES, copy=2 * _MX_BYTES,
                  gathered=_MX_BYTES, fsdp2=False, moment=4,
                  source="OCP MX v1.0; Transformer Engine MXFP8BlockScaling (Megatron --fp8-recipe mxfp8); "
                         "torchao MX (torchtitan [mx])"),
    "nvfp4": _low("nvfp4", "nvfp4", act=4 + 2 * _NV_BYTES, weight=4 + 2 * _NV_BYTES, copy=2 * _NV_BYTES,
                  gathered=_NV_BYTES, fsdp2=False, moment=4,
                  source="NVIDIA NVFP4 pretraining (arXiv 2509.25149); Megatron --fp4-format e2m1 --fp4-recipe nvfp4"),
}


def recipe_name(precision: str, fp8_recipe: str | None) -> str:
    """The ``RECIPES`` key of a training precision and its optional fp8 recipe."""
    if precision == "fp8":
        return f"fp8-{fp8_recipe or DEFAULT_FP8_RECIPE}"
    return precision


def precision_recipe(precision: str, fp8_recipe: str | None = None) -> PrecisionRecipe:
    """The recipe of ``precision`` (``fp8_recipe`` only with ``fp8``)."""
    if fp8_recipe is not None and precision != "fp8":
        raise SpecError(f"fp8_recipe {fp8_recipe!r} needs precision fp8, got precision {precision!r}; "
                        "drop --fp8-recipe or pass --precision fp8")
    if fp8_recipe is not None and fp8_recipe not in FP8_RECIPES:
        raise SpecError(f"fp8_recipe must be one of {', '.join(FP8_RECIPES)}, got {fp8_recipe!r}")
    name = recipe_name(precision, fp8_recipe)
    if name not in RECIPES:
        raise SpecError(f"precision must be one of fp32, bf16, fp16, fp8, mxfp8, nvfp4, got {precision!r}")
    return RECIPES[name]


def gathered_weight_bytes(recipe: PrecisionRecipe, convention: "RuntimeConvention", compute_bytes: int,
                          share: float) -> float:
    """Bytes per parameter element of an all-gathered (ZeRO-3 / FSDP2, or the distributed
    optimizer's parameter gather) weight, averaged over the model: the low-precision share moves
    quantised where the runtime gathers it so (torchao ``enable_fsdp_float8_all_gather``,
    tensorwise only; Megatron ``--fp8-param-gather`` / ``--fp4-param-gather``), the rest at
    ``compute_bytes``."""
    gathered = recipe.gathered_bytes_per_param
    if convention.torchao_low_precision and not recipe.fsdp2_low_precision_all_gather:
        gathered = 0.0
    if not gathered:
        return float(compute_bytes)
    return share * gathered + (1.0 - share) * compute_bytes


def cached_weight_copy_bytes(recipe: PrecisionRecipe, convention: "RuntimeConvention", elements: float,
                             share: float, *, quantised_params: bool, compute_bytes: int) -> float:
    """Device bytes a Transformer Engine runtime adds for the quantised weights of ``elements``
    held parameter elements (``weight_copy_bytes_per_param`` × the low-precision share). With
    ``quantised_params`` (Megatron's ``--fp8-param-gather``: "keep the compute param in fp8") the
    quantised copy replaces the ``compute_bytes`` 16-bit compute parameter instead of adding to
    it; torchao keeps no copy (module docstring)."""
    if convention.torchao_low_precision:
        return 0.0
    per_element = recipe.weight_copy_bytes_per_param - (compute_bytes if quantised_params else 0)
    return per_element * share * elements


SAVED_INPUT_BYTES: dict[str, float] = {"fp8": 1.0, "mxfp8": _MX_BYTES, "nvfp4": _NV_BYTES}
"""Bytes per element of a low-precision GEMM input kept for the weight gradient, by ``gemm_dtype``:
e4m3 (1), MXFP8 with one scale byte per 32 (OCP MX v1.0), NVFP4 with one per 16 (NVFP4 paper Sec. 2)."""


def saved_gemm_input_bytes(recipe: PrecisionRecipe, convention: "RuntimeConvention", compute_bytes: int) -> float:
    """Bytes per element of a low-precision GEMM's input as a Transformer Engine runtime keeps it
    for backward: TE's ``Linear`` and ``LayerNormLinear`` save the quantised input they computed with
    (the column-wise copy the wgrad GEMM reads), not the 16-bit tensor (Transformer Engine,
    ``transformer_engine/pytorch/module/linear.py``, ``_Linear.forward``: ``saved_inputmat`` is the
    cast ``inputmat`` under fp8). torchao recasts from the 16-bit input it keeps, and 16-bit
    training keeps ``compute_bytes``."""
    if not recipe.is_low_precision or convention.torchao_low_precision:
        return float(compute_bytes)
    return SAVED_INPUT_BYTES[recipe.gemm_dtype]
