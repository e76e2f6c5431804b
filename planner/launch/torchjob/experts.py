"""Mixture-of-experts routing, capacity and expert parallelism for ``model.MoE``.

Router: token-choice top-k over softmax probabilities, the k chosen weights renormalised by a
softmax over their logits (Mixtral, Jiang et al. 2024, Sec. 2.1). Capacity: each expert takes
at most C = ceil(cf · k · S / E) assignments per routing group of S tokens (GShard, Lepikhin et
al. 2020, Sec. 2.2 and Algorithm 1; Switch, Fedus et al. 2022, eq. 3); first choices are placed
before second choices, in token order, and assignments past C are dropped (the token keeps its
residual). A routing group is one sequence as this rank holds it, so routing does not depend on
the micro-batch or the data-parallel split (under cp a group is the rank's share of a sequence).

Auxiliary load-balancing loss (Switch eq. 4-6, GShard Sec. 2.2): α · E · Σ_i f_i · P_i per group,
f_i the fraction of the group's k·S assignments routed to expert i, P_i the mean router
probability of expert i; averaged over groups. Its gradient is added in backward where the MoE
output is used (``_AuxLoss``), so neither the trainer nor a pipeline schedule has to carry it.

Dispatch is by capacity slots (GShard's dispatch tensor, as an index): each expert has C slots per
sequence, and kept assignments are scattered into them, so every buffer has a fixed shape.
Expert parallelism: the ep ranks of a data-parallel group (``parallel.Meshes.ep``) each hold E/ep
consecutive experts; each expert's slots go to its rank with ``all_to_all_single`` (dispatch),
run there, and come back the same way (combine); the gradients go back by the same exchange.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from costmodels.moe_costs import expert_capacity

AUX_LOSS_COEF = 0.01
"""α of the load-balancing loss (Switch Transformer, Fedus et al. 2022, Sec. 2.2: 10^-2)."""




@dataclass(frozen=True, slots=True, kw_only=True)
class Routing:
    """Where each token goes: [G, S, k] expert ids, combine weights and the kept mask."""

    expert: torch.Tensor
    weight: torch.Tensor
    keep: torch.Tensor
    slot: torch.Tensor
    """Position of each assignment in its expert's queue of the group (kept when < capacity)."""
    capacity: int
    aux_loss: torch.Tensor
    """Unscaled load-balancing loss, mean over the G groups (1.0 when perfectly balanced)."""


def slot_positions(expert: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Int [G, S, k]: the slot each assignment takes in its expert's queue of the group: first
    choices in token order, then second choices, ... (GShard Algorithm 1)."""
    g, s, k = expert.shape
    onehot = F.one_hot(expert, num_experts).transpose(1, 2).reshape(g, k * s, num_experts)
    slot = (onehot.cumsum(dim=1) - 1) * onehot
    return slot.sum(dim=-1).reshape(g, k, s).transpose(1, 2)


def capacity_mask(expert: torch.Tensor, num_experts: int, capacity: int) -> torch.Tensor:
    """Bool [G, S, k]: assignment kept, its slot below the capacity; the rest are dropped."""
    return slot_positions(expert, num_experts) < capacity


def load_balancing_loss(probs: torch.Tensor, expert: torch.Tensor) -> torch.Tensor:
    """E · Σ_i f_i · P_i per group (Switch eq. 4-6; f over all k choices, divided by k), mean over
    groups. probs: [G, S, E] router probabilities; expert: [G, S, k] chosen experts."""
    num_experts, k = probs.shape[-1], expert.shape[-1]
    f = F.one_hot(expert, num_experts).float().sum(dim=2).mean(dim=1) / k
    p = probs.mean(dim=1)
    return (num_experts * (f * p).sum(dim=-1)).mean()


def route(logits: torch.Tensor, top_k: int, capacity_factor: float) -> Routing:
    """Top-k routing with capacity of router logits [G, S, E]."""
    num_experts = logits.shape[-1]
    probs = logits.float().softmax(dim=-1)
    top_logits, expert = logits.topk(top_k, dim=-1)
    weight = top_logits.float().softmax(dim=-1)
    capacity = expert_capacity(logits.shape[1], num_experts, top_k, capacity_factor)
    slot = slot_positions(expert, num_experts)
    return Routing(expert=expert, weight=weight, keep=slot < capacity, slot=slot, capacity=capacity,
                   aux_loss=load_balancing_loss(probs, expert))


class _AuxLoss(torch.autograd.Function):
    """Identity on ``out``; in backward, gives ``aux`` the gradient ``scale`` (d(scale·aux)/d aux)."""

    @staticmethod
    def forward(ctx, out, aux, scale):  # noqa: D102
        ctx.scale = scale
        ctx.save_for_backward(aux)
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        (aux,) = ctx.saved_tensors
        return grad, torch.full_like(aux, ctx.scale), None


def add_aux_loss(out: torch.Tensor, aux: torch.Tensor, scale: float) -> torch.Tensor:
    """``out``, with ``scale · aux`` added to the loss being differentiated."""
    if scale == 0 or not torch.is_grad_enabled():
        return out
    return _AuxLoss.apply(out, aux, scale)


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with equal splits; its gradient goes back by the same exchange."""

    @staticmethod
    def forward(ctx, x, group):  # noqa: D102
        import torch.distributed as dist

        ctx.group = group
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        return _AllToAll.apply(grad, ctx.group), None


def _all_to_all(x: torch.Tensor, group) -> torch.Tensor:
    return _AllToAll.apply(x, group)


def exchange(run, slots: torch.Tensor, group) -> torch.Tensor:
    """Expert parallelism on the slot buffer [E, N, h] (N slots per expert): dispatch each expert's
    slots to the ep rank holding it, run the E/ep local experts on the slots of every rank, and
    combine them back (two ``all_to_all_single`` of equal splits; autograd reverses each)."""
    import torch.distributed as dist

    ep = dist.get_world_size(group)
    e, n, h = slots.shape
    local = e // ep
    received = _all_to_all(slots, group).view(ep, local, n, h)  # [source rank, local expert, slot]
    out = run(received.transpose(0, 1).reshape(local, ep * n, h))
    out = out.view(local, ep, n, h).transpose(0, 1).reshape(e, n, h)
    return _all_to_all(out, group)


class _CopyToTensorParallel(torch.autograd.Function):
    """Megatron's f: identity forward, all-reduce of the input gradient backward (Shoeybi et al. 2019, Sec. 3)."""

    @staticmethod
    def forward(ctx, x, group):  # noqa: D102
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        import torch.distributed as dist

        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTensorParallel(torch.autograd.Function):
    """Megatron's g: all-reduce of the partial outputs forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group):  # noqa: D102
        import torch.distributed as dist

        x = x.contiguous()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        return grad, None


def run_experts(moe, slots: torch.Tensor) -> torch.Tensor:
    """The local experts on their slots; under tensor parallelism each tp rank holds an f/tp slice
    of every expert (w1, w3 by column, w2 by row, as Megatron splits an MLP) and the partial
    outputs are summed over the tp group."""
    group = moe.experts_tp_group
    if group is None:
        return moe.experts(slots)
    return _ReduceFromTensorParallel.apply(moe.experts(_CopyToTensorParallel.apply(slots, group)), group)


def slot_index(routing: Routing, num_experts: int) -> torch.Tensor:
    """Int [G, S, k]: the row of each assignment in the flat slot buffer [E · G · C] (expert-major,
    then group, then slot); a dropped assignment points at the extra row E · G · C."""
    g, c = routing.expert.shape[0], routing.capacity
    group = torch.arange(g, device=routing.expert.device)[:, None, None]
    index = (routing.expert * g + group) * c + routing.slot
    return torch.where(routing.keep, index, num_experts * g * c)


def moe_forward(moe, x: torch.Tensor) -> torch.Tensor:
    """The MoE layer on x [b, s, h]: route per sequence, scatter the kept assignments into each
    expert's C slots per sequence (zeros where a slot is free), run the experts on their slot
    buffer, gather each token's k outputs back and weight them. Every shape is fixed by
    (b, s, E, C), so no step waits on counts and the buffers are those the cost model counts:
    E·b·C ≈ cf·k·b·s token copies."""
    b, s, h = x.shape
    num_experts = moe.router.weight.shape[0]
    routing = route(moe.router(x), moe.top_k, moe.capacity_factor)
    index = slot_index(routing, num_experts).reshape(-1)
    rows = num_experts * b * routing.capacity
    # the token filling each slot (row b·s: a zero row for a free slot); a gather saves only indices
    token = torch.arange(b * s, device=x.device).repeat_interleave(moe.top_k)
    filler = torch.full((rows + 1,), b * s, device=x.device).scatter(0, index, token)[:rows]
    slots = torch.cat([x.reshape(-1, h), x.new_zeros(1, h)])[filler].view(num_experts, -1, h)
    run = partial(run_experts, moe)
    y = run(slots) if moe.ep_group is None else exchange(run, slots, moe.ep_group)
    y = torch.cat([y.reshape(rows, h), y.new_zeros(1, h)])
    weight = (routing.weight * routing.keep).type_as(y)
    out = (y[index].view(b, s, moe.top_k, h) * weight[..., None]).sum(dim=2)
    if moe.shared_experts is not None:
        shared = moe.shared_experts(x)
        if moe.shared_expert_gate is not None:  # Qwen's sigmoid gate on the shared expert
            shared = torch.sigmoid(moe.shared_expert_gate(x)) * shared
        out = out + shared
    return add_aux_loss(out, routing.aux_loss, moe.aux_loss_scale)


def load_balance_scale(layout) -> float:
    """The aux-loss gradient per micro-batch: α / m when the trainer divides each micro-batch loss by
    m; α under pipelining, whose schedule divides the accumulated gradients by m (``scale_grads``)."""
    return AUX_LOSS_COEF if layout.pp > 1 else AUX_LOSS_COEF / layout.num_microbatches


def _moe_modules(part):
    return [m for m in part.modules() if hasattr(m, "ep_group") and hasattr(m, "experts")]


def configure(part, layout) -> None:
    """Set the aux-loss weight of every MoE layer of ``part`` and tag expert parameters with the
    number of ranks that hold other pieces of the expert table, ep · tp (``clip.py`` counts a
    piece's holders with it). After ``to_empty``."""
    for moe in _moe_modules(part):
        moe.aux_loss_scale = load_balance_scale(layout)
        for param in moe.experts.parameters():  # ranks holding other pieces of the expert table
            param.expert_parallel_degree = layout.ep * layout.tp


def _keep_slice(experts, dims: dict[str, int], rank: int, parts: int) -> tuple[int, int, int]:
    """Replace each weight of ``experts`` (meta device) by its ``rank``-th of ``parts`` equal slices
    along ``dims[name]``; returns (first, count, total) along that axis, for ``init.py``."""
    from torch import nn

    total = experts.w1.shape[dims["w1"]]
    local = total // parts
    for name, param in list(experts.named_parameters(recurse=False)):
        setattr(experts, name, nn.Parameter(param.narrow(dims[name], rank * local, local).clone()))
    return rank * local, local, total


def apply_expert_parallel(part, ep_mesh) -> None:
    """Keep this ep rank's E/ep consecutive experts (on the meta device, before sharding) and give
    each MoE layer the ep process group. ``expert_rows`` (first, count, total) lets ``init.py``
    draw the weights of the whole expert table and keep this rank's rows."""
    for moe in _moe_modules(part):
        moe.experts.expert_rows = _keep_slice(moe.experts, dict.fromkeys(("w1", "w2", "w3"), 0),
                                              ep_mesh.get_local_rank(), ep_mesh.size())
        moe.ep_group = ep_mesh.get_group()


EXPERT_DIM_OF_FFN = {"w1": 1, "w3": 1, "w2": 2}
"""The dim of each expert weight that runs over the expert FFN width (split by tensor parallelism)."""


def global_shape(module, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of parameter ``name`` of ``module`` before experts were split over ep and tp ranks."""
    shape = list(shape)
    rows, cols = getattr(module, "expert_rows", None), getattr(module, "expert_cols", None)
    if rows is not None:
        shape[0] = rows[2]
    if cols is not None:
        shape[EXPERT_DIM_OF_FFN[name]] = cols[2]
    return tuple(shape)


def owned_piece(module, name: str, full):
    """The piece of a full expert table ``module`` holds: its ep rank's experts, its tp rank's
    FFN slice (all of it without expert or tensor parallelism)."""
    rows, cols = getattr(module, "expert_rows", None), getattr(module, "expert_cols", None)
    if rows is not None:
        full = full[rows[0]:rows[0] + rows[1]]
    if cols is not None:
        full = full.narrow(EXPERT_DIM_OF_FFN[name], cols[0], cols[1])
    return full


def apply_expert_tensor_parallel(part, tp_mesh) -> None:
    """Keep this tp rank's f/tp slice of every expert (meta device, before sharding) and give each
    MoE layer the tp group its partial outputs are summed over (``run_experts``)."""
    for moe in _moe_modules(part):
        moe.experts.expert_cols = _keep_slice(moe.experts, EXPERT_DIM_OF_FFN, tp_mesh.get_local_rank(), tp_mesh.size())
        moe.experts_tp_group = tp_mesh.get_group()


def shard_expert_states(blocks, mesh, rule, mp_policy, *, divide_factor: int) -> None:
    """FSDP2 (or ``replicate`` for ZeRO 0) on each MoE layer's experts over the expert data-parallel
    mesh, before the block is wrapped. Gradients are divided by the dense data-parallel size
    dp · cp, not by the mesh size: an expert's gradient already sums the ep ranks' tokens (the
    combine all-to-all's backward), so the mean over all dp · cp ranks is sum / (dp · cp) (as
    torchtitan sets ``set_gradient_divide_factor``)."""
    import torch.distributed as dist
    from torch.distributed._composable.replicate_with_fsdp import replicate
    from torch.distributed.fsdp import fully_shard

    for block in blocks:
        moe = getattr(getattr(block, "_checkpoint_wrapped_module", block), "moe", None)
        if moe is None:
            continue
        if rule.sharded_stage == 0:
            replicate(moe.experts, mesh=mesh, mp_policy=mp_policy)
        else:
            fully_shard(moe.experts, mesh=mesh, reshard_after_forward=rule.reshard_after_forward, mp_policy=mp_policy)
        moe.experts.set_gradient_divide_factor(float(divide_factor))
        # gloo has no PREMUL_SUM: sum, then divide. Not on one rank, where torch 2.13 skips the
        # reduce-scatter but divides by the factor both in its copy and after it (measured).
        if mesh.size() > 1 and dist.get_backend(mesh.get_group()) == "gloo":
            moe.experts.set_force_sum_reduction_for_comms(True)


def moe_tp_style(sequence_parallel: bool):
    """The MoE layer under tensor parallelism: the router replicated over the tp ranks (each
    computes the same routing), the experts split by FFN width (``apply_expert_tensor_parallel``).
    With sequence parallelism its input is gathered along the sequence and its output sliced
    back (``PrepareModuleInputOutput``), so every tp rank routes whole sequences; without it,
    nothing to prepare."""
    if not sequence_parallel:
        return None
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInputOutput

    return PrepareModuleInputOutput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                    use_local_input=True, output_layouts=(Replicate(),),
                                    desired_output_layouts=(Shard(1),), use_local_output=True)
