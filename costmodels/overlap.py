"""Exposed time of communication issued alongside compute.

A collective overlapped with compute is not free: it hides behind at most the share
``overlap_fraction`` of that compute, its kernels occupy SMs the GEMMs would use (NCCL runs one
thread block per channel; NCCL docs, ``NCCL_MIN_NCHANNELS``/``NCCL_MAX_NCHANNELS``), slowing
the compute it overlaps by ``overlap_slowdown``, and the first (forward gathers) or last
(backward reductions) piece has no compute to hide behind (PyTorch DDP buckets: Li et al.,
VLDB 2020, Sec. 3.2.3; FSDP prefetching: Zhao et al., VLDB 2023, Sec. 3.3).
"""

from __future__ import annotations

from .assumptions import Assumptions


def exposed_comm_s(comm_s: float, compute_s: float, pieces: int, assumptions: Assumptions) -> float:
    """Seconds ``comm_s`` of communication in ``pieces`` equal collectives adds to ``compute_s``.

    exposed = t_piece + max(0, (c − t_piece) − η·C) + σ·min(c − t_piece, η·C), with c the
    communication, C the compute, η = ``overlap_fraction`` and σ = ``overlap_slowdown``.
    """
    if comm_s <= 0:
        return 0.0
    piece = comm_s / max(pieces, 1)
    rest = comm_s - piece
    hidable = assumptions.overlap_fraction * compute_s
    return piece + max(0.0, rest - hidable) + assumptions.overlap_slowdown * min(rest, hidable)


def ring_exposed_s(step_comm_s: float, step_compute_s: float, steps: int, assumptions: Assumptions) -> float:
    """Seconds a ring exchange of ``steps`` transfers adds when each transfer overlaps one block of
    compute of ``step_compute_s`` (ring attention: while a rank computes on the K/V block it holds,
    it sends that block on and receives the next; Liu et al. 2023, "Ring Attention", Sec. 3).

    exposed = steps · [max(0, c − C) + σ·min(c, C)], c one transfer, C one block's compute,
    σ = ``overlap_slowdown`` (the transfer's kernels take SMs from the attention kernel, as
    for ``exposed_comm_s``). The first block needs no transfer, so no piece is exposed whole.
    """
    if steps <= 0 or step_comm_s <= 0:
        return 0.0
    hidden = min(step_comm_s, step_compute_s)
    return steps * (step_comm_s - hidden + assumptions.overlap_slowdown * hidden)
