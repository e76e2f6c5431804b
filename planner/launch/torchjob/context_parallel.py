"""Context parallelism: the sequence split over the cp ranks, attention across the split.

Placement (load-balanced causal chunks, Llama 3, Dubey et al. 2024, Sec. 3.3.2): the sequence
is cut into 2·cp equal chunks and cp rank i holds chunks i and 2·cp - 1 - i, so every rank
holds one early and one late chunk and does the same share of causal attention work. Torch's
``context_parallel`` shards its buffers the same way (its head-tail load balancer), so both
variants below see the same tokens on the same rank and one data path serves both.

Attention across the split, by device type (``variant_for``):
  ``all_gather``, every backend (gloo on CPU included): each rank all-gathers K and V of the
      whole sequence from the cp group (Llama 3 Sec. 3.3.2) and attends its own queries to them
      under a causal mask by global position; backward reduce-scatters the K/V gradients.
  ``ring``, CUDA: ``torch.distributed.tensor.experimental.context_parallel`` replaces the
      causal SDPA call with ring attention, passing K/V blocks around the cp group (Liu et al.
      2023).
Positions (rotary angles, learned position rows) are the global positions of the held tokens.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

Variant = Literal["all_gather", "ring"]


def variant_for(device_type: str) -> Variant:
    """The attention the generated job runs: ring on CUDA (torch's CP needs its fused kernels),
    all-gather everywhere else."""
    return "ring" if device_type == "cuda" else "all_gather"


def chunk_indices(cp: int, rank: int) -> tuple[int, int]:
    """The two of the 2·cp sequence chunks cp rank ``rank`` holds: (i, 2·cp - 1 - i)."""
    return rank, 2 * cp - 1 - rank


def local_positions(seq_len: int, cp: int, rank: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Global positions (int64 [seq_len / cp]) of the tokens cp rank ``rank`` holds, in order."""
    chunk = seq_len // (2 * cp)
    first, second = chunk_indices(cp, rank)
    return torch.cat([torch.arange(c * chunk, (c + 1) * chunk, device=device) for c in (first, second)])


def shard_sequence(t: torch.Tensor, cp: int, rank: int, dim: int = 1) -> torch.Tensor:
    """This rank's load-balanced share of ``t`` along ``dim`` (the sequence)."""
    if cp == 1:
        return t
    index = local_positions(t.shape[dim], cp, rank, t.device)
    return t.index_select(dim, index).contiguous()


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextGroup:
    """The cp group one rank belongs to (attached to the model's attention modules)."""

    mesh: object
    """The cp sub-mesh (``DeviceMesh``; its group carries the all-gather)."""
    rank: int
    degree: int
    variant: Variant

    def positions(self, s_local: int, device: torch.device) -> torch.Tensor:
        return local_positions(s_local * self.degree, self.degree, self.rank, device)


class _AllGather(torch.autograd.Function):
    """All-gather along a new leading dim [cp, ...]; backward reduce-scatters the gradient (each
    rank gets the sum of every rank's gradient for its own piece). gloo has no reduce-scatter, so
    there it is an all-to-all followed by the sum."""

    @staticmethod
    def forward(ctx, t, group):  # noqa: D102
        import torch.distributed as dist

        ctx.group = group
        n = dist.get_world_size(group)
        out = t.new_empty((n * t.shape[0], *t.shape[1:]))
        # torch 2.13 renames all_gather_into_tensor to all_gather_single
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        gather(out, t.contiguous(), group=group)
        return out.view(n, *t.shape)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        import torch.distributed as dist

        grad = grad.contiguous()
        if dist.get_backend(ctx.group) == "nccl":
            out = grad.new_empty(grad.shape[1:])
            dist.reduce_scatter_tensor(out, grad.flatten(0, 1), group=ctx.group)
            return out, None
        received = torch.empty_like(grad)
        dist.all_to_all_single(received, grad, group=ctx.group)
        return received.sum(dim=0), None


def _gather_sequence(t: torch.Tensor, ctx: ContextGroup) -> torch.Tensor:
    """[b, s/cp, heads, d] on each rank -> [b, s, heads, d] in global sequence order (autograd:
    the gradient is summed back to its owner, a reduce-scatter)."""
    pieces = _AllGather.apply(t, ctx.mesh.get_group()).unbind(0)
    chunks: list = [None] * (2 * ctx.degree)
    for rank, piece in enumerate(pieces):
        first, second = chunk_indices(ctx.degree, rank)
        chunks[first], chunks[second] = piece.chunk(2, dim=1)
    return torch.cat(chunks, dim=1)


def gathered_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: ContextGroup, *,
                       dropout_p: float, enable_gqa: bool) -> torch.Tensor:
    """Causal attention of the local queries [b, s/cp, a, d] over the gathered K/V (Llama 3
    Sec. 3.3.2); returns [b, s/cp, a, d]. Query at global position p sees keys at positions <= p."""
    k_all, v_all = _gather_sequence(k, ctx), _gather_sequence(v, ctx)
    q_pos = ctx.positions(q.shape[1], q.device)
    mask = q_pos[:, None] >= torch.arange(k_all.shape[1], device=q.device)[None, :]
    q, k_all, v_all = (t.transpose(1, 2) for t in (q, k_all, v_all))
    out = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask, dropout_p=dropout_p,
                                         enable_gqa=enable_gqa)
    return out.transpose(1, 2)


def attach(part: torch.nn.Module, ctx: ContextGroup | None) -> None:
    """Give every attention module (and the model, for learned positions) of ``part`` its cp group."""
    for module in part.modules():
        if hasattr(module, "context"):
            module.context = ctx


def ring_context(ctx: ContextGroup | None, seq_len: int, device: torch.device):
    """The context manager a step runs in: torch's ``context_parallel`` for the ring variant
    (its SDPA becomes ring attention); nothing for the all-gather variant or without cp.

    Data is sharded by ``shard_sequence`` before; the positions buffer handed to torch is only
    there because the API derives the sequence length from its buffers."""
    if ctx is None or ctx.variant != "ring":
        return nullcontext()
    return _ring(ctx, seq_len, device)


@contextmanager
def _ring(ctx: ContextGroup, seq_len: int, device: torch.device):
    from torch.distributed.tensor.experimental import context_parallel

    positions = torch.arange(seq_len, device=device)[None, :]
    with context_parallel(ctx.mesh, buffers=[positions], buffer_seq_dims=[1], no_restore_buffers={positions}):
        yield
