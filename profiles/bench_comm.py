"""Timing of collectives on process groups (imports torch; gloo on CPU, NCCL on GPU).

Imported only from ``profiles.harness.main``. Every rank of the world takes part in every
layout: the world is split into equal groups that run the collective at the same time, as the
groups of one parallel axis do in training. A point's time is the slowest rank of the group,
median over back-to-back repeats after one barrier (nccl-tests reports the same max).
"""

from __future__ import annotations

import math
import statistics
from typing import Callable

import torch
import torch.distributed as dist

from .bench_compute import Timer
from .shapes import GroupLayout, MeasurePlan

COMM_DTYPES: dict[str, tuple[str, torch.dtype]] = {
    "cpu": ("fp32", torch.float32),   # gloo reduces fp32 natively
    "cuda": ("bf16", torch.bfloat16),  # what mixed-precision training sends
}


BATCH_TARGET_S = 0.005
"""Back-to-back calls per timed repeat are chosen to last about this long (seconds)."""
BATCH_MAX_CALLS = 32
WARMUP_CALLS = 3
"""Calls in the warm-up batch that sizes the timed batches."""


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


def group_max(values: list[float], group: dist.ProcessGroup, device: torch.device) -> list[float]:
    """Element-wise maximum over the ranks of ``group``."""
    t = torch.tensor(values, dtype=torch.float64 if device.type == "cpu" else torch.float32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.tolist()


def lockstep_median_s(fn: Callable[[], object], group: dist.ProcessGroup, timer: Timer,
                      plan: MeasurePlan, device: torch.device) -> float:
    """Seconds per call: median over repeats of the slowest rank's time for a batch of
    back-to-back calls, divided by the batch length.

    As in nccl-tests, one barrier starts the timed batches and they then run back to back, so
    the skew with which ranks leave the barrier touches only the first batch. Batch length and
    repeat count come from the group-wide slowest warm-up batch, so all ranks agree on them.
    """
    def calls(count: int) -> Callable[[], None]:
        def run() -> None:
            for _ in range(count):
                fn()
        return run

    fn()
    timer.sync()
    dist.barrier(group=group)
    (warm,) = group_max([timer.time_s(calls(WARMUP_CALLS)) / WARMUP_CALLS], group, device)
    warm = max(warm, 1e-9)
    batch = min(BATCH_MAX_CALLS, max(1, math.ceil(BATCH_TARGET_S / warm)))
    repeats = min(plan.max_repeats, max(plan.min_repeats, math.ceil(plan.time_budget_s / (warm * batch))))
    timed = calls(batch)
    timer.sync()
    dist.barrier(group=group)
    times = [timer.time_s(timed) / batch for _ in range(repeats)]
    return statistics.median(group_max(times, group, device))


def measure_curve(op: str, layout: GroupLayout, group: dist.ProcessGroup, members: tuple[int, ...],
                  plan: MeasurePlan, timer: Timer, device: torch.device) -> dict[str, object] | None:
    """Raw medians of ``op`` over the plan's sizes on this rank's group of ``layout``."""
    dtype_name, dtype = COMM_DTYPES[device.type]
    sizes, medians = [], []
    for size in plan.collective_sizes_bytes:
        fn = collective_call(op, size, members, group, dtype, device)
        if fn is None:
            continue
        sizes.append(size)
        medians.append(lockstep_median_s(fn, group, timer, plan, device))
    if not sizes:
        return None
    return {"op": op, "num_ranks": layout.num_ranks, "spans_nodes": layout.spans_nodes,
            "dtype": dtype_name, "sizes_bytes": sizes, "median_time_s": medians}
