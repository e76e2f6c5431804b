"""Apply a ``Layout`` to the model with PyTorch's own distributed APIs.

Order (each step sees the result of the one before; measured to match a single-process
reference on CPU with gloo): recomputation wrappers, tensor/sequence parallel
(``parallelize_module``), data parallel on the dp sub-mesh (FSDP2 ``fully_shard`` or its
replicate twin), then the pipeline stage and schedule (``pipelining.py``).

ZeRO mapping onto FSDP2: one table, ``convention.FSDP2`` (which the cost model costs too):
``replicate`` for a stage that shards nothing, else ``fully_shard`` with the stage's
``reshard_after_forward``; ``trainer.py`` takes when gradients reduce from the same rules.
HSDP: a 2-D (dp_replicate, dp_shard) mesh of shape (dp / hsdp_shard_degree, hsdp_shard_degree).
Context parallelism: a cp axis between dp and tp (rank order tp, cp, dp, pp, as ``Layout``
says); data parallelism then runs over dp · cp ranks (the dp shard axis flattened with cp, as
torchtitan does), since every cp rank holds the same weights. Expert parallelism: the dp axis
split into (dp / ep, ep), ep innermost; experts are data-parallel over (dp / ep) · cp ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from costmodels.layout import Layout
from costmodels.model_spec import ModelSpec
from costmodels.stage_split import rank_chunks

from costmodels.runtimes import FSDP2
from .lora import apply_lora, freeze
from .model import Transformer


@dataclass(frozen=True, slots=True, kw_only=True)
class Meshes:
    """The device mesh of a run and the sub-meshes each parallelism uses (None = degree 1)."""

    world: object
    """The full DeviceMesh (pp, dp..., tp)."""
    dp: object | None
    """Data-parallel sub-mesh: ("dp",) or ("dp_replicate", "dp_shard") for HSDP."""
    tp: object | None
    pp: object | None
    cp: object | None = None
    """Context-parallel sub-mesh ("cp",)."""
    ep: object | None = None
    """Expert-parallel sub-mesh ("ep",): the ep ranks of one data-parallel group."""
    expert_dp: object | None = None
    """Data parallelism of the experts: the (dp / ep) · cp ranks holding the same experts."""


def dp_dim_names(layout: Layout) -> tuple[str, ...]:
    """Mesh axes of data parallelism: two for HSDP, else one."""
    hsdp = layout.zero_stage > 0 and 0 < layout.hsdp_shard_degree < layout.dp
    return ("dp_replicate", "dp_shard") if hsdp else ("dp",)


def mesh_shape(layout: Layout) -> tuple:
    """Everything of ``layout`` that ``build_meshes`` reads: two layouts with equal shapes get equal meshes."""
    return (layout.pp, dp_dim_names(layout), layout.dp, layout.hsdp_shard_degree, layout.cp, layout.tp, layout.ep)


def build_meshes(layout: Layout, device_type: str) -> Meshes:
    """``init_device_mesh`` over (pp, dp..., cp, tp); rank order innermost first: tp, cp, dp, pp."""
    from torch.distributed.device_mesh import init_device_mesh

    dp_names = dp_dim_names(layout)
    dp_shape = ((layout.dp // layout.hsdp_shard_degree, layout.hsdp_shard_degree)
                if len(dp_names) == 2 else (layout.dp,))
    names = ("pp", *dp_names, "cp", "tp")
    mesh = init_device_mesh(device_type, (layout.pp, *dp_shape, layout.cp, layout.tp), mesh_dim_names=names)
    ep, expert_dp = _expert_meshes(layout, device_type)
    return Meshes(world=mesh,
                  dp=_data_parallel_mesh(mesh, dp_names, layout.cp) if layout.dp * layout.cp > 1 else None,
                  tp=mesh["tp"] if layout.tp > 1 else None,
                  pp=mesh["pp"] if layout.pp > 1 else None,
                  cp=mesh["cp"] if layout.cp > 1 else None, ep=ep, expert_dp=expert_dp)


def _data_parallel_mesh(mesh, dp_names: tuple[str, ...], cp: int):
    """The mesh FSDP reduces over: the dp axes, the last one flattened with cp when cp > 1."""
    if cp == 1:
        return mesh[dp_names]
    flat = f"{dp_names[-1]}_cp"
    flattened = mesh[(dp_names[-1], "cp")]._flatten(flat)
    return flattened if len(dp_names) == 1 else mesh[(*dp_names[:-1], flat)]


def _expert_meshes(layout: Layout, device_type: str) -> tuple[object | None, object | None]:
    """(ep mesh, expert data-parallel mesh) from a (pp, dp / ep, ep, cp, tp) view of the world."""
    if layout.ep == 1:
        return None, None
    from torch.distributed.device_mesh import init_device_mesh

    shape = (layout.pp, layout.dp // layout.ep, layout.ep, layout.cp, layout.tp)
    mesh = init_device_mesh(device_type, shape, mesh_dim_names=("pp", "edp", "ep", "cp", "tp"))
    if layout.cp > 1:
        return mesh["ep"], mesh[("edp", "cp")]._flatten("edp_cp")
    return mesh["ep"], mesh["edp"]


def apply_recompute(model: Transformer, layout: Layout) -> None:
    """Full: wrap the first ``recompute_num_layers`` (0 = all) blocks of this stage in a
    non-reentrant checkpoint wrapper; selective: recompute only the attention core."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    names = list(model.layers.keys())
    if layout.recompute == "full":
        count = layout.recompute_num_layers or len(names)
        for name in names[:count]:
            model.layers[name] = checkpoint_wrapper(model.layers[name], preserve_rng_state=True)
    elif layout.recompute == "selective":
        for block in model.layers.values():
            block.attention.recompute_core = True


def _unwrap(block: nn.Module) -> nn.Module:
    return getattr(block, "_checkpoint_wrapped_module", block)


def _block_plan(block: nn.Module, sp: bool) -> dict:
    """Megatron column/row split of attention and MLP; norms sequence-parallel when ``sp``."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel)

    seq = Shard(1) if sp else Replicate()
    plan = {"attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(output_layouts=seq)}
    if hasattr(block, "moe"):
        from .experts import moe_tp_style

        moe_style = moe_tp_style(sp)
        plan |= {"moe": moe_style} if moe_style is not None else {}
    else:
        plan |= {"feed_forward.w1": ColwiseParallel(), "feed_forward.w2": RowwiseParallel(output_layouts=seq)}
        if block.feed_forward.w3 is not None:
            plan["feed_forward.w3"] = ColwiseParallel()
    if sp:
        plan |= {"attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel(),
                 "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))}
        if not hasattr(block, "moe"):
            plan["feed_forward"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    return plan


def apply_tensor_parallel(model: Transformer, tp_mesh, sp: bool) -> None:
    """``parallelize_module`` per block and for embeddings, final norm and output projection.

    Embeddings are split over the vocabulary (row-wise; the learned position table over
    positions) and the output projection over the vocabulary (column-wise), gathered before
    the loss. With sequence parallelism activations between blocks stay split on the sequence.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel
    from torch.distributed.tensor.parallel import parallelize_module

    seq = Shard(1) if sp else Replicate()
    top: dict = {}
    if model.tok_embeddings is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
        if model.pos_embeddings is not None:
            top["pos_embeddings"] = RowwiseParallel(input_layouts=Replicate(),
                                                    output_layouts=Shard(0) if sp else Replicate())
    if model.norm is not None and sp:
        top["norm"] = SequenceParallel()
    for head in ("output", "tied_output"):
        if getattr(model, head) is not None:
            top[head] = ColwiseParallel(input_layouts=seq, output_layouts=Replicate())
    if top:
        parallelize_module(model, tp_mesh, top)
    for block in model.layers.values():
        inner = _unwrap(block)
        parallelize_module(inner, tp_mesh, _block_plan(inner, sp))


def shard_embedding_grads(part: nn.Module) -> None:
    """``keep_grad_sharded_like_param`` on the embedding tables of a materialised, tensor-parallel
    part (after ``to_empty``, which replaces the parameter objects and so their hooks)."""
    from torch.distributed.tensor import DTensor

    for name in ("tok_embeddings", "pos_embeddings"):
        table = getattr(part, name, None)
        if (table is not None and table.weight.requires_grad and isinstance(table.weight, DTensor)
                and any(p.is_shard() for p in table.weight.placements)):
            keep_grad_sharded_like_param(table.weight)


def keep_grad_sharded_like_param(param: nn.Parameter) -> None:
    """Give a vocabulary-sharded embedding table a gradient sharded like itself.

    DTensor's embedding backward returns the weight gradient replicated, a full V·h tensor on
    every tensor-parallel rank (measured: 2 GiB per rank for llama3-8b at tp 8). Redistributing
    it to the parameter's own placements is a local slice, no communication, so the full copy
    lives only until the hook returns and the held gradient is the shard."""
    from torch.distributed.tensor import DTensor

    placements = param.placements

    def shard(grad):
        if grad.placements == placements:
            return grad
        local = grad.redistribute(grad.device_mesh, placements).to_local()
        # the slice is a view of the full gradient; copy it so the full storage can be freed
        return DTensor.from_local(local.clone(), grad.device_mesh, placements, run_check=False,
                                  shape=grad.shape, stride=grad.stride())

    param.register_hook(shard)


def offload_policy(layout: Layout, device_type: str):
    """FSDP2's ``CPUOffloadPolicy`` when the layout offloads: sharded parameters, their gradients
    and the optimizer states live in host memory, each all-gather copies the shard host-to-device,
    each reduce-scatter copies the gradient shard back, and the optimizer steps on the CPU
    (``convention.FSDP2.offload_holds_all_states``). Memory is pinned only on CUDA."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

    if not layout.optimizer_offload:
        return OffloadPolicy()
    return CPUOffloadPolicy(pin_memory=device_type == "cuda")


def apply_data_parallel(model: nn.Module, dp_mesh, layout: Layout, mp_policy, expert_dp_mesh=None) -> None:
    """FSDP2 per block (autoplan's model) and on the stage root, or ``replicate`` when the ZeRO
    stage shards nothing, as ``convention.FSDP2`` maps the stage; either with the layout's
    ``offload_policy``. A user's model is one FSDP unit: its blocks are not known here. Under
    expert parallelism the experts are their own unit on ``expert_dp_mesh``
    (``experts.shard_expert_states``)."""
    from torch.distributed._composable.replicate_with_fsdp import replicate
    from torch.distributed.fsdp import fully_shard

    rule = FSDP2.zero(layout.zero_stage)
    offload = offload_policy(layout, dp_mesh.device_type)
    blocks = model.layers.values() if isinstance(model, Transformer) else ()
    if expert_dp_mesh is not None:
        from .experts import shard_expert_states

        shard_expert_states(blocks, expert_dp_mesh, rule, mp_policy, divide_factor=layout.dp * layout.cp)
    if rule.sharded_stage == 0:
        replicate(model, mesh=dp_mesh, mp_policy=mp_policy, offload_policy=offload)
        return
    reshard = rule.reshard_after_forward
    for block in blocks:
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp_policy, offload_policy=offload)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp_policy, offload_policy=offload)


def data_parallel_mesh(layout: Layout, meshes: Meshes):
    """The mesh data parallelism wraps the model on: the dp sub-mesh, or with optimizer offload
    and dp 1 the size-1 "dp" axis (FSDP2's offload needs an FSDP unit even with nothing to shard)."""
    if meshes.dp is not None or not layout.optimizer_offload:
        return meshes.dp
    return meshes.world["dp"]


def stage_model(model: Transformer, first: int, count: int, *, is_first: bool, is_last: bool) -> Transformer:
    """Keep layers [first, first + count) and the embeddings/head this stage owns (in place)."""
    for name in list(model.layers.keys()):
        if not first <= int(name) < first + count:
            del model.layers[name]
    if not is_first:
        model.tok_embeddings = None
        model.pos_embeddings = None
    if not is_last:
        model.norm = None
        model.output = None
    elif not is_first and model.spec.tied_embeddings:
        spec = model.spec
        model.tied_output = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False,
                                      device=model.norm.weight.device)
    return model


def stage_indices(layout: Layout, pp_rank: int) -> list[int]:
    """Pipeline stages held by ``pp_rank``: r, r + pp, ... (looped placement), or r and 2·pp − 1 − r for
    the V schedules (``costmodels.stage_split.rank_chunks``, as torch's ``style="v"`` mapping)."""
    return rank_chunks(layout.schedule, layout.pp, layout.virtual_stages)[pp_rank]


def build_parts(spec: ModelSpec, layout: Layout, meshes: Meshes | None, pp_rank: int) -> list[tuple[int, Transformer]]:
    """The (stage index, module) pairs this rank runs, parallelised, still on the meta device."""
    import copy

    counts = layout.chunk_layers(spec.num_layers)
    starts = [sum(counts[:i]) for i in range(len(counts))]
    with torch.device("meta"):
        full = Transformer(spec)
    parts = []
    for index in stage_indices(layout, pp_rank):
        part = full if layout.num_chunks == 1 else copy.deepcopy(full)
        stage_model(part, starts[index], counts[index], is_first=index == 0,
                    is_last=index == layout.num_chunks - 1)
        parts.append((index, part))
    return parts


def parallelize(part: nn.Module, layout: Layout, meshes: Meshes | None, mp_policy,
                tp_plan: dict[str, str] | None = None, lora: tuple[int, tuple[str, ...]] = (0, ())) -> None:
    """Recomputation, then TP/SP, then LoRA adapters (``lora`` = (rank, targets); rank 0: none),
    then data parallel, in place.

    With a ``tp_plan`` ({module fqn: style}, from ``autoplan shard --attach``) TP and SP follow it
    instead of the fixed Megatron plan; modules a pipeline stage does not hold are skipped."""
    if isinstance(part, Transformer):
        apply_recompute(part, layout)
        if meshes is not None and meshes.ep is not None:
            from .experts import apply_expert_parallel

            apply_expert_parallel(part, meshes.ep)
        if meshes is not None and meshes.tp is not None and tp_plan is None:
            from .experts import apply_expert_tensor_parallel

            apply_expert_tensor_parallel(part, meshes.tp)
    if meshes is not None and meshes.tp is not None:
        if tp_plan is not None:
            from .tp_styles import apply_tp_plan

            apply_tp_plan(part, meshes.tp, tp_plan, skip_missing=layout.num_chunks > 1)
        else:
            apply_tensor_parallel(part, meshes.tp, layout.sequence_parallel)
    if lora[0]:
        freeze(part)
        apply_lora(part, lora[0], lora[1], sp=layout.sequence_parallel)
    dp_mesh = data_parallel_mesh(layout, meshes) if meshes is not None else None
    if dp_mesh is not None:
        apply_data_parallel(part, dp_mesh, layout, mp_policy, meshes.expert_dp)
