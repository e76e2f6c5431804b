"""Pipeline schedules as per-rank operation orders, and a timeline simulation (pure Python).

``rank_order`` gives the (kind, chunk, micro-batch) operations one pipeline rank runs, in the
order of GPipe (Huang et al. 2019: all forwards, then all backwards), 1F1B / PipeDream-Flush
(Narayanan et al. 2021: p - i - 1 warm-up forwards, then one forward and one backward
alternately) and interleaved 1F1B (Narayanan et al. SC'21, Sec. 2.2: v model chunks per rank,
micro-batches in groups of p, warm-up 2(p - i - 1) + (v - 1)p forwards); the zero-bubble and
DualPipeV orders (``schedule_orders``, as torch 2.13 runs them) with each B and W drawn as one
backward. DualPipe, which torch does not run, is drawn as 1F1B over a rank's first chunk. The dry
run replays these orders on one stage; ``simulate`` turns them into start/end times for the schedule
plot. ``simulate_makespan_s`` times the split orders (F, B, W, overlapped pairs) for the check of
the closed forms in ``costmodels.pipeline``.
"""

from __future__ import annotations

from dataclasses import dataclass

from costmodels.stage_split import rank_chunks

from .schedule_orders import Action, dualpipev_order, zbv_order, zero_bubble_order

Op = tuple[str, int, int]
"""("F" or "B", local chunk index, micro-batch index)."""
SPLIT_BACKWARD = ("zb-h1", "interleaved-zb", "zb-v", "dualpipe-v")
"""Schedules whose orders split the backward (``schedule_orders``)."""


def _interleaved_chunk(k: int, p: int, v: int, forward: bool) -> tuple[int, int]:
    """(chunk, micro-batch) of the k-th forward (or backward) of a rank in interleaved 1F1B."""
    group, within = divmod(k, p * v)
    chunk = within // p
    if not forward:
        chunk = v - 1 - chunk
    return chunk, group * p + within % p


def rank_order(schedule: str, p: int, i: int, m: int, v: int = 1) -> list[Op]:
    """Operations of pipeline rank ``i`` of ``p`` for ``m`` micro-batches (``v`` chunks per rank)."""
    if schedule in SPLIT_BACKWARD and p > 1:
        ops = [(a.kind[0], a.chunk, a.mb) for step in step_orders(schedule, p, m, v)[i] for a in step]
        return [op for op in ops if op[0] != "W"]
    if schedule == "gpipe" or p == 1:
        return [("F", 0, j) for j in range(m)] + [("B", 0, j) for j in range(m)]
    if schedule == "interleaved" and v > 1:
        total = m * v
        warmup = min(total, 2 * (p - i - 1) + (v - 1) * p)
        fwd = [("F", *_interleaved_chunk(k, p, v, True)) for k in range(total)]
        bwd = [("B", *_interleaved_chunk(k, p, v, False)) for k in range(total)]
    else:
        total, warmup = m, min(m, p - i - 1)
        fwd = [("F", 0, j) for j in range(m)]
        bwd = [("B", 0, j) for j in range(m)]
    order = fwd[:warmup]
    for k in range(total - warmup):
        order += [fwd[warmup + k], bwd[k]]
    return order + bwd[total - warmup:]


@dataclass(frozen=True, slots=True, kw_only=True)
class Interval:
    """One bar of the timeline: a forward, backward or send/receive on one pipeline rank."""

    rank: int
    kind: str
    """``F``, ``B`` or ``comm``."""
    chunk: int
    microbatch: int
    start_s: float
    end_s: float


def simulate(schedule: str, p: int, m: int, v: int, forward_s: list[float], backward_s: list[float],
             comm_s: float) -> list[Interval]:
    """Start and end times of every operation, each rank running its ``rank_order`` in order.

    ``forward_s[i]`` / ``backward_s[i]``: one chunk's forward / backward on rank i (seconds);
    ``comm_s``: one point-to-point transfer between neighbouring stages. An operation waits for
    its rank to be free and for its input: the previous stage's forward (or the next stage's
    backward) of the same micro-batch, plus the transfer. Chunks sit on ranks as ``rank_chunks`` places them.
    """
    orders = [rank_order(schedule, p, i, m, v) for i in range(p)]
    placed = rank_chunks(schedule, p, v)
    done: dict[tuple[str, int, int], float] = {}
    free = [0.0] * p
    cursor = [0] * p
    out: list[Interval] = []
    stages = len({c for held in placed for c in held})
    while any(cursor[i] < len(orders[i]) for i in range(p)):
        progressed = False
        for i in range(p):
            if cursor[i] >= len(orders[i]):
                continue
            kind, chunk, j = orders[i][cursor[i]]
            stage = placed[i][chunk]
            dep = (kind, stage - 1, j) if kind == "F" else (kind, stage + 1, j)
            first = stage == 0 if kind == "F" else stage == stages - 1
            if kind == "B" and first:
                dep, first = ("F", stage, j), False
            if not first and dep not in done:
                continue
            ready = 0.0 if first else done[dep] + (comm_s if dep[1] != stage else 0.0)
            start = max(free[i], ready)
            end = start + (forward_s[i] if kind == "F" else backward_s[i])
            done[(kind, stage, j)] = end
            free[i] = end
            out.append(Interval(rank=i, kind=kind, chunk=chunk, microbatch=j, start_s=start, end_s=end))
            if not first and dep[1] != stage and comm_s > 0:
                out.append(Interval(rank=i, kind="comm", chunk=chunk, microbatch=j, start_s=ready - comm_s,
                                    end_s=ready))
            cursor[i] += 1
            progressed = True
        if not progressed:
            raise ValueError(f"schedule {schedule!r} deadlocks with p={p}, m={m}, v={v}")
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkTimes:
    """Seconds of one chunk's passes on one rank: forward F, input-gradient backward B, weight-gradient
    backward W, and F&B, a forward and a full backward issued together (DualPipeV)."""

    forward_s: float
    input_grad_s: float
    weight_grad_s: float
    overlapped_s: float = 0.0

    def of(self, step: tuple) -> float:
        if len(step) == 2:
            return self.overlapped_s
        return {"F": self.forward_s, "B": self.input_grad_s, "W": self.weight_grad_s,
                "BW": self.input_grad_s + self.weight_grad_s}[step[0].kind]


def step_orders(schedule: str, p: int, m: int, v: int) -> list[list[tuple]]:
    """Every rank's steps (``schedule_orders``); GPipe, 1F1B and interleaved 1F1B as full backwards.

    DualPipe runs DualPipeV's eight phases on p/2 half-ranks (``deepseek-ai/DualPipe``'s
    ``dualpipe.py``: rank r uses half-rank min(r, p − 1 − r) and m/2 micro-batches per direction);
    chunk 0 is the phase-0 direction, chunk 1 the other (``_stage_keys``)."""
    if schedule in ("zb-h1", "interleaved-zb"):
        return [zero_bubble_order(p, i, m, v) for i in range(p)]
    if schedule == "zb-v":
        return [zbv_order(p, i, m) for i in range(p)]
    if schedule == "dualpipe-v":
        return [dualpipev_order(p, i, m) for i in range(p)]
    if schedule == "dualpipe":
        return [dualpipev_order(p // 2, min(i, p - 1 - i), m // 2) for i in range(p)]
    return [[(Action("F" if kind == "F" else "BW", chunk, j),) for kind, chunk, j in rank_order(schedule, p, i, m, v)]
            for i in range(p)]


def _stage_keys(schedule: str, p: int, v: int) -> tuple[list[list[tuple[int, int]]], int]:
    """(each rank's (pipeline, stage) per local chunk, stages per pipeline). One pipeline of all chunks,
    or DualPipe's two of p stages: down (stage r on rank r) and up (stage r on rank p − 1 − r); the first
    half of the ranks runs the down direction as phase 0, the second half the up direction."""
    if schedule != "dualpipe":
        return [[(0, c) for c in held] for held in rank_chunks(schedule, p, v)], p * v
    down, up = (lambda r: (0, r)), (lambda r: (1, p - 1 - r))
    return [[down(r), up(r)] if r < p // 2 else [up(r), down(r)] for r in range(p)], p


def simulate_makespan_s(schedule: str, p: int, m: int, v: int, times: list[ChunkTimes]) -> float:
    """Step time of one pipeline flush by discrete events: each rank runs its steps in order; a step
    starts when the rank is free and its inputs exist: a forward needs the previous model chunk's
    forward of its micro-batch, a backward (B or BW) the next chunk's backward (the last chunk: its
    own forward), a W its own B. No communication time (the closed forms assume none)."""
    orders = step_orders(schedule, p, m, v)
    keys, length = _stage_keys(schedule, p, v)
    done: dict[tuple, float] = {}
    free, cursor = [0.0] * p, [0] * p
    while any(cursor[i] < len(orders[i]) for i in range(p)):
        progressed = False
        for i in range(p):
            while cursor[i] < len(orders[i]):
                step = orders[i][cursor[i]]
                needs = [_input_of(a, keys[i][a.chunk], length) for a in step]
                if any(n is not None and n not in done for n in needs):
                    break
                start = max([free[i]] + [done[n] for n in needs if n is not None])
                free[i] = start + times[i].of(step)
                for a in step:
                    done[("F" if a.kind == "F" else "W" if a.kind == "W" else "B", *keys[i][a.chunk], a.mb)] = free[i]
                cursor[i] += 1
                progressed = True
        if not progressed:
            raise ValueError(f"schedule {schedule!r} deadlocks with p={p}, m={m}, v={v}")
    return max(free)


def _input_of(action: Action, key: tuple[int, int], length: int) -> tuple | None:
    pipe, stage = key
    if action.kind == "F":
        return None if stage == 0 else ("F", pipe, stage - 1, action.mb)
    if action.kind == "W":
        return ("B", pipe, stage, action.mb)
    return ("F", pipe, stage, action.mb) if stage == length - 1 else ("B", pipe, stage + 1, action.mb)
