"""Timing of collectives on process groups (imports torch; gloo on CPU, NCCL on GPU).

Imported only from ``profiles.harness.main``. Every rank of the world takes part in every
layout: the world is split into equal groups that run the collective at the same time, as the
groups of one parallel axis do in training. Each message size starts on a world barrier, with
batch and repeat counts agreed world-wide, so every group runs the same calls at the same
time and contention on shared links, NICs and switches is held as it is in a training step.
The batches then run back to back with one sync after the last (as nccl-tests times its
iterations). A point's time is the median over batches of the slowest rank of the group, then
the maximum of that over all groups: a synchronous step waits for its slowest group. This is
not nccl-tests' default, which averages its time over ranks (``-a 1``; ``-a 3`` is the max).
"""

from __future__ import annotations

import statistics
from typing import Callable

import torch
import torch.distributed as dist

from .bench_compute import WARMUP_CALLS, Timer, batch_counts
from .fit import COLLECTIVE_OPS
from .shapes import GroupLayout, MeasurePlan

COMM_DTYPES: dict[str, tuple[str, torch.dtype]] = {
    "cpu": ("fp32", torch.float32),   # gloo reduces fp32 natively
    "cuda": ("bf16", torch.bfloat16),  # what mixed-precision training sends
}



def ops_for(layout: GroupLayout) -> tuple[str, ...]:
    """Collectives measured on ``layout``: all of them; send/recv only on pairs."""
    return tuple(op for op in COLLECTIVE_OPS if op != "send_recv" or layout.num_ranks == 2)


def join_layout(layout: GroupLayout) -> tuple[dist.ProcessGroup, tuple[int, ...]]:
    """Create every group of ``layout`` (all ranks must call this in the same order) and return
    this rank's group with its members (global ranks)."""
    me = dist.get_rank()
    mine = None
    for members in layout.groups:
        group = dist.new_group(list(members))
        if me in members:
            mine = (group, members)
    assert mine is not None, f"rank {me} is in no group of {layout}"
    return mine


def leave_layout(group: dist.ProcessGroup) -> None:
    """Destroy this rank's group of a layout (its communicator and buffers) once it is measured."""
    dist.destroy_process_group(group)


def collective_call(op: str, size_bytes: int, members: tuple[int, ...], group: dist.ProcessGroup,
                    dtype: torch.dtype, device: torch.device) -> Callable[[], object] | None:
    """One call of ``op`` on a buffer of ``size_bytes`` (the full buffer, nccl-tests convention);
    None when the size does not split evenly over the group."""
    n = len(members)
    elem = torch.empty((), dtype=dtype).element_size()
    numel = size_bytes // elem
    if numel % n or numel == 0:
        return None
    full = torch.ones(numel, dtype=dtype, device=device)
    if op == "all_reduce":
        return lambda: dist.all_reduce(full, group=group)
    if op == "all_gather":
        shard = torch.ones(numel // n, dtype=dtype, device=device)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: gather(full, shard, group=group)
    if op == "reduce_scatter":
        shard = torch.empty(numel // n, dtype=dtype, device=device)
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: scatter(shard, full, group=group)
    if op == "all_to_all":
        out = torch.empty_like(full)
        return lambda: dist.all_to_all_single(out, full, group=group)
    if op == "broadcast":
        return lambda: dist.broadcast(full, src=members[0], group=group)
    if op == "send_recv":
        return _send_recv_call(full, members, group)
    raise ValueError(f"unknown collective {op!r}")


def _send_recv_call(buf: torch.Tensor, members: tuple[int, ...], group: dist.ProcessGroup) -> Callable[[], object]:
    """First member sends to the second (a pipeline stage boundary); others idle."""
    me = dist.get_rank()
    if me == members[0]:
        return lambda: dist.send(buf, dst=members[1], group=group)
    if me == members[1]:
        return lambda: dist.recv(buf, src=members[0], group=group)
    return lambda: None


def group_max(values: list[float], group: dist.ProcessGroup | None, device: torch.device) -> list[float]:
    """Element-wise maximum over the ranks of ``group`` (None: the whole world)."""
    t = torch.tensor(values, dtype=torch.float64 if device.type == "cpu" else torch.float32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.tolist()


def lockstep_median_s(fn: Callable[[], object], group: dist.ProcessGroup, timer: Timer,
                      plan: MeasurePlan, device: torch.device) -> float:
    """Seconds per call: median over batches of the slowest rank's time for a batch of
    back-to-back calls, divided by the batch length.

    A world barrier starts the warm-up and another the timed batches, which then run back to
    back with one sync after the last, so barrier skew touches only the first batch. Batch
    length and count come from the world's slowest warm-up (``batch_counts``), so every group
    runs the same number of calls.
    """
    fn()
    timer.sync()
    dist.barrier()
    (warm,) = group_max(timer.batch_times_s(fn, WARMUP_CALLS, 1), None, device)
    calls, repeats = batch_counts(warm, plan)
    timer.sync()
    dist.barrier()
    return statistics.median(group_max(timer.batch_times_s(fn, calls, repeats), group, device))


def measure_curve(op: str, layout: GroupLayout, group: dist.ProcessGroup, members: tuple[int, ...],
                  plan: MeasurePlan, timer: Timer, device: torch.device) -> dict[str, object] | None:
    """Medians of ``op`` over the plan's sizes, each the maximum over all groups of ``layout``.
    A size's buffers are dropped before the next size's are made."""
    dtype_name, dtype = COMM_DTYPES[device.type]
    sizes, medians = [], []
    for size in plan.collective_sizes_bytes:
        fn = collective_call(op, size, members, group, dtype, device)
        if fn is None:
            continue
        sizes.append(size)
        medians.append(lockstep_median_s(fn, group, timer, plan, device))
        del fn
    if not sizes:
        return None
    return {"op": op, "num_ranks": layout.num_ranks, "ranks_per_node": layout.ranks_per_node,
            "num_nodes": layout.num_nodes, "dtype": dtype_name, "sizes_bytes": sizes,
            "median_time_s": group_max(medians, None, device)}
