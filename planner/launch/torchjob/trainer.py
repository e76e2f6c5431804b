"""Build a parallel training job from (ModelSpec, Layout) and run optimizer steps on it.

Works in three settings with the same code: a single process without a process group (the
reference), torchrun on CPU with gloo, and torchrun on CUDA with NCCL.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F

from costmodels.layout import Layout
from costmodels.model_spec import ModelSpec
from autoplan_base.errors import AutoplanError

from . import context_parallel, experts
from .clip import clip_grads
from costmodels.runtimes import FSDP2
from .init import init_weights
from .parallel import Meshes, build_meshes, build_parts, dp_dim_names, parallelize, shard_embedding_grads
from .tied import embedding_group, sum_tied_grads, tied_weights
from .user_model import build_user_model, layout_problems

MIXED_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}
"""Compute dtype per plan precision on CUDA (fp8 GEMMs are not wired: bf16 is used and logged)."""


@dataclass(slots=True, kw_only=True)
class Job:
    """Everything one rank needs to run steps: its model parts, optimizers and schedule."""

    spec: ModelSpec | None
    """The plan's model (None for a user's model without one)."""
    layout: Layout
    device: torch.device
    meshes: Meshes | None
    parts: list = field(default_factory=list)
    """(stage index, module) pairs held by this rank."""
    optimizers: list = field(default_factory=list)
    schedule: object | None = None
    dp_rank: int = 0
    has_first: bool = True
    has_last: bool = True
    autocast_dtype: torch.dtype | None = None
    vocab_size: int = 0
    """Token ids are in [0, vocab_size): the spec's, or read from a user model's logits."""
    tied: list = field(default_factory=list)
    """The tied embedding table or its last-stage copy on this rank (pp > 1 only, ``tied.py``)."""
    tied_group: object | None = None
    context: object | None = None
    """This rank's ``context_parallel.ContextGroup`` (None without context parallelism)."""
    recv_buffers: list = field(default_factory=list)
    """Stand-ins for the pipeline's receive buffers when a step is replayed without the
    schedule (the dry run); the schedule keeps its own."""

    @property
    def params(self) -> list[torch.nn.Parameter]:
        return [p for _, part in self.parts for p in part.parameters()]

    @property
    def replica_batch(self) -> int:
        """Sequences per step per data-parallel replica, m · b."""
        return self.layout.micro_batch_size * self.layout.num_microbatches

    @property
    def global_batch(self) -> int:
        return self.replica_batch * self.layout.dp


def pick_device() -> torch.device:
    """CUDA (this process's local GPU) when present, else CPU."""
    import os

    if torch.cuda.is_available():
        index = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def init_distributed(device: torch.device) -> None:
    """Join the torchrun process group: NCCL on CUDA, gloo on CPU."""
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")


def data_parallel_rank(meshes: Meshes, layout: Layout) -> int:
    """This rank's data-parallel replica index (its cp ranks share it)."""
    names = dp_dim_names(layout)
    coords = [meshes.world.get_local_rank(name) for name in names]
    return coords[0] * layout.hsdp_shard_degree + coords[1] if len(coords) == 2 else coords[0]


def context_group(meshes: Meshes | None, device: torch.device):
    if meshes is None or meshes.cp is None:
        return None
    return context_parallel.ContextGroup(mesh=meshes.cp, rank=meshes.cp.get_local_rank(), degree=meshes.cp.size(),
                                         variant=context_parallel.variant_for(device.type))


def _mp_policy(precision: str, device: torch.device):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if device.type == "cuda" and precision in MIXED_DTYPES:
        return MixedPrecisionPolicy(param_dtype=MIXED_DTYPES[precision], reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def _meta_parts(spec: ModelSpec | None, layout: Layout, meshes: Meshes | None, module: str | None,
                tp_plan: dict | None, seq_len: int) -> tuple[list, int]:
    """(this rank's (stage index, module) pairs on the meta device, vocabulary size)."""
    if module is None:
        pp_rank = meshes.world.get_local_rank("pp") if meshes is not None else 0
        return build_parts(spec, layout, meshes, pp_rank), spec.vocab_size
    problems = layout_problems(layout, has_tp_plan=tp_plan is not None)
    if problems:
        raise AutoplanError(problems[0])
    model, vocab = build_user_model(module, seq_len=seq_len, splits_params=layout.tp > 1)
    return [(0, model)], vocab


def setup_job(spec: ModelSpec | None, layout: Layout, *, device: torch.device, seed: int = 0, lr: float = 3e-4,
              weight_decay: float = 0.1, precision: str = "fp32", optimizer: str = "adamw",
              module: str | None = None, tp_plan: dict | None = None, seq_len: int = 0,
              lora_rank: int = 0, lora_targets: tuple[str, ...] = (), meshes: Meshes | None = None) -> Job:
    """Mesh, model parts (meta -> parallelise -> materialise the local shard -> init), optimizers, schedule.

    ``module`` ("pkg.mod:factory") trains a user's model instead of ``spec``'s (``user_model.py``;
    ``seq_len`` is then needed to read its vocabulary); ``tp_plan`` replaces the fixed TP plan;
    ``lora_rank`` > 0 trains LoRA adapters on ``lora_targets`` only (``lora.py``); ``meshes``, the
    ``build_meshes`` of a layout of the same ``mesh_shape`` built before in this process group, is
    used instead of building them again."""
    distributed = layout.world_size > 1 or dist.is_initialized()
    if meshes is None and distributed:
        meshes = build_meshes(layout, device.type)
    job = Job(spec=spec, layout=layout, device=device, meshes=meshes,
              dp_rank=data_parallel_rank(meshes, layout) if meshes is not None else 0,
              context=context_group(meshes, device))
    mp = _mp_policy(precision, device)
    parts, job.vocab_size = _meta_parts(spec, layout, meshes, module, tp_plan, seq_len)
    for index, part in parts:
        parallelize(part, layout, meshes, mp, tp_plan, lora=(lora_rank, lora_targets))
        part.to_empty(device=device)
        shard_embedding_grads(part)
        context_parallel.attach(part, job.context)
        experts.configure(part, layout)
        init_weights(part, seed=seed)
        part.train()
        job.parts.append((index, part))
        job.optimizers.append(make_optimizer(optimizer, trainable(part), lr, weight_decay))
    indices = [index for index, _ in job.parts]
    job.has_first, job.has_last = 0 in indices, layout.num_chunks - 1 in indices
    if spec is not None and spec.tied_embeddings and layout.pp > 1:
        job.tied, job.tied_group = tied_weights(job.parts), embedding_group(meshes.world)
    if device.type == "cuda" and precision in MIXED_DTYPES and (meshes is None or meshes.dp is None):
        job.autocast_dtype = MIXED_DTYPES[precision]
    if layout.pp > 1:
        from .pipelining import build_schedule

        job.schedule = build_schedule(job, loss_fn)
    return job


def trainable(part: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters the optimizer steps: all, or under LoRA the adapters only."""
    return [p for p in part.parameters() if p.requires_grad]


def make_optimizer(name: str, params, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW (the fused multi-tensor kernel where torch has one for the device), or SGD with
    momentum 0.9 (foreach); one parameter group per device mesh (``mesh_groups``).

    The fused AdamW reads parameter, gradient and both moments and writes parameter and moments
    once per step, 28 bytes per fp32 parameter, the single memory pass ``costmodels.rank_time.
    add_optimizer`` costs, in a few launches (torchtitan's default ``optimizer.implementation =
    "fused"``). The per-tensor loop (``foreach=False``) this job used before issues about ten
    kernels per tensor, 80 bytes per parameter: on an H100 it added 50-60 ms to every step of
    the 2026-11-26 sweep (``benchmarks/gpu_step_trace.py`` measures both)."""
    groups = mesh_groups(list(params))
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=0.9, weight_decay=weight_decay, foreach=True)
    return torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay, **adamw_implementation(groups))


def adamw_implementation(groups: list[dict]) -> dict:
    """{"fused": True} where every parameter sits on a device type with torch's fused AdamW
    kernel, else {"foreach": True}."""
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    devices = {p.device.type for group in groups for p in group["params"]}
    if devices and devices <= set(_get_fused_kernels_supported_devices()):
        return {"fused": True}
    return {"foreach": True}


def mesh_groups(params: list[torch.nn.Parameter]) -> list[dict]:
    """Parameter groups, one per device mesh (plain tensors in their own group): a multi-tensor
    optimizer kernel takes one group's tensors at once, and DTensor refuses one op over tensors
    of different meshes (experts on the ep mesh beside dense weights) or a mix with plain tensors."""
    from torch.distributed.tensor import DTensor

    groups: dict = {}
    for param in params:
        key = id(param.device_mesh) if isinstance(param, DTensor) else None
        groups.setdefault(key, []).append(param)
    return [{"params": members} for members in groups.values()]


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy over the micro-batch."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


def _set_grad_sync(job: Job, sync: bool) -> None:
    """Reduce gradients after this backward or not; a ZeRO stage that ``keeps_gathered_until_reduce``
    (``convention.FSDP2``) also reshards only then."""
    from torch.distributed.fsdp import FSDPModule

    keep_gathered = FSDP2.zero(job.layout.zero_stage).keeps_gathered_until_reduce
    for _, part in job.parts:
        if isinstance(part, FSDPModule):
            part.set_requires_gradient_sync(sync)
            if keep_gathered:
                part.set_reshard_after_backward(sync)


def forward_backward(job: Job, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor | None:
    """Gradient accumulation over the micro-batches; returns the mean loss (None off the last stage)."""
    seq_len = inputs.shape[1] * job.layout.cp
    with context_parallel.ring_context(job.context, seq_len, job.device):
        return _accumulate(job, inputs, labels)


def _accumulate(job: Job, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor | None:
    if job.schedule is not None:
        from .pipelining import pipeline_step

        return pipeline_step(job, inputs, labels)
    m, model = job.layout.num_microbatches, job.parts[0][1]
    every = FSDP2.zero(job.layout.zero_stage).reduce_every_microbatch
    total = torch.zeros((), device=job.device)
    for i, (x, y) in enumerate(zip(inputs.chunk(m), labels.chunk(m))):
        _set_grad_sync(job, i == m - 1 or every)
        with _autocast(job):
            loss = loss_fn(model(x), y) / m
        loss.backward()
        total += loss.detach()
    return total


def _autocast(job: Job):
    if job.autocast_dtype is None:
        return nullcontext()
    return torch.autocast(job.device.type, dtype=job.autocast_dtype)


def _global_mean(job: Job, loss: torch.Tensor | None) -> float:
    """Mean loss over the global batch: last-stage ranks (dp · cp · tp of them) contribute; a cp
    rank's loss is the mean over its equal share of each sequence's tokens."""
    value = torch.zeros((), device=job.device) if loss is None else loss.detach().float().clone()
    if dist.is_initialized():
        dist.all_reduce(value)
        value /= job.layout.dp * job.layout.tp * job.layout.cp
    return value.item()


def replica_batch(job: Job, source, step: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This replica's (inputs, labels) of ``step``: [m·b, s] each, shifted by one token; under
    context parallelism this rank's load-balanced share of the sequence, [m·b, s / cp]."""
    first = job.dp_rank * job.replica_batch
    tokens = source.sequences(step, first, job.replica_batch, job.global_batch, seq_len + 1)
    tokens = tokens.to(job.device)
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    if job.context is None:
        return inputs.contiguous(), labels.contiguous()
    cp, rank = job.context.degree, job.context.rank
    return (context_parallel.shard_sequence(inputs, cp, rank),
            context_parallel.shard_sequence(labels, cp, rank))


def train_step(job: Job, source, step: int, *, seq_len: int, max_norm: float) -> dict:
    """One optimizer step; returns {"loss", "grad_norm"} (same values on every rank)."""
    inputs, labels = replica_batch(job, source, step, seq_len)
    loss = forward_backward(job, inputs, labels)
    if job.tied:
        sum_tied_grads(job.tied, job.tied_group)
    stage_ranks = job.layout.dp * job.layout.tp * job.layout.cp
    grad_norm = clip_grads(job.params, max_norm, stage_ranks=stage_ranks, device=job.device)
    for optimizer in job.optimizers:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {"loss": _global_mean(job, loss), "grad_norm": grad_norm}

