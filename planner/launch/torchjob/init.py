"""Layout-independent weight initialisation.

Each parameter is drawn from its own generator, seeded by the run seed and the parameter's
canonical name, as the full (global) tensor; a sharded parameter then keeps only its local
piece. So any layout (FSDP shards, TP slices, pipeline stages, recomputation wrappers) starts
from exactly the weights of the single-process model, which is what makes loss parity testable.
The price is one full-size temporary per parameter at start-up (on the training device).
"""

from __future__ import annotations

import zlib

import torch
from torch import nn

CHECKPOINT_PREFIX = "_checkpoint_wrapped_module."
INIT_STD = 0.02
"""Standard deviation of linear and embedding weights (GPT-2; Radford et al. 2019)."""


TIED_COPY = "tied_output.weight"
"""The last pipeline stage's copy of a tied embedding (``model.Transformer.tied_output``)."""


def canonical_name(fqn: str) -> str:
    """The parameter name as in the unwrapped model (recomputation wrappers removed); the last
    stage's copy of a tied embedding is the input table itself, so both start equal."""
    name = fqn.replace(CHECKPOINT_PREFIX, "")
    return "tok_embeddings.weight" if name == TIED_COPY else name


def _full_value(name: str, shape: torch.Size, seed: int, device: torch.device) -> torch.Tensor:
    """The global initial value of parameter ``name``: ones/zeros for norms and biases, else N(0, std)."""
    leaf = name.rsplit(".", 1)[-1]
    owner = name.rsplit(".", 2)[-2] if name.count(".") else ""
    if leaf == "bias" or owner == "lora_b":  # LoRA's B starts at zero (Hu et al. 2021, Sec. 4.1)
        return torch.zeros(shape, device=device)
    if "norm" in owner:
        return torch.ones(shape, device=device)
    gen = torch.Generator(device=device)
    gen.manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
    return torch.randn(shape, generator=gen, device=device) * INIT_STD


def _local_piece(param: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
    """The part of ``full`` this rank holds for ``param`` (a DTensor or a plain tensor)."""
    from torch.distributed.tensor import DTensor, Replicate

    if not isinstance(param, DTensor):
        return full
    replicated = DTensor.from_local(full, param.device_mesh, [Replicate()] * param.device_mesh.ndim,
                                    run_check=False)
    return replicated.redistribute(param.device_mesh, param.placements).to_local()


@torch.no_grad()
def init_weights(model: nn.Module, *, seed: int) -> None:
    """Fill every parameter of ``model`` (already materialised) with its layout-independent value."""
    from torch.distributed.tensor import DTensor

    from .experts import global_shape, owned_piece

    for fqn, param in model.named_parameters():
        local = param.to_local() if isinstance(param, DTensor) else param
        owner_name, _, leaf = fqn.rpartition(".")
        owner = model.get_submodule(owner_name)
        full = _full_value(canonical_name(fqn), global_shape(owner, leaf, param.shape), seed, local.device)
        full = owned_piece(owner, leaf, full)  # an ep rank's experts, a tp rank's slice of them
        local.copy_(_local_piece(param, full).to(local.dtype))
