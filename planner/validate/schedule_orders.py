"""Operation orders of the zero-bubble and DualPipeV schedules, per pipeline rank (pure Python).

Each rank runs a list of *steps*; a step is one ``Action`` or two overlapped ones (DualPipeV's
F&B: a forward chunk and a full backward chunk issued together). Kinds: ``F`` forward, ``B``
input-gradient backward, ``W`` weight-gradient backward (Qi et al. 2023, Sec. 2: B and W split
the backward), ``BW`` a full backward (B then W at once). Chunks are local indices into the rank's
``costmodels.stage_split.rank_chunks``.

The orders follow torch 2.13's ``torch.distributed.pipelining.schedules`` (what the launched job
runs), written from its rules, not imported (``planner`` does not import torch):
``ScheduleInterleavedZeroBubble`` (``_get_warmup_ops`` with factor 1, then F, B and, after rank i's
first i steady steps, one deferred W per step; with one chunk per rank this is ZB-H1, Qi et al.
2023 Fig. 3), ``ScheduleZBVZeroBubble`` (Qi et al. 2024 ZB-V) and ``ScheduleDualPipeV``
(DeepSeek-V3 report, Sec. 3.2.1, cut in half). ``tests/test_schedule_sim.py`` checks every
order against torch's own ``_calculate_single_rank_operations``. DualPipe itself (not in torch) runs
the DualPipeV phases on half-ranks, as ``deepseek-ai/DualPipe``'s ``dualpipe.py`` writes them
(``schedule.step_orders``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Action:
    kind: str
    """``F``, ``B`` (input gradient), ``W`` (weight gradient) or ``BW`` (full backward)."""
    chunk: int
    """Local chunk index on the rank."""
    mb: int
    """Micro-batch index."""


Step = tuple[Action, ...]
"""One action, or two issued together (DualPipeV's overlapped forward and backward)."""


def zero_bubble_order(p: int, rank: int, m: int, v: int) -> list[Step]:
    """ZB-H1 (v = 1) and interleaved zero bubble (v > 1) on looped chunks (torch's
    ``ScheduleInterleavedZeroBubble``): warm-up (v − 1)·r + p − 1 − rank forwards with r = m / rounds,
    rounds = max(1, m // p); then F, B per step, plus one deferred W per step once the rank has done
    ``rank`` steady steps; the cool-down runs the remaining B and W."""
    rounds = max(1, m // p)
    per_round = m // rounds
    warmup = min((v - 1) * per_round + p - 1 - rank, m * v)
    total = m * v
    fwd_count: dict[int, int] = defaultdict(int)
    bwd_count: dict[int, int] = defaultdict(int)
    w_count: dict[int, int] = defaultdict(int)
    backward_steps: list[int] = []
    order: list[Step] = []

    def fwd_chunk(step: int) -> int:
        return (step // per_round) % v

    def bwd_chunk(step: int) -> int:
        return v - 1 - ((step - warmup) // per_round) % v

    def take(counter: dict[int, int], chunk: int) -> int:
        counter[chunk] += 1
        return counter[chunk] - 1

    def weight() -> None:
        chunk = bwd_chunk(backward_steps[sum(w_count.values())])
        order.append((Action("W", chunk, take(w_count, chunk)),))

    for step in range(total + warmup):
        if step < total:
            chunk = fwd_chunk(step)
            order.append((Action("F", chunk, take(fwd_count, chunk)),))
        if step < warmup:
            continue
        chunk = bwd_chunk(step)
        order.append((Action("B", chunk, take(bwd_count, chunk)),))
        backward_steps.append(step)
        if step - warmup >= rank:
            weight()
    while sum(w_count.values()) < len(backward_steps):
        weight()
    return order


def zbv_order(p: int, rank: int, m: int) -> list[Step]:
    """ZB-V (torch's ``ScheduleZBVZeroBubble``): chunk 0 is model chunk ``rank``, chunk 1 is
    2p − 1 − rank. Warm-up 2(p − rank) − 1 forwards of chunk 0, ``rank`` pairs (F1, F0), then
    p − rank rounds of (F1, B1, W1); steady (F0, B0, W0, F1, B1, W1); cool-down B without W for
    ``rank`` pairs, then (B0, W0), then the remaining W. Micro-batches past m are dropped (torch
    plans for max(2p − 1, m) and blanks the rest)."""
    n = max(2 * p - 1, m)
    f = [0, 0]
    b = [0, 0]
    w = [0, 0]
    order: list[Step] = []

    def add(kind: str, chunk: int, counter: list[int]) -> None:
        order.append((Action(kind, chunk, counter[chunk]),))
        counter[chunk] += 1

    def forward_backward(chunk: int) -> None:
        add("F", chunk, f)
        add("B", chunk, b)
        add("W", chunk, w)

    for _ in range(2 * (p - rank) - 1):
        add("F", 0, f)
    for _ in range(rank):
        add("F", 1, f)
        add("F", 0, f)
    for _ in range(p - rank):
        forward_backward(1)
    while f[1] < f[0] or f[0] < n:
        if f[0] < n:
            add("F", 0, f)
        add("B", 0, b)
        add("W", 0, w)
        forward_backward(1)
    for _ in range(rank):
        add("B", 0, b)
        add("B", 1, b)
    for _ in range(p - rank):
        add("B", 0, b)
        add("W", 0, w)
    while w[1] < b[1]:
        add("W", 1, w)
    while w[0] < b[0]:
        add("W", 0, w)
    return [s for s in order if s[0].mb < m]


def dualpipev_order(p: int, rank: int, m: int) -> list[Step]:
    """DualPipeV (torch's ``ScheduleDualPipeV``, m >= 2p): chunk 0 is model chunk ``rank``, chunk 1
    is 2p − 1 − rank; eight phases: F0; F0 F1; B1 W F1 (zero bubble); the main phase of overlapped
    (F0 with BW1) and (F1 with BW0); BW1 with (F1, BW0); the last B0/B1 pairs, the second half of
    them split into B and a deferred W; then B0 with pending W; the pending W."""
    counts: dict[tuple[int, str], int] = defaultdict(int)
    pending: list[tuple[int, int]] = []
    order: list[Step] = []

    def action(kind: str, chunk: int) -> Action:
        key = (chunk, "B" if kind == "BW" else kind)
        out = Action(kind, chunk, counts[key])
        counts[key] += 1
        if kind == "B":
            pending.append((chunk, out.mb))
        return out

    def add(kind: str, chunk: int) -> None:
        order.append((action(kind, chunk),))

    def overlapped(f_chunk: int, b_chunk: int) -> None:
        order.append((action("F", f_chunk), action("BW", b_chunk)))

    def weight() -> None:
        if pending:
            chunk, mb = pending.pop(0)
            order.append((Action("W", chunk, mb),))

    for _ in range(2 * (p - rank - 1)):
        add("F", 0)
    for _ in range(rank + 1):
        add("F", 0)
        add("F", 1)
    for _ in range(p - rank - 1):
        add("B", 1)
        weight()
        add("F", 1)
    for i in range(m - 2 * p + rank + 1):
        if i == 0 and rank == p - 1:
            add("F", 0)
            add("BW", 1)
        else:
            overlapped(0, 1)
        overlapped(1, 0)
    for _ in range(p - rank - 1):
        add("BW", 1)
        overlapped(1, 0)
    split = False
    for i in range(rank + 1):
        if i == (rank + 1) // 2 and rank % 2 == 1:
            split = True
        add("B" if split else "BW", 1)
        if i == (rank + 1) // 2 and rank % 2 == 0:
            split = True
        add("B" if split else "BW", 0)
    for _ in range(p - rank - 1):
        weight()
        add("B" if split else "BW", 0)
    for _ in range(rank + 1):
        weight()
    return order
