"""Model-state memory per rank: parameters, gradients and optimizer states under ZeRO.

Convention: ZeRO (Rajbhandari et al., SC'20, Sec. 3 and Fig. 1), as
held by DeepSpeed and by Megatron-LM's distributed optimizer with 16-bit gradients (fp16); bf16
and fp8 training keep fp32 gradients (Megatron's main_grad: 2Ψ + 4Ψ + 12Ψ, 6 + 12/d bytes under
the distributed optimizer). Mixed precision
(bf16/fp16/fp8) with Adam keeps 2Ψ 16-bit params + 2Ψ 16-bit grads + KΨ optimizer states, K = 12
(fp32 master copy, momentum, variance); SGD with momentum has K = 8 (master, momentum).
fp32 training keeps 4Ψ + 4Ψ and K = 8 (Adam) or 4 (SGD), no master copy.
ZeRO-1 divides the KΨ term by the shard degree N_d, ZeRO-2 also the gradients, ZeRO-3 also the
parameters. LoRA (Hu et al. 2021): frozen base weights keep only their parameter bytes.

Second convention, ``RuntimeConvention.fp32_model_states`` (FSDP2, ``autoplan launch``'s job;
``costmodels/runtimes.py``): with optimizer offload all three live on the host
(``RuntimeConvention.offload_holds_all_states``, FSDP2's ``CPUOffloadPolicy``); otherwise the sharded parameters stay in their original dtype (fp32;
they are the optimizer's master copy, so there is no separate one), gradients are sharded in the
fp32 reduce dtype, and the optimizer keeps fp32 states of those shards: 4Ψ + 4Ψ + KΨ with K = 8
(AdamW) or 4 (SGD momentum), whatever the compute precision. Which states a ZeRO stage shards is
the convention's ``ZeroStageRule.sharded_stage`` (FSDP2 shards all three from stage 1 on;
stages differ in when gathered copies are freed, which are buffers). Frozen LoRA weights stay
fp32 too.
"""

from __future__ import annotations

from dataclasses import dataclass

from .convention import RuntimeConvention
from .model_spec import ModelSpec
from .params import embedding_params, output_params, total_params
from .precision import gathered_weight_bytes
from .training import TrainingSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class StateBytes:
    """Bytes per parameter element of each model-state kind."""

    param: int
    grad: int
    optimizer: int
    gathered: float
    """Bytes per element of a gathered (unsharded) parameter, as all-gathered and computed with
    (averaged over the model when a low-precision recipe gathers its GEMM weights quantised)."""
    reduced: int
    """Bytes per element of a gradient as it is reduced (all-reduce or reduce-scatter)."""


def low_precision_weight_share(model: ModelSpec) -> float:
    """Share of the parameter elements that are low-precision GEMM weights: all but the input
    embedding and an untied output head with the final norm (the per-layer norms and routers,
    under 0.1% of a model, are counted in)."""
    return 1.0 - (embedding_params(model) + output_params(model)) / total_params(model)


def state_bytes(training: TrainingSpec, convention: RuntimeConvention, *,
                low_precision_share: float = 0.0) -> StateBytes:
    """Bytes per parameter for params, grads and optimizer states (ZeRO paper, K = 12 for mixed
    Adam; fp32 training, or a convention with fp32 model states such as FSDP2: K = 8). The
    recipe's moment dtype sets the moments' share of K (bf16 moments, DeepSeek-V3 Sec. 3.3.1:
    K = 4 + 2 + 2 = 8); ``low_precision_share`` (``low_precision_weight_share``) is
    the part of the weights a low-precision recipe may all-gather quantised."""
    recipe = training.recipe
    moments = (2 if training.optimizer == "adamw" else 1) * recipe.optimizer_moment_bytes
    compute = 4 if training.precision == "fp32" else 2
    gathered = gathered_weight_bytes(recipe, convention, compute, low_precision_share)
    if training.precision == "fp32" or convention.fp32_model_states:
        return StateBytes(param=4, grad=4, optimizer=moments, gathered=gathered, reduced=4)
    # Megatron accumulates and reduces bf16 training's gradients in an fp32 main_grad buffer
    # (Megatron-Core distributed optimizer docs: bf16 params, fp32 grads = 6 + 12/d bytes/param).
    # A runtime that keeps the 16-bit gradients beside that buffer holds 2 bytes more
    # (``RuntimeConvention.keeps_16bit_grads``); they are not reduced. A convention without
    # ``grad_reduce_in_fp32`` keeps that buffer in 16 bits (NeMo's performance recipes).
    fp32_grads = training.precision != "fp16" and convention.grad_reduce_in_fp32
    reduced = 4 if fp32_grads else 2
    grad = reduced + (2 if fp32_grads and convention.keeps_16bit_grads else 0)
    return StateBytes(param=2, grad=grad, optimizer=4 + moments, gathered=gathered, reduced=reduced)


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardedParams:
    """Parameter elements one rank holds before ZeRO sharding, split by how they are replicated."""

    dense: float
    """Replicated over the dense data-parallel group (dp · cp ranks)."""
    expert: float
    """MoE expert weights, replicated over dp · cp / ep ranks."""
    trainable_dense: float
    """Of ``dense``, the trainable part (all of it unless LoRA)."""
    trainable_expert: float


def zero_state_bytes(params: ShardedParams, sb: StateBytes, *, zero_stage: int, shard_degree: int,
                     expert_shard_degree: int, offload: bool, lora_param_bytes: int) -> tuple[float, float, float]:
    """(params, grads, optimizer) bytes on one rank under ``zero_stage`` (ZeRO paper Sec. 5.1).

    ``shard_degree`` N_d for dense states, ``expert_shard_degree`` for expert states. With
    ``offload`` the optimizer states (and master weights) live in host memory: zero on the device.
    """
    def shard(elements: float, degree: int, from_stage: int) -> float:
        return elements / degree if zero_stage >= from_stage else elements

    frozen_dense = params.dense - params.trainable_dense
    frozen_expert = params.expert - params.trainable_expert
    param_bytes = (sb.param * (shard(params.trainable_dense, shard_degree, 3)
                               + shard(params.trainable_expert, expert_shard_degree, 3))
                   + lora_param_bytes * (shard(frozen_dense, shard_degree, 3)
                                         + shard(frozen_expert, expert_shard_degree, 3)))
    grad_bytes = sb.grad * (shard(params.trainable_dense, shard_degree, 2)
                            + shard(params.trainable_expert, expert_shard_degree, 2))
    optimizer_bytes = 0.0 if offload else sb.optimizer * (
        shard(params.trainable_dense, shard_degree, 1) + shard(params.trainable_expert, expert_shard_degree, 1))
    return param_bytes, grad_bytes, optimizer_bytes


def held_state_bytes(params: ShardedParams, training: TrainingSpec, convention: RuntimeConvention, *,
                     zero_stage: int, shard_degree: int, expert_shard_degree: int,
                     offload: bool) -> tuple[float, float, float]:
    """(params, grads, optimizer) bytes on one rank as ``convention`` holds them at ``zero_stage``:
    the ZeRO paper's stages (Megatron) or FSDP2's, where any stage ≥ 1 shards all three."""
    if offload and convention.offload_holds_all_states:
        return 0.0, 0.0, 0.0
    sb = state_bytes(training, convention)
    frozen_bytes = 4 if training.precision == "fp32" or convention.fp32_model_states else 2
    stage = convention.zero(zero_stage).sharded_stage
    return zero_state_bytes(params, sb, zero_stage=stage, shard_degree=shard_degree,
                            expert_shard_degree=expert_shard_degree, offload=offload, lora_param_bytes=frozen_bytes)


def zero_closed_form_bytes(psi: float, n_d: int, stage: int, k: int = 12) -> float:
    """The ZeRO paper's per-device model-state bytes (Fig. 1): 2Ψ+2Ψ+KΨ, (2+2)Ψ+KΨ/N_d,
    2Ψ+(2+K)Ψ/N_d, (2+2+K)Ψ/N_d for stages 0-3."""
    if stage == 0:
        return (2 + 2 + k) * psi
    if stage == 1:
        return 4 * psi + k * psi / n_d
    if stage == 2:
        return 2 * psi + (2 + k) * psi / n_d
    return (2 + 2 + k) * psi / n_d
