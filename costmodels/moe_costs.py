"""Costs that MoE routing and sliding windows add beside the GEMMs: token permutation traffic and
the ring-attention steps a window needs."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .model_spec import ModelSpec


def moe_permute_bytes(model: ModelSpec, tokens: float, elem_bytes: int, copies: float | None = None) -> float:
    """Reads + writes of the forward token permutation and unpermutation of one MoE layer (bytes).

    Permute gathers each token's h-vector once per chosen expert (read T·h, write k·T·h); unpermute
    reads the k·T·h expert outputs and writes the weighted sum T·h: 2·B·T·h·(1 + k) in all, memory
    bound (MegaBlocks, Gale et al. 2023, Sec. 5.1, gather/scatter around the grouped GEMM;
    Megatron-Core ``moe_utils.permute``/``unpermute``). k counts the busiest rank's share
    (``MoESpec.busiest_token_factor``), or ``copies`` (``routed_copies``) where given."""
    moe = model.moe
    assert moe is not None
    k = moe.top_k * moe.busiest_token_factor if copies is None else copies
    return 2 * elem_bytes * tokens * model.hidden_size * (1 + k)


def per_expert_kernels_s(seconds: float, count: int, min_s: float) -> float:
    """Time of ``count`` expert GEMMs of one shape (``seconds`` for all at the GEMM rate) when
    each is its own kernel: count · max(seconds/count, min_s). Transformer Engine's
    ``GroupedLinear`` (Megatron-Core's ``TEGroupedMLP``) runs one cuBLASLt GEMM per local expert
    over a few streams (TransformerEngine PR #853), and a small one takes far longer than its
    FLOPs: 8 experts of 128 tokens at N = K = 2048 take 0.267 ms on SM100, about 33 µs each
    (TransformerEngine PR #3134, "TN (fprop)" table, kernel time only)."""
    return count * max(seconds / count, min_s)


def expert_sort_bytes(model: ModelSpec, tokens: float, elem_bytes: int, *, local_experts: int, ep: int,
                      copies: float) -> float:
    """Reads + writes of reordering the dispatched copies between source-rank order and local-expert
    order around the experts of one MoE layer (bytes, forward).

    After the dispatch all-to-all a rank holds, per source rank, the copies for each of its
    local experts; with more than one local expert they are sorted expert-major before the
    grouped GEMM and back before the combine: Megatron-Core's ``sort_chunks_by_idxs``
    ("Permutation 2" of ``MoEAlltoAllTokenDispatcher``), the generated job's transposes of the
    received [ep, local, n, h] buffer (``planner/launch/torchjob/experts.exchange``). Each reads and writes
    the k·T·h received copies: 4·B·k·T·h, k = ``copies`` (``routed_copies``); nothing without ep or
    with one local expert."""
    if ep == 1 or local_experts == 1:
        return 0.0
    return 4 * elem_bytes * copies * tokens * model.hidden_size


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


def routed_copies(model: ModelSpec, group_tokens: int, *, fixed_slots: bool) -> float:
    """Expert-input rows per token on the busiest expert rank.

    k · ``busiest_token_factor`` where the experts run the kept assignments only (Megatron-Core:
    dropless, dropping, or padded to capacity when ``pad_to_capacity``); with ``fixed_slots`` every
    expert runs all C slots it has per routing group of S = ``group_tokens`` tokens (the generated
    job's fixed shapes, ``planner/launch/torchjob/experts.moe_forward``): E·C/S, C = ``expert_capacity``
    (GShard, Lepikhin et al. 2020, Sec. 2.2), which is S when dropless, so E copies per token."""
    moe = model.moe
    assert moe is not None
    if not fixed_slots:
        return moe.top_k * moe.busiest_token_factor
    slots = moe.num_experts * expert_capacity(group_tokens, moe.num_experts, moe.top_k, moe.capacity_factor)
    return slots / group_tokens


def expert_capacity(tokens: int, num_experts: int, top_k: int, capacity_factor: float) -> int:
    """Slots one expert has per routing group of ``tokens`` tokens: ceil(cf · k · S / E) (GShard,
    Lepikhin et al. 2020, Sec. 2.2); dropless routing (cf = 0) with fixed shapes needs S, since a
    token picks an expert at most once."""
    if capacity_factor == 0:
        return tokens
    return math.ceil(capacity_factor * top_k * tokens / num_experts)


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertExchange:
    """Buffers (bytes, per rank) one MoE layer's forward moves to reach its experts and back."""

    all_to_all_bytes: float
    """Buffer each rank all-to-alls over the ep group, once to dispatch and once to combine."""
    expert_tp_gather_bytes: float
    """Gathered buffer of the expert-tp all-gather after dispatch (its reduce-scatter before
    combine has the same size); 0 without one."""
    expert_tp_all_reduce_bytes: float
    """Buffer of the expert-tp all-reduce of partial expert outputs; 0 without one."""


def expert_exchange(model: ModelSpec, tokens: float, elem_bytes: int, *, tp: int, sp: bool, etp: int,
                    gathers_sequence: bool, copies: float) -> ExpertExchange:
    """The token exchange of one MoE layer on one rank for ``tokens`` = b·s/cp tokens of a micro-batch.

    Symbols: T tokens, t = tp, e = expert tp, k' = ``copies`` (expert-input rows per token on the
    busiest rank, ``routed_copies``), h hidden, B bytes per element.

    ``gathers_sequence`` False, Megatron-Core's ``alltoall`` token dispatcher
    (``megatron/core/transformer/moe/token_dispatcher.py``, ``MoEAlltoAllTokenDispatcher``;
    "num_local_tokens: S/TP*B"): under sequence parallelism each rank routes its own T/t tokens and
    all-to-alls their B·(T/t)·k'·h copies over ep; with e > 1 the expert-tp group then all-gathers
    what its e ranks received (``gather_from_sequence_parallel_region``, e·B·(T/t)·k'·h), and
    reduce-scatters the partial outputs before the combine. Without SP every tp rank already holds
    (and routes) all T tokens, so nothing is gathered and the block's all-reduce sums the partial
    outputs (``LayerCosts._moe_block_tp_collectives``; Megatron-LM requires SP for MoE with tp > 1).

    ``gathers_sequence`` True (the generated job, ``planner/launch/torchjob/experts.moe_tp_style``;
    torchtitan's ``ExpertTensorParallel``): the MoE input is gathered over the tp group first, so
    every tp rank routes the whole sequence and all-to-alls B·T·k'·h (t copies of the same tokens
    leave a tp group); the e = t ranks of an expert each hold an f/e slice and sum their partial
    outputs with an all-reduce of the B·T·k'·h received rows (``experts.run_experts``)."""
    B, h, k = elem_bytes, model.hidden_size, copies
    if gathers_sequence:
        routed = B * tokens * k * h
        return ExpertExchange(all_to_all_bytes=routed, expert_tp_gather_bytes=0.0,
                              expert_tp_all_reduce_bytes=routed if tp > 1 else 0.0)
    routed = B * tokens / (tp if sp else 1) * k * h
    return ExpertExchange(all_to_all_bytes=routed, expert_tp_gather_bytes=etp * routed if etp > 1 and sp else 0.0,
                          expert_tp_all_reduce_bytes=0.0)
