"""Tied input and output embeddings across pipeline stages, the way Megatron-LM keeps them.

With pp > 1 the first stage holds the input table (``tok_embeddings``) and the last stage a copy
(``tied_output``) that starts equal (``init.canonical_name`` gives both one initial value). After
each backward the two gradients are summed over the embedding group, the pair of ranks at the
same (dp, tp) coordinates on the first and last pipeline stage (Megatron-LM:
``_allreduce_word_embedding_grads`` in ``megatron/core/distributed/finalize_model_grads.py``,
over ``parallel_state.get_embedding_group()``). Both copies then take the same optimizer step on
the same gradient, so they stay equal, and the sum is the gradient of the single tied weight.
The copy is marked ``TIED_COPY_ATTR`` so the global gradient norm counts that gradient once.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

TIED_COPY_ATTR = "_autoplan_tied_copy"
"""Set on the last stage's copy: its gradient equals the first stage's after the sum."""


def embedding_group(world_mesh):
    """This rank's process group with its partner on the other end of the pipeline, or None.

    Every rank creates every pair's group (``new_group`` is collective over the world), in the
    mesh's order; the first and last entries along the "pp" axis are paired coordinate by coordinate."""
    ranks = world_mesh.mesh  # shape (pp, ..., tp)
    firsts, lasts = ranks[0].flatten().tolist(), ranks[-1].flatten().tolist()
    me, mine = dist.get_rank(), None
    for first, last in zip(firsts, lasts):
        group = dist.new_group([first, last])
        if me in (first, last):
            mine = group
    return mine


def tied_weights(parts) -> list[torch.nn.Parameter]:
    """The tied table or its copy among this rank's model parts (empty on a middle stage)."""
    found = []
    for _, part in parts:
        copy = getattr(part, "tied_output", None)
        if copy is not None:
            setattr(copy.weight, TIED_COPY_ATTR, True)
            found.append(copy.weight)
        elif getattr(part, "tok_embeddings", None) is not None and getattr(part, "output", 1) is None:
            found.append(part.tok_embeddings.weight)
    return found


@torch.no_grad()
def sum_tied_grads(weights: list[torch.nn.Parameter], group) -> None:
    """All-reduce (sum) the local gradient piece of the tied weight over the embedding group."""
    for weight in weights:
        grad = weight.grad
        if grad is None:
            continue
        local = grad._local_tensor if hasattr(grad, "_local_tensor") else grad
        dist.all_reduce(local, group=group)
