"""Pipeline schedules: micro-batches in flight per rank and the bubble.

GPipe (Huang et al. 2019) runs all m forwards before the backwards: every rank holds m
micro-batches. 1F1B / PipeDream-Flush (Narayanan et al. 2021): rank i of p holds min(p - i, m).
Interleaved 1F1B (Narayanan et al. SC'21, Sec. 2.2): rank i warms up 2(p - i - 1) + (v - 1)p
chunk-forwards, so it holds that many plus one chunk-micro-batches, min m·v; on rank 0 this is
L/p layers × (1 + (p-1)/(p·v)) micro-batches' worth (Korthikanti et al. 2022, Sec. 4.2.3).

Step time with per-rank micro-batch times t_i (Alpa, Zheng et al. OSDI'22, Sec. 5.2):
T = Σ_i t_i + (m - 1)·max_j t_j for GPipe and 1F1B; with v chunks per rank the fill and drain
shrink v-fold: bubble = (Σ_i t_i - max_j t_j)/v, which is (p-1)/(v·m) of the ideal time
m·max_j t_j when stages are equal.

Zero-bubble and DualPipe schedules split the backward into the input gradient B and the weight
gradient W (Qi et al. 2023, Sec. 2), so their bubbles need a rank's forward F, B and W apart
(``PassTimes``). Their closed forms below are checked against a discrete-event simulation of the op
orders torch 2.13 runs (``planner/validate/schedule.py``, ``tests/test_schedule_sim.py``) in the
regime the cost model produces, W <= F <= B (W is the weight-gradient GEMMs, a subset of the
forward's work; B adds the attention backward and recomputation). Unequal ranks enter as in
Alpa's form above: Σ_i g_i − max_j g_j with g the per-rank term of the equal-stage formula.
"""

from __future__ import annotations

from dataclasses import dataclass

ZERO_BUBBLE = ("zb-h1", "interleaved-zb")
DUALPIPE = ("dualpipe-v", "dualpipe")


@dataclass(frozen=True, slots=True, kw_only=True)
class PassTimes:
    """One rank's per-micro-batch seconds over all its chunks, split by pass."""

    forward_s: float
    """Forward compute and its exposed communication (F)."""
    input_grad_s: float
    """Backward for the input gradient, recomputation and the rest of the exposed communication (B)."""
    weight_grad_s: float
    """Backward for the weight gradient: the weight-gradient GEMMs (W)."""
    hideable_s: float = 0.0
    """Exposed EP all-to-all and PP send/recv that an overlapped F&B pair can hide (DualPipe)."""
    compute_s: float = 0.0
    """Compute (with recomputation) of F, B and W: what that communication can hide behind."""
    ep_comm_s: float = 0.0
    """Exposed EP communication of F and B, which Megatron's EP overlap hides (``moe_overlap``)."""

    @property
    def total_s(self) -> float:
        return self.forward_s + self.input_grad_s + self.weight_grad_s


def chunks_per_rank(schedule: str, v: int) -> int:
    """Model chunks a rank holds: v, or 2 for DualPipe (one per direction, v = 1)."""
    return 2 if schedule == "dualpipe" else v


def head_microbatches(schedule: str, pp: int, m: int) -> int:
    """Micro-batches whose head input and logits the last stage holds at its peak: its last chunk
    runs each micro-batch's backward right after its forward (1F1B: the last stage has no warm-up,
    Narayanan et al. SC'21 Sec. 2.2; interleaved: the last rank's warm-up forwards fill its other
    chunks first, so the last chunk also alternates), so one; GPipe runs every forward first, so
    all m. Zero-bubble schedules (ZB-H1, interleaved ZB) keep the head's input and its norm's
    until the deferred weight pass: the last rank defers p − 1 of them (Qi et al. 2023, Table 1;
    torch's order), so min(p, m); its fp32 logits go with the input pass (``logits_microbatches``)."""
    if pp > 1 and schedule in ZERO_BUBBLE:
        return min(pp, m)
    return m if schedule == "gpipe" and pp > 1 else 1


def logits_microbatches(schedule: str, pp: int, m: int) -> int:
    """Micro-batches whose fp32 logits the last stage holds at its peak: as ``head_microbatches``,
    but one under zero bubble too, where the loss's backward (softmax and cross-entropy, above the
    head's weight-gradient GEMM) runs in the input pass and the graph above that GEMM is dropped
    with it (``torch.distributed.pipelining._backward.stage_backward_input`` detaches the loss)."""
    return m if schedule == "gpipe" and pp > 1 else 1


def first_chunk_microbatches(schedule: str, pp: int, rank: int, m: int, in_flight: int) -> int | None:
    """Of rank 0's chunk-micro-batches in flight at its peak, those of its first chunk (the one that
    reads the token ids and receives nothing), when the schedule fixes the mix; None otherwise
    (the cost model then takes the average over the rank's chunks).

    Interleaved ZB (torch's ``ScheduleInterleavedZeroBubble``): rank 0's first chunk runs its weight
    pass as a full backward (stage 0 has no input gradient), and the later chunks finish theirs
    first, so at the peak its first chunk holds min(2p, m) of the v·p (counted on torch's op order
    in ``tests/test_pipeline_zero_bubble_mix.py`` for p in {2, 4}, v in {2, 3})."""
    if schedule == "interleaved-zb" and rank == 0 and pp > 1:
        return min(2 * pp, m, in_flight)
    return None


def in_flight_microbatches(schedule: str, pp: int, rank: int, m: int, v: int) -> int:
    """Chunk-micro-batches (one chunk's activations for one micro-batch; ``chunks_per_rank`` of them
    make a micro-batch's on the rank) that rank ``rank`` holds at peak, counted from forward to W.

    - ZB-H1: p on every rank (Qi et al. 2023, Table 1: p·M_B; rank i defers i W passes).
    - interleaved ZB: v·p on every rank (torch's order: (v − 1)p + p − 1 − i warm-up forwards plus i
      deferred W passes plus one).
    - ZB-V: 2p on every rank, 1F1B's peak of p whole micro-batches (Qi et al. 2024, Sec. 6).
    - DualPipeV: 2p + 1 on every rank (DeepSeek-V3 report Table 2: PP + 1 chunks' activations with
      PP = 2p chunks; an overlapped pair's forward runs while its backward still holds its own).
    - DualPipe: p + 1 on every rank (the same table with PP = p).
    ``tests/test_schedule_sim.py`` counts these on the simulated op orders."""
    if pp == 1:
        return 1
    if schedule == "gpipe":
        return m
    if schedule == "1f1b":
        return min(pp - rank, m)
    if schedule == "zb-h1":
        return min(pp, m)
    if schedule == "interleaved-zb":
        return min(v * pp, m * v)
    if schedule == "zb-v":
        return min(2 * pp, 2 * m)
    if schedule == "dualpipe-v":
        return 2 * pp + 1
    if schedule == "dualpipe":
        return min(pp + 1, 2 * m)
    return min(2 * (pp - rank - 1) + (v - 1) * pp + 1, m * v)


def bubble_time_s(rank_times_s: list[float], v: int, counts: list[int] | None = None) -> float:
    """Pipeline fill and drain: (Σ_i t_i - max_j t_j) / v seconds.

    ``counts``: how many ranks have each time (ranks with equal work are passed once)."""
    weights = counts or [1] * len(rank_times_s)
    total = sum(t * n for t, n in zip(rank_times_s, weights))
    return (total - max(rank_times_s)) / v


def uniform_bubble_fraction(pp: int, m: int, v: int = 1) -> float:
    """Bubble over ideal time for equal stages: (p - 1)/(v·m) (Narayanan et al. SC'21, eq. 1 and 2)."""
    return (pp - 1) / (v * m)


def _spread_s(terms: list[float], counts: list[int] | None) -> float:
    """Σ_i g_i − max_j g_j over ranks (``counts``: how many ranks have each term)."""
    weights = counts or [1] * len(terms)
    return sum(g * n for g, n in zip(terms, weights)) - max(terms)


def zero_bubble_h1_bubble_s(ranks: list[PassTimes], v: int, counts: list[int] | None = None) -> float:
    """ZB-H1 (v = 1) and interleaved zero bubble (v > 1) bubble, seconds: (p − 1)(T_F + T_B − T_W) / v.

    Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024 (arXiv 2401.10241), Table 1 (ZB-H1);
    the 1/v of interleaving as in Narayanan et al. SC'21 eq. 2. Exact for torch's orders when W <= F."""
    return _spread_s([max(0.0, r.forward_s + r.input_grad_s - r.weight_grad_s) for r in ranks], counts) / v


def zbv_bubble_s(ranks: list[PassTimes], counts: list[int] | None = None) -> float:
    """ZB-V bubble, seconds: (p − 1)·max(B_c, 2(B_c − W_c)) with chunk times B_c = T_B/2, W_c = T_W/2.

    The schedule is Qi et al. 2024 (ZB-V, arXiv 2401.10241 Sec. 6; torch's ScheduleZBVZeroBubble); the
    paper states it bubble-free only at T_F = T_B = T_W. This closed form is derived from torch's order
    by the simulation and is exact there for W <= F <= B and m >= 2p − 1."""
    return _spread_s([max(r.input_grad_s, 2 * (r.input_grad_s - r.weight_grad_s)) / 2 for r in ranks], counts)


def dualpipe_bubble_s(ranks: list[PassTimes], pp: int, schedule: str, counts: list[int] | None = None) -> float:
    """DualPipe / DualPipeV bubble, seconds: (PP/2 − 1)(F&B + B − 3W), DeepSeek-V3 report (arXiv
    2412.19437) Table 2, with B the full backward and F&B the pair's time without overlap (F + B):
    per chunk F + 2·B_in − W. The overlap's gain is ``dualpipe_overlap_s``.

    DualPipeV on p ranks has PP = 2p chunks of half a rank's work each: (p − 1)(F + 2B − W)/2 in rank
    times; exact against torch's order for F = B and an upper bound within 1/3 otherwise (the report's
    Figure 5 order differs from torch's). DualPipe on p ranks: PP = p, and a rank's per-micro-batch
    times are one chunk's (each micro-batch crosses one of its two chunks), so (p/2 − 1)(F + 2B − W),
    with the same check against ``deepseek-ai/DualPipe``'s order."""
    terms = [r.forward_s + 2 * r.input_grad_s - r.weight_grad_s for r in ranks]
    if schedule == "dualpipe-v":
        return _spread_s([g / 2 for g in terms], counts)
    return (pp // 2 - 1) * max(terms)


def dualpipe_overlap_s(rank: PassTimes, pp: int, m: int, schedule: str) -> float:
    """Seconds the overlapped forward-and-backward pairs hide on the critical path.

    DeepSeek-V3 report Sec. 3.2.1: in a pair, one chunk's all-to-all and PP communication run behind
    the other's compute. Each pair hides min(communication, compute) of one chunk; torch's DualPipeV
    order puts 2m − p − 2 pairs on the critical path (exact in the simulation, which gives the pair
    the time F + B + W − hidden). DualPipe runs the same phases on p/2 half-ranks with m/2 micro-batches
    per direction: m − p/2 − 2 pairs, each hiding a rank's per-micro-batch amount (also exact)."""
    hidden = min(rank.hideable_s, rank.compute_s)
    if schedule == "dualpipe-v":
        return max(0, 2 * m - pp - 2) * hidden / 2
    return max(0, m - pp // 2 - 2) * hidden


def schedule_bubble_s(schedule: str, pp: int, v: int, ranks: list[PassTimes],
                      counts: list[int] | None = None) -> float:
    """The bubble of ``schedule``: the flush schedules' ``bubble_time_s`` or the split-backward forms."""
    if pp == 1:
        return 0.0
    if schedule in ZERO_BUBBLE:
        return zero_bubble_h1_bubble_s(ranks, v, counts)
    if schedule == "zb-v":
        return zbv_bubble_s(ranks, counts)
    if schedule in DUALPIPE:
        return dualpipe_bubble_s(ranks, pp, schedule, counts)
    return bubble_time_s([r.total_s for r in ranks], v, counts)
