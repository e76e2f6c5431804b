"""Device memory a training process holds outside its tensors: the reservations and transients
that real runs hold beyond model states, activations and communication buckets.

Each is a named term of ``StageMemory.overhead_parts`` (their sum is ``overhead_bytes``):

* ``cuda_context``: the CUDA context (kernel images, runtime heaps), outside PyTorch's caching
  allocator, so ``nvidia-smi`` counts it and ``torch.cuda.max_memory_reserved`` does not:
  ``HardwareSpec.runtime_reserved_bytes`` (0.75-1 GiB in the shipped specs).
* ``nccl_buffers``: NCCL's staging buffers, per communicator a rank uses
  (``nccl_buffer_bytes``).
* ``workspaces``: cuBLAS / cuBLASLt workspaces, one each per thread that issues GEMMs
  (``workspace_bytes``).
* ``fragmentation``: what the caching allocator holds beyond the live tensors
  (``fragmentation_bytes``).

The loss's transient (the 16-bit logits and their fp32 copy in the unfused cross-entropy; a few
fp32 values per token in Transformer Engine's fused one) is
a working-set term of the activations (``activations.loss_working_bytes``).
"""

from __future__ import annotations

from hardware_specs.units import KIB, MIB

from .layout import Layout

NCCL_BUFFSIZE_BYTES = 4 * MIB
"""NCCL's staging buffer per connection and protocol: ``NCCL_BUFFSIZE`` "default is 4194304 (4 MB)"
(NCCL User Guide, Environment Variables, docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html)."""
NCCL_PEERS_PER_CHANNEL = 2
"""Connections one rank of a ring holds per channel: it receives from the previous rank and sends to
the next (NCCL ring algorithm), each with its own buffer."""
CUBLAS_WORKSPACE_BYTES_HOPPER = 32 * MIB
"""PyTorch's cuBLAS workspace per (handle, stream) on compute capability 9.0 and later: 32 MiB, when
``CUBLAS_WORKSPACE_CONFIG`` is unset (``parseChosenWorkspaceSize``, pytorch/pytorch
aten/src/ATen/cuda/CublasHandlePool.cpp: "32MiB for Hopper", Blackwell too in later releases); it
is allocated through the caching allocator (``getNewWorkspace``) on the handle's first GEMM and
kept. Transformer Engine's cuBLASLt workspace on Hopper is 32 MiB per stream too
(``get_cublasLt_workspace_size_bytes``). The size is fixed: cuBLAS picks among the algorithms that
fit it, so a larger GEMM gets no larger workspace."""
CUBLAS_WORKSPACE_BYTES_OLDER = 4096 * KIB * 2 + 16 * KIB * 8
"""The same before Hopper: the default ``CUBLAS_WORKSPACE_CONFIG`` ``:4096:2:16:8``, two 4096 KiB
chunks and eight 16 KiB ones, 8,519,680 bytes (``parseChosenWorkspaceSize``, same file)."""
CUBLASLT_WORKSPACE_BYTES = 1024 * KIB
"""PyTorch's cuBLASLt workspace per (handle, stream): ``CUBLASLT_WORKSPACE_SIZE`` in KiB, default
1024 (``parseCUDABlasLtWorkspaceSize``, same file: "default size in KiB according to #73328"); a
map of its own (``cublaslt_handle_stream_to_workspace``) unless ``TORCH_CUBLASLT_UNIFIED_WORKSPACE``
is set, and through the caching allocator too (``getNewCUDABlasLtWorkspace``)."""
GEMM_THREADS = 2
"""Threads that issue a training step's GEMMs, each with its own cuBLAS handle (the handle pool is
per thread, ``getCurrentCUDABlasHandle``'s thread-local ``PoolWindow``) and so its own workspaces on
the compute stream: the Python thread runs forward and the optimizer, autograd's device thread runs
backward (``torch/csrc/autograd/engine.cpp``: one worker thread per CUDA device)."""
LARGE_BLOCK_ROUND_BYTES = 2 * MIB
"""The caching allocator's segment rounding for requests of 10 MiB and more (``kRoundLarge``; requests
up to 1 MiB take a 2 MiB segment of the small pool, ``kSmallBuffer``, and those between 1 and
10 MiB a 20 MiB one, ``kLargeBuffer``): ``get_allocation_size``, pytorch/pytorch
c10/cuda/CUDACachingAllocator.cpp @eb42ad6e."""


def communicator_count(layout: Layout) -> int:
    """NCCL communicators one rank uses: one per parallel group of two or more ranks that carries
    traffic (data, tensor, context, expert, pipeline), plus the default (world) group that
    ``init_process_group`` creates and barriers use."""
    groups = (layout.dp, layout.tp, layout.cp, layout.ep, layout.pp)
    return 1 + sum(1 for size in groups if size > 1)


def nccl_buffer_bytes(layout: Layout, channels: float) -> float:
    """NCCL's buffers on one rank: per communicator, ``channels`` × ``NCCL_PEERS_PER_CHANNEL`` ×
    ``NCCL_BUFFSIZE_BYTES`` (the Simple protocol's buffer; LL and LL128 buffers are smaller and left
    out). NCCL allocates them with ``cudaMalloc`` when a communicator first connects, outside the
    caching allocator."""
    return communicator_count(layout) * channels * NCCL_PEERS_PER_CHANNEL * NCCL_BUFFSIZE_BYTES


def workspace_bytes(compute_capability: float) -> float:
    """cuBLAS and cuBLASLt workspaces of one process: per GEMM-issuing thread (``GEMM_THREADS``) one
    cuBLAS workspace of its GPU generation's size and one cuBLASLt workspace; an unknown generation,
    0, counts as Hopper, the larger."""
    older = 0 < compute_capability < 9.0
    cublas = CUBLAS_WORKSPACE_BYTES_OLDER if older else CUBLAS_WORKSPACE_BYTES_HOPPER
    return GEMM_THREADS * (cublas + CUBLASLT_WORKSPACE_BYTES)


def fragmentation_bytes(live_bytes: float, largest_block_bytes: float, fraction: float) -> float:
    """What the caching allocator reserves beyond the live tensors: a share ``fraction`` of the
    activations and buffers it cycles through every step (2 MiB rounding of large blocks and the
    tails of split blocks), plus one block of the largest transient: the allocator splits a freed
    large block to serve smaller requests (large blocks split while ``max_split_size`` is
    unlimited, its default), so the next request of that size finds no block whole and reserves
    a new segment (c10/cuda/CUDACachingAllocator.cpp, ``get_free_block`` / ``alloc_block``)."""
    rounded = -(-largest_block_bytes // LARGE_BLOCK_ROUND_BYTES) * LARGE_BLOCK_ROUND_BYTES
    return fraction * live_bytes + rounded
