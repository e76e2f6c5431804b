"""Tensor-parallel communication overlapped with the GEMMs it feeds or drains (``Layout.tp_comm_overlap``).

Under sequence parallelism each tensor-parallel block all-gathers its input before a
column-parallel GEMM (QKV, FC1) and reduce-scatters the output of a row-parallel GEMM (attention
output projection, FC2) (Korthikanti et al. 2022, Sec. 4.2.2). Overlap decomposes the collective
and the GEMM into chunks so that one chunk's transfer runs while another chunk multiplies (Wang et
al., "Overlap Communication with Dependent Computation via Decomposition in Large Deep Learning
Models", ASPLOS 2023, Sec. 3). Two implementations do this:

- Megatron-LM ``--tp-comm-overlap`` (needs ``--sequence-parallel``; ``megatron/training/arguments.py``)
  with Transformer Engine userbuffers. Its defaults (``transformer_engine/pytorch/module/base.py``,
  ``initialize_ub``): the forward all-gathers (``qkv_fprop``, ``fc1_fprop``) use ``ring_exchange``
  with ``num_splits`` = tp, peer-to-peer over copy engines; the forward reduce-scatters
  (``proj_fprop``, ``fc2_fprop``) use ``pipeline`` with ``num_splits`` = 4 and 16 SMs, the first
  GEMM chunk running alone (``pipeline_rs_overlap_first_gemm`` false), so the last chunk's
  reduce-scatter has nothing left to hide behind.
- torch async TP (``torch.distributed._symmetric_memory``'s fused all-gather-matmul and
  matmul-reduce-scatter, enabled by inductor's micro-pipeline TP pass; torchtitan
  ``parallelism.enable_async_tensor_parallel``, which requires ``compile.enable`` with ``model`` in
  ``compile.components``): the same decomposition, one chunk per tp rank.

The cost of overlap has three parts, each its own function: what the transfers leave exposed
after hiding behind their GEMM chunks, the SMs and memory bandwidth the transfers take from the
GEMM meanwhile (``Assumptions.overlap_slowdown``, the same constant as every other overlap), and
the decomposition itself: n GEMMs of m/n rows run at a lower rate than one of m rows (tile and wave
quantisation, ``kernel_efficiency``).
"""

from __future__ import annotations

RS_PIPELINE_SPLITS = 4
"""Chunks of a pipelined GEMM + reduce-scatter overlap: Transformer Engine's default ``num_splits``
for the ``pipeline`` method (``initialize_ub``, ``get_default_config``)."""

RING_EXCHANGE_SM_SHARE = 1 / 16
"""SMs a ring-exchange overlap takes relative to a pipelined one: Transformer Engine's defaults give
``ring_exchange`` 1 SM (its transfers run on copy engines, ``use_ce``) and ``pipeline`` 16
(``initialize_ub``, ``get_default_config``). The pipelined reduce-scatter slows its GEMM by
``Assumptions.overlap_slowdown`` (fitted for NCCL's 8-16 channel SMs, the same order); the ring
exchange by this share of it."""
USERBUFFER_COMMUNICATORS = 10
"""Userbuffer communicators Transformer Engine registers per tensor-parallel model (``initialize_ub``'s
methods: 4 ``ring_exchange``, 2 ``pipeline``, 4 ``bulk``), each with its own buffer of the
gathered activation shape (Megatron passes ``[s·b/cp, h]``)."""


def userbuffer_bytes(block_bytes: float) -> float:
    """Device memory Transformer Engine's userbuffers hold, one gathered activation block
    (s·b/cp·h·B bytes, ``block_bytes``) per userbuffer communicator: 10 · block_bytes."""
    return USERBUFFER_COMMUNICATORS * block_bytes


def symmetric_workspace_bytes(block_bytes: float, tp: int) -> float:
    """Device memory torch async TP adds beside the gathered block every TP layer allocates anyway:
    one peer-to-peer workspace per TP group (``get_symm_mem_workspace``, grown to the largest
    request and reused), where the fused all-gather-matmul asks for its local shard, block/t, and
    the fused matmul-reduce-scatter for two output chunks, 2·block/t
    (``torch/distributed/_symmetric_memory/__init__.py``, torch 2.13): 2 · block_bytes / tp. The
    symmetric-memory allocator places it outside the caching allocator; it is counted with the
    buffers, a few hundred MiB at most on the shapes that run it."""
    return 2 * block_bytes / tp


def overlapped_steps_s(step_comm_s: float, step_gemm_s: float, steps: int, slowdown: float) -> float:
    """Seconds ``steps`` transfers of ``step_comm_s`` add beside ``steps`` GEMM chunks of
    ``step_gemm_s``, each transfer running beside one chunk:

    steps · [max(0, c − g) + σ·min(c, g)]   (c one transfer, g one chunk, σ = ``slowdown``).

    The part of a transfer longer than its chunk is exposed; the part under it slows the chunk
    by σ (the transfer's SMs and HBM traffic; ``costmodels.overlap`` uses the same form)."""
    if steps <= 0 or step_comm_s <= 0:
        return 0.0
    hidden = min(step_comm_s, step_gemm_s)
    return steps * (step_comm_s - hidden + slowdown * hidden)


def ring_exchange_all_gather_s(all_gather_s: float, chunk_gemm_s: float, tp: int, slowdown: float) -> float:
    """Exposed seconds of an all-gather overlapped with the GEMM on its output by ring exchange.

    The GEMM splits into tp chunks of m/tp rows; the rank multiplies its own chunk first while it
    sends it on and receives the next, so each of the tp − 1 ring steps (c = all_gather_s/(tp − 1),
    the ring all-gather being tp − 1 such steps; Thakur et al. 2005) runs beside one chunk, and the
    last chunk multiplies with no transfer left. No transfer is exposed whole."""
    if tp <= 1:
        return 0.0
    return overlapped_steps_s(all_gather_s / (tp - 1), chunk_gemm_s, tp - 1, slowdown)


def pipelined_reduce_scatter_s(chunk_reduce_scatter_s: float, chunk_gemm_s: float, splits: int,
                               slowdown: float) -> float:
    """Exposed seconds of a reduce-scatter overlapped with the GEMM that produces its input, in
    ``splits`` chunks: the reduce-scatter of chunk i (``chunk_reduce_scatter_s``, a collective of
    1/splits of the buffer) runs beside the GEMM of chunk i + 1, so splits − 1 of them overlap and
    the last one, with no GEMM left, is exposed whole:

    c + (splits − 1)·[max(0, c − g) + σ·min(c, g)]."""
    if splits <= 0 or chunk_reduce_scatter_s <= 0:
        return 0.0
    return chunk_reduce_scatter_s + overlapped_steps_s(chunk_reduce_scatter_s, chunk_gemm_s, splits - 1, slowdown)


def decomposition_s(chunk_gemm_s: float, chunks: int, whole_gemm_s: float) -> float:
    """Seconds lost by running a GEMM as ``chunks`` GEMMs of 1/chunks of its rows:
    chunks · t(m/chunks) − t(m), at least 0 (smaller GEMMs fill fewer waves of tiles; a rate
    model that gives a chunk a better rate than the whole is not credited)."""
    return max(0.0, chunks * chunk_gemm_s - whole_gemm_s)
