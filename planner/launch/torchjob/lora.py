"""LoRA adapters (Hu et al. 2021, eq. 3: h = W0·x + B·A·x, B initialised to zero) on the
projections a plan's ``TrainingSpec.lora_targets`` names, with every other weight frozen.

Adapters are added after tensor parallelism (``ColwiseParallel`` would try to split any child
parameter of the projection it splits) and before FSDP2. Each adapted ``nn.Linear`` keeps its own
name and weight (``layers.0.attention.wq.weight``) and gains two child layers, ``lora_a``
(d_in -> r) and ``lora_b`` (r -> d_out), added to its output by a forward hook, so checkpoints,
initialisation by name and FSDP2 units are unchanged. Only the adapters require gradients, so
autograd makes no gradient for a frozen weight and the optimizer (given only trainable
parameters) keeps states for the adapters alone: r·(d_in + d_out) per adapted matrix, split under
tp (``costmodels.params.lora_params_per_layer_per_rank``). FSDP2 shards frozen and trainable
parameters of one block together and reduces only the gradients that exist.
"""

from __future__ import annotations

from torch import nn

LORA_SCALE = 1.0
"""α / r of Hu et al. (Sec. 4.1) with α = r: the adapter's output is added unscaled."""


def target_modules(block: nn.Module, targets: tuple[str, ...]) -> list[str]:
    """Dotted names inside one transformer block of the projections ``targets`` names
    (q, k, v, o: attention; gate, up, down: a dense MLP, whose w1 is the gate of a gated MLP
    and the up projection of a plain one). MoE layers carry adapters on attention only."""
    ff = getattr(block, "feed_forward", None)
    gated = ff is not None and ff.w3 is not None
    names = {"q": "attention.wq", "k": "attention.wk", "v": "attention.wv", "o": "attention.wo"}
    if ff is not None:
        names |= {"down": "feed_forward.w2", "up": "feed_forward.w3" if gated else "feed_forward.w1"}
        if gated:
            names["gate"] = "feed_forward.w1"
    return [names[t] for t in targets if t in names]


def _add_adapter(linear: nn.Linear, rank: int, sp: bool) -> None:
    """Adapter layers beside ``linear``. Under tensor parallelism (its weight a DTensor) they split
    as the Megatron column/row split of ``linear`` dictates: a column-parallel projection keeps A
    whole and splits B's outputs (B·A·x comes out split like W0·x); a row-parallel one splits A's
    inputs (A·x is a partial sum) and keeps B whole, and B·A·x is reduced to the projection's
    output layout (replicated, or split over the sequence with SP)."""
    in_features, out_features = linear.weight.shape[1], linear.weight.shape[0]
    linear.lora_a = nn.Linear(in_features, rank, bias=False, device=linear.weight.device)
    linear.lora_b = nn.Linear(rank, out_features, bias=False, device=linear.weight.device)
    linear.lora_out = None
    placements = getattr(linear.weight, "placements", None)
    if placements is not None:
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor

        mesh, column = linear.weight.device_mesh, placements[0] == Shard(0)
        for layer, place in ((linear.lora_a, Replicate() if column else Shard(1)),
                             (linear.lora_b, Shard(0) if column else Replicate())):
            layer.weight = nn.Parameter(distribute_tensor(layer.weight, mesh, [place]))
        linear.lora_out = [Shard(2) if column else Shard(1) if sp else Replicate()]
    linear.register_forward_hook(_adapter_output)


def _adapter_output(module: nn.Linear, inputs: tuple, output):
    extra = module.lora_b(module.lora_a(inputs[0]))
    if module.lora_out is not None:
        extra = extra.redistribute(extra.device_mesh, module.lora_out).to_local()
    return output + LORA_SCALE * extra


def freeze(model: nn.Module) -> None:
    """LoRA's first half, before any parallelism: no base weight trains."""
    for param in model.parameters():
        param.requires_grad_(False)


def apply_lora(model: nn.Module, rank: int, targets: tuple[str, ...], sp: bool = False) -> None:
    """Give each targeted projection of every block of a frozen ``model`` a rank-``rank`` adapter,
    after tensor parallelism (``parallel.parallelize``) and before data parallelism, so FSDP2
    shards the adapters with their block."""
    layers = getattr(model, "layers", None) or {}
    for block in layers.values():
        inner = getattr(block, "_checkpoint_wrapped_module", block)
        for name in target_modules(inner, targets):
            _add_adapter(inner.get_submodule(name), rank, sp)


def is_lora_b(fqn: str) -> bool:
    """The up-projection B of an adapter, initialised to zero so training starts at W0 (eq. 3)."""
    return fqn.endswith("lora_b.weight")
