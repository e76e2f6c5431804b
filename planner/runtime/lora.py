"""LoRA adapters (Hu et al. 2021, eq. 3: h = W0·x + B·A·x, B initialised to zero) on the
projections a plan's ``TrainingSpec.lora_targets`` names, with every other weight frozen.

Each adapted ``nn.Linear`` keeps its own name and weight (``layers.0.attention.wq.weight``) and
gains two child layers, ``lora_a`` (d_in -> r) and ``lora_b`` (r -> d_out), added to its output
by a forward hook, so checkpoints, initialisation by name and FSDP2 units are unchanged. Only the
adapters require gradients, so autograd makes no gradient for a frozen weight and the optimizer
(given only trainable parameters) keeps states for the adapters alone: r·(d_in + d_out) per
adapted matrix, ``costmodels.params.lora_params_per_layer``. FSDP2 shards frozen and trainable
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


def _add_adapter(linear: nn.Linear, rank: int) -> None:
    linear.lora_a = nn.Linear(linear.in_features, rank, bias=False, device=linear.weight.device)
    linear.lora_b = nn.Linear(rank, linear.out_features, bias=False, device=linear.weight.device)
    linear.register_forward_hook(_adapter_output)


def _adapter_output(module: nn.Linear, inputs: tuple, output):
    return output + LORA_SCALE * module.lora_b(module.lora_a(inputs[0]))


def apply_lora(model: nn.Module, rank: int, targets: tuple[str, ...]) -> None:
    """Freeze every parameter of ``model`` (still on the meta device, before any parallelism),
    then give each targeted projection of every block a rank-``rank`` adapter."""
    for param in model.parameters():
        param.requires_grad_(False)
    layers = getattr(model, "layers", None) or {}
    for block in layers.values():
        for name in target_modules(block, targets):
            _add_adapter(block.get_submodule(name), rank)


def is_lora_b(fqn: str) -> bool:
    """The up-projection B of an adapter, initialised to zero so training starts at W0 (eq. 3)."""
    return fqn.endswith("lora_b.weight")
