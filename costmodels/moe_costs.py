"""Costs that MoE routing and sliding windows add beside the GEMMs: token permutation traffic and
the ring-attention steps a window needs."""

from __future__ import annotations

import math

from .model_spec import ModelSpec


def moe_permute_bytes(model: ModelSpec, tokens: float, elem_bytes: int) -> float:
    """Reads + writes of the forward token permutation and unpermutation of one MoE layer (bytes).

    Permute gathers each token's h-vector once per chosen expert (read T·h, write k·T·h); unpermute
    reads the k·T·h expert outputs and writes the weighted sum T·h: 2·B·T·h·(1 + k) in all, memory
    bound (MegaBlocks, Gale et al. 2023, Sec. 5.1, gather/scatter around the grouped GEMM;
    Megatron-Core ``moe_utils.permute``/``unpermute``). k counts the busiest rank's share
    (``MoESpec.busiest_token_factor``)."""
    moe = model.moe
    assert moe is not None
    k = moe.top_k * moe.busiest_token_factor
    return 2 * elem_bytes * tokens * model.hidden_size * (1 + k)


def ring_steps(model: ModelSpec, cp: int, s_local: int) -> float:
    """K/V block exchanges per layer of ring attention over ``cp`` ranks (Liu et al. 2023), averaged
    over the layers: cp − 1 for global attention; a local layer needs only the ⌈w / (s/cp)⌉
    preceding blocks its window reaches (capped at cp − 1)."""
    if cp == 1:
        return 0.0
    full = cp - 1
    if not model.sliding_window:
        return float(full)
    steps = [full if not w else min(full, math.ceil(w / s_local))
             for w in (model.attention_window(i) for i in range(model.num_layers))]
    return sum(steps) / len(steps)


def expert_capacity(tokens: int, num_experts: int, top_k: int, capacity_factor: float) -> int:
    """Slots one expert has per routing group of ``tokens`` tokens: ceil(cf · k · S / E) (GShard,
    Lepikhin et al. 2020, Sec. 2.2); dropless routing (cf = 0) with fixed shapes needs S, since a
    token picks an expert at most once."""
    if capacity_factor == 0:
        return tokens
    return math.ceil(capacity_factor * top_k * tokens / num_experts)
