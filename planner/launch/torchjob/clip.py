"""Global gradient-norm clipping that is correct under FSDP2, TP/SP and pipelining.

``torch.nn.utils.clip_grad_norm_`` breaks here in three ways (measured with torch 2.13):
it refuses a mix of plain tensors and DTensors (TP without SP), it refuses DTensors on different
meshes (TP + FSDP), and under pipelining each stage sees only its own gradients and so clips by
a per-stage norm. This module computes the true norm of the whole model's gradient: every rank
sums the squares of the gradient pieces it holds, divides each by the number of ranks holding
that same piece, and one all-reduce over the world adds the stages, shards and slices up.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from .tied import TIED_COPY_ATTR


def _holders(grad: torch.Tensor, stage_ranks: int) -> int:
    """Ranks of the whole job that hold exactly this local piece of ``grad``.

    A stage is held by ``stage_ranks`` ranks (dp · tp). A DTensor on a mesh of size M is
    repeated over the stage_ranks / M ranks outside its mesh, and over every mesh axis on which
    it is replicated or a partial sum (``_local_square_sum`` reduces partial sums to replicas first:
    sequence-parallel norm weights without FSDP); a plain tensor is repeated on all of the stage's ranks.
    """
    from torch.distributed.tensor import DTensor

    if not isinstance(grad, DTensor):
        return stage_ranks
    mesh = grad.device_mesh
    count = stage_ranks // mesh.size()
    for axis, placement in enumerate(grad.placements):
        if placement.is_replicate() or placement.is_partial():
            count *= mesh.size(axis)
    return count


def _local_square_sum(grad: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor, Replicate

    if isinstance(grad, DTensor):
        if any(p.is_partial() for p in grad.placements):
            grad = grad.redistribute(placements=[Replicate() if p.is_partial() else p for p in grad.placements])
        grad = grad.to_local()
    return grad.detach().float().pow(2).sum()


def global_grad_norm(params: list[torch.nn.Parameter], *, stage_ranks: int, device: torch.device) -> float:
    """L2 norm of the full model gradient, identical on every rank."""
    total = torch.zeros((), dtype=torch.float32, device=device)
    for param in params:
        if param.grad is not None and not getattr(param, TIED_COPY_ATTR, False):  # counted on the first stage
            # an expert's piece is held by 1/ep of the ranks its mesh leaves out (experts.configure)
            holders = _holders(param.grad, stage_ranks) // getattr(param, "expert_parallel_degree", 1)
            total += _local_square_sum(param.grad).to(device) / holders
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(total)
    return math.sqrt(max(total.item(), 0.0))


@torch.no_grad()
def clip_grads(params: list[torch.nn.Parameter], max_norm: float, *, stage_ranks: int,
               device: torch.device) -> float:
    """Scale gradients so their global norm is at most ``max_norm`` (<= 0: no clipping); return the norm."""
    norm = global_grad_norm(params, stage_ranks=stage_ranks, device=device)
    if max_norm > 0 and norm > max_norm:
        scale = max_norm / (norm + 1e-6)
        for param in params:
            if param.grad is not None:
                param.grad.mul_(scale)
    return norm
