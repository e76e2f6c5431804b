"""Goodput: useful training throughput after checkpoint writes and failure losses, and the
checkpoint interval that maximises it (Young 1974; Daly 2006).

Symbols as in Daly (2006): δ the time to write one checkpoint, R the time to restart from one,
M the job's mean time between failures, τ the compute time between checkpoints, T_s the failure-
free solve time and T_w the expected wall time. Failures are Poisson (exponential inter-arrival),
one failure stops the whole synchronous job, and each GPU fails independently at the same rate,
so M = 1 / (λ_gpu · N) for N GPUs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hardware_specs.schema import ClusterSpec

from .convention import RuntimeConvention
from .memory import state_bytes
from .model_spec import ModelSpec
from .params import lora_params_per_layer, total_params
from .training import TrainingSpec

HOUR_S = 3600.0

LLAMA3_UNEXPECTED_INTERRUPTIONS = 419
LLAMA3_SNAPSHOT_DAYS = 54
LLAMA3_GPUS = 16_384
"""Dubey et al. 2024 (The Llama 3 Herd of Models), Sec. 3.3.4 and Table 5: 466 job interruptions
in a 54-day snapshot of pre-training Llama 3 405B on 16,384 H100 GPUs, 419 of them unexpected."""

FAILURES_PER_GPU_HOUR = LLAMA3_UNEXPECTED_INTERRUPTIONS / (LLAMA3_SNAPSHOT_DAYS * 24 * LLAMA3_GPUS)
"""λ_gpu, the default failure rate: 419 / (54 d · 24 h · 16,384 GPUs) = 1.97e-5 per GPU-hour,
an MTBF of 50,700 GPU-hours (one failure every 3.1 hours on 16,384 GPUs)."""

RESTART_OVERHEAD_S = 600.0
"""Fixed part of R besides reading the checkpoint: requeue, process start and communicator set-up.
Assumption (no datasheet gives it): ten minutes, the restart time R of Daly's own examples
(Daly 2006, Figs. 3-5)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Goodput:
    """The checkpoint plan of one layout and the throughput left after failures."""

    checkpoint_bytes: float
    """Bytes one checkpoint writes over the whole job (each state element once)."""
    checkpoint_write_s: float
    """δ: checkpoint bytes over the storage bandwidth of the nodes the job uses (synchronous DCP)."""
    restart_s: float
    """R: ``RESTART_OVERHEAD_S`` plus reading the checkpoint back at the same bandwidth."""
    mtbf_s: float
    """M: the job's mean time between failures, 1 / (λ_gpu · N)."""
    interval_s: float
    """τ: compute time between checkpoints, ``interval_steps`` whole steps."""
    interval_steps: int
    """Steps between checkpoints: Daly's optimum τ_opt over the step time, rounded, at least 1."""
    useful_fraction: float
    """T_s / T_w: the share of wall time that advances training."""
    tokens_per_s: float
    """Expected goodput: raw tokens/s × ``useful_fraction``."""


def checkpoint_state_bytes(model: ModelSpec, training: TrainingSpec, convention: RuntimeConvention) -> float:
    """Bytes of one checkpoint: every parameter and optimizer-state element once (DCP writes one
    copy of replicated tensors), as ``convention`` holds them: (param + K) bytes per trainable
    element, param bytes per frozen one (LoRA). Gradients are not saved."""
    sb = state_bytes(training, convention)
    psi = float(total_params(model))
    if not training.is_lora:
        return (sb.param + sb.optimizer) * psi
    adapters = model.num_layers * lora_params_per_layer(model, training.lora_rank, training.lora_targets)
    frozen_bytes = 4 if training.precision == "fp32" or convention.fp32_model_states else 2
    return frozen_bytes * psi + (sb.param + sb.optimizer) * adapters


def mtbf_s(num_gpus: int, failures_per_gpu_hour: float = FAILURES_PER_GPU_HOUR) -> float:
    """M (seconds) of a synchronous job on ``num_gpus`` GPUs: 1 / (λ_gpu · N), Poisson failures."""
    return HOUR_S / (failures_per_gpu_hour * num_gpus)


def young_interval_s(delta: float, mtbf: float) -> float:
    """Young (1974, CACM 17(9):530, eq. for T_opt): the first-order optimum τ = √(2 δ M)."""
    return math.sqrt(2.0 * delta * mtbf)


def daly_interval_s(delta: float, mtbf: float) -> float:
    """Daly (2006, FGCS 22:303, the higher-order estimate): for δ < 2M,
    τ_opt = √(2δM) · [1 + ⅓ (δ/2M)^½ + ⅑ (δ/2M)] − δ, else τ_opt = M.
    His Figs. 3-5 (R = 10 min, δ = 5 min; M = 24 h, 6 h, 15 min) give 117, 57 and 9.1 minutes."""
    if delta >= 2.0 * mtbf:
        return mtbf
    x = delta / (2.0 * mtbf)
    return young_interval_s(delta, mtbf) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - delta


def daly_useful_fraction(tau: float, delta: float, restart: float, mtbf: float) -> float:
    """T_s / T_w from Daly's (2006) complete cost function,
    T_w = M · e^(R/M) · (e^((τ+δ)/M) − 1) · T_s / τ,
    which counts checkpoint writes, the work lost since the last checkpoint and restarts; defined for
    any step length (computed in logs, it tends to 0 as τ grows past M)."""
    M = mtbf
    log_fraction = math.log(tau) - math.log(M) - restart / M - _log_expm1((tau + delta) / M)
    return math.exp(log_fraction)  # in logs: a step far past the MTBF gives 0, not an overflow


def _log_expm1(x: float) -> float:
    """ln(e^x − 1) for x > 0 without forming e^x (which overflows past x ≈ 709)."""
    return x + math.log1p(-math.exp(-x)) if x > 1.0 else math.log(math.expm1(x))


def goodput(checkpoint_bytes: float, cluster: ClusterSpec, *, num_gpus: int, step_time_s: float,
            tokens_per_s: float, failures_per_gpu_hour: float = FAILURES_PER_GPU_HOUR) -> Goodput:
    """Checkpoint every ``round(τ_opt / step)`` steps (Daly) and the goodput that leaves; the
    nodes the job uses write their shares of ``checkpoint_bytes`` in parallel."""
    nodes = math.ceil(num_gpus / cluster.node.gpus_per_node)
    delta = checkpoint_bytes / (nodes * cluster.node.storage_write_bandwidth_bytes_per_s)
    restart = RESTART_OVERHEAD_S + delta
    M = mtbf_s(num_gpus, failures_per_gpu_hour)
    steps = max(1, round(daly_interval_s(delta, M) / step_time_s))
    tau = steps * step_time_s
    fraction = daly_useful_fraction(tau, delta, restart, M)
    return Goodput(checkpoint_bytes=checkpoint_bytes, checkpoint_write_s=delta, restart_s=restart, mtbf_s=M,
                   interval_s=tau, interval_steps=steps, useful_fraction=fraction,
                   tokens_per_s=tokens_per_s * fraction)
