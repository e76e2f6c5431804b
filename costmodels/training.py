"""``TrainingSpec``: what is trained, on how much data per step, in which precision."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hardware_specs.checks import MAX_SEQ_LEN, MAX_TOKENS_PER_STEP, MAX_WIDTH, whole
from autoplan_base.errors import SpecError

from .precision import FP8_RECIPES, Fp8Recipe, PrecisionRecipe, precision_recipe

Precision = Literal["fp32", "bf16", "fp16", "fp8", "mxfp8", "nvfp4"]
Optimizer = Literal["adamw", "sgd"]
AttentionImpl = Literal["fused", "eager"]
Runtime = Literal["megatron", "megatron-bridge", "deepspeed", "torch", "torchtitan"]
ContextAttention = Literal["ring", "all_gather"]

PRECISIONS: tuple[str, ...] = ("bf16", "fp16", "fp8", "mxfp8", "nvfp4", "fp32")
OPTIMIZERS: tuple[str, ...] = ("adamw", "sgd")
LORA_TARGETS: tuple[str, ...] = ("q", "k", "v", "o", "gate", "up", "down")
RUNTIMES: tuple[str, ...] = ("megatron", "megatron-bridge", "deepspeed", "torch", "torchtitan")
CONTEXT_ATTENTIONS: tuple[str, ...] = ("ring", "all_gather")


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingSpec:
    """One training step: global batch, sequence length, precision and optimizer."""

    global_batch_size: int
    """Sequences per optimizer step (B in Narayanan et al. SC'21 eq. 3; in code B is element bytes)."""
    seq_len: int
    """Tokens per sequence, s."""
    precision: Precision = "bf16"
    """bf16/fp16: mixed precision with fp32 master weights; fp8, mxfp8, nvfp4: the weight GEMMs at
    that rate with the recipe's casts and copies (``costmodels.precision``), master weights and
    states as in bf16; fp32: everything in fp32 (CPU runs)."""
    fp8_recipe: Fp8Recipe | None = None
    """With fp8 only: delayed, tensorwise (current scaling), rowwise or blockwise (DeepSeek-V3);
    None = tensorwise."""
    optimizer: Optimizer = "adamw"
    """AdamW (two fp32 moments) or SGD with momentum (one)."""
    lora_rank: int = 0
    """0 = full fine-tuning/training; r > 0 = LoRA adapters of rank r on ``lora_targets``."""
    lora_targets: tuple[str, ...] = ("q", "k", "v", "o")
    """Which projections carry LoRA adapters."""
    attention: AttentionImpl = "fused"
    """fused = flash-style kernel (scores not stored); eager = scores and softmax stored."""
    runtime: Runtime = "megatron"
    """Which implementation runs the plan, so memory is counted as it holds it. megatron: model
    states as the ZeRO paper counts them (Megatron-LM's distributed optimizer, DeepSpeed) and
    activations as Korthikanti et al. count them (fused kernels, Megatron sequence parallelism).
    torch: ``autoplan launch``'s own job on PyTorch's APIs (FSDP2 keeps fp32 parameter and
    gradient shards, ``parallelize_module`` sequence parallelism, eager autograd)."""
    compiled: bool = False
    """The model runs under ``torch.compile``, which fuses its norms, activations and rotary
    embeddings; matters only for a runtime that otherwise runs them eagerly
    (``RuntimeConvention.fused_elementwise``). ``autoplan launch``'s job is not compiled."""
    context_attention: ContextAttention = "ring"
    """How context parallelism (cp > 1) attends across the split sequence, which is what is costed.
    ring: each rank's K/V block passes around the cp ranks in cp - 1 steps, hidden behind the
    attention core (Liu et al. 2023; Megatron-LM, and the generated job on CUDA through torch's
    ``context_parallel``). all_gather: K/V of the whole sequence gathered before attention and
    their gradients reduce-scattered after, exposed, with the gathered K/V kept for backward (Llama 3,
    Dubey et al. 2024, Sec. 3.3.2; the generated job on every other backend, gloo included)."""

    def __post_init__(self) -> None:
        for name, high in (("global_batch_size", MAX_TOKENS_PER_STEP), ("seq_len", MAX_SEQ_LEN)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SpecError(f"{name} must be a positive integer, got {value!r}")
            whole(name, value, high=high)
        if self.global_batch_size * self.seq_len > MAX_TOKENS_PER_STEP:
            raise SpecError(f"global batch {self.global_batch_size} x seq-len {self.seq_len} = "
                            f"{self.global_batch_size * self.seq_len} tokens per step is past the limit of "
                            f"2^40 ({MAX_TOKENS_PER_STEP}); use a smaller batch or sequence")
        _require_choice("precision", self.precision, PRECISIONS)
        if self.fp8_recipe is not None:
            _require_choice("fp8_recipe", self.fp8_recipe, FP8_RECIPES)
        precision_recipe(self.precision, self.fp8_recipe)
        _require_choice("optimizer", self.optimizer, OPTIMIZERS)
        _require_choice("attention", self.attention, ("fused", "eager"))
        _require_choice("runtime", self.runtime, RUNTIMES)
        _require_choice("context_attention", self.context_attention, CONTEXT_ATTENTIONS)
        if not isinstance(self.compiled, bool):
            raise SpecError(f"compiled must be true or false, got {self.compiled!r}")
        if not isinstance(self.lora_rank, int) or isinstance(self.lora_rank, bool) or self.lora_rank < 0:
            raise SpecError(f"lora_rank must be a non-negative integer, got {self.lora_rank!r}")
        whole("lora_rank", self.lora_rank, low=0, high=MAX_WIDTH)
        if not isinstance(self.lora_targets, tuple):
            raise SpecError(f"lora_targets must be a tuple of names, got {self.lora_targets!r}")
        for target in self.lora_targets:
            _require_choice("lora_targets", target, LORA_TARGETS)

    @property
    def is_lora(self) -> bool:
        return self.lora_rank > 0

    @property
    def recipe(self) -> PrecisionRecipe:
        """The precision recipe: low-precision GEMMs, casts, copies, gathers, moment dtype."""
        return precision_recipe(self.precision, self.fp8_recipe)

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_len


def _require_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise SpecError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
