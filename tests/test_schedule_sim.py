"""The pipeline closed forms (``costmodels.pipeline``) against a discrete-event simulation of the op
orders torch 2.13 runs (``planner.validate.schedule``; DualPipe, not in torch, as ``deepseek-ai/DualPipe``'s
``dualpipe.py`` orders it), on a grid of p, m and v.

Times are per chunk: f (forward), b (input gradient), w (weight gradient), in the regime the cost
model produces, w <= f <= b (W is the weight-gradient GEMMs, a subset of the forward's work; B adds
the attention backward and recomputation). A rank's per-micro-batch times are v times a chunk's.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from costmodels.pipeline import (PassTimes, dualpipe_overlap_s, in_flight_microbatches, schedule_bubble_s)
from costmodels.stage_split import rank_chunks
from planner.validate.schedule import ChunkTimes, simulate_makespan_s, step_orders
from planner.validate.schedule_orders import Action

# (f, b, w) with w <= f <= b; the first two have f = b
CHUNK_TIMES = [(1.0, 1.0, 1.0), (1.0, 1.0, 0.5), (1.0, 1.2, 0.9), (1.1, 1.3, 0.7), (1.0, 1.5, 0.5),
               (1.0, 2.0, 1.0), (0.8, 2.0, 0.4)]
PIPELINES = [2, 3, 4, 6, 8]


def _grid(schedule: str):
    """(p, m, v) the layout rules allow for ``schedule`` (``costmodels.layout._schedule_rules``)."""
    for p in PIPELINES:
        vs = {"1f1b": [1], "zb-h1": [1], "interleaved": [2, 3], "interleaved-zb": [2, 3], "dualpipe": [1]}.get(
            schedule, [2])
        least = {"zb-v": 2 * p - 1, "dualpipe-v": 2 * p, "dualpipe": 2 * p}.get(schedule, p)
        for m, v in itertools.product(sorted({least, 2 * p, 3 * p, 4 * p + 1}), vs):
            if schedule in ("interleaved", "interleaved-zb") and m % p:
                continue
            if schedule == "dualpipe" and (p % 2 or m % 2):
                continue
            yield p, m, v


def _model(schedule: str, p: int, m: int, v: int, f: float, b: float, w: float) -> float:
    """m · (rank time) + closed-form bubble, with the rank's F, B, W = v × a chunk's."""
    ranks = [PassTimes(forward_s=v * f, input_grad_s=v * b, weight_grad_s=v * w)] * p
    return m * v * (f + b + w) + schedule_bubble_s(schedule, p, v, ranks)


def _simulated(schedule: str, p: int, m: int, v: int, f: float, b: float, w: float, hidden: float = 0.0) -> float:
    times = [ChunkTimes(forward_s=f, input_grad_s=b, weight_grad_s=w, overlapped_s=f + b + w - hidden)] * p
    return simulate_makespan_s(schedule, p, m, v, times)


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved", "zb-h1", "interleaved-zb", "zb-v"])
def test_closed_form_step_time_equals_the_simulation(schedule):
    """Exact (to rounding) on every grid point: 1F1B (p−1)(F+B+W), interleaved the same over v,
    ZB-H1 and interleaved ZB (p−1)(F+B−W)/v, ZB-V (p−1)·max(B_c, 2(B_c−W_c)). Example, ZB-H1 at p = 4,
    m = 8, f = b = w = 1: 8 · 3 + 3 · (1 + 1 − 1) = 27."""
    assert _model("zb-h1", 4, 8, 1, 1.0, 1.0, 1.0) == 27.0 == _simulated("zb-h1", 4, 8, 1, 1.0, 1.0, 1.0)
    for (p, m, v), (f, b, w) in itertools.product(list(_grid(schedule)), CHUNK_TIMES):
        assert _model(schedule, p, m, v, f, b, w) == pytest.approx(_simulated(schedule, p, m, v, f, b, w),
                                                                   rel=1e-12), (p, m, v, f, b, w)


@pytest.mark.parametrize("schedule", ["dualpipe-v", "dualpipe"])
def test_dualpipe_bubble_is_the_reports_formula_within_a_third(schedule):
    """DeepSeek-V3 Table 2's (PP/2 − 1)(F&B + B − 3W), F&B = F + B, with PP = 2p chunks (DualPipeV) or
    PP = p (DualPipe), is exact for the orders when f = b; otherwise it over-states the simulated
    bubble by at most 1/3 (DualPipeV p = 2, b = 2f: 4 against 3): the report's Figure 5 is one order,
    the warm-up torch and ``dualpipe.py`` run differs in detail. DualPipe at p = 2 has no bubble term."""
    worst = 0.0
    for (p, m, v), (f, b, w) in itertools.product(list(_grid(schedule)), CHUNK_TIMES):
        ideal = _model(schedule, p, m, v, f, b, w) - schedule_bubble_s(
            schedule, p, v, [PassTimes(forward_s=v * f, input_grad_s=v * b, weight_grad_s=v * w)] * p)
        model, sim = _model(schedule, p, m, v, f, b, w) - ideal, _simulated(schedule, p, m, v, f, b, w) - ideal
        if f == b:
            assert model == pytest.approx(sim, rel=1e-12, abs=1e-12), (p, m, f, b, w)
        assert sim - 1e-9 <= model <= sim * (1 + 1 / 3) + 1e-9, (p, m, f, b, w)
        worst = max(worst, model / sim - 1 if sim else 0.0)
    assert worst == pytest.approx(1 / 3)


@pytest.mark.parametrize("schedule", ["dualpipe-v", "dualpipe"])
@pytest.mark.parametrize("hidden", [0.1, 0.6])
def test_dualpipe_overlap_hides_one_chunk_of_communication_per_pair_on_the_critical_path(schedule, hidden):
    """Each overlapped pair takes F + B + W − h; with f = b the step is the closed form minus
    (2m − p − 2)·h for DualPipeV, (m − p/2 − 2)·h for DualPipe, exactly (``dualpipe_overlap_s``)."""
    for p, m, v in _grid(schedule):
        f = b = 1.0
        w = 0.7
        rank = PassTimes(forward_s=v * f, input_grad_s=v * b, weight_grad_s=v * w, hideable_s=v * hidden,
                         compute_s=v * (f + b + w))
        model = _model(schedule, p, m, v, f, b, w) - dualpipe_overlap_s(rank, p, m, schedule)
        assert model == pytest.approx(_simulated(schedule, p, m, v, f, b, w, hidden), rel=1e-12), (p, m)


def _peak_held(steps) -> int:
    """Most chunk-micro-batches alive on a rank: counted from their F to their W (or full backward)."""
    held = peak = 0
    for step in steps:
        for action in step:
            held += 1 if action.kind == "F" else -1 if action.kind in ("W", "BW") else 0
            peak = max(peak, held)
    return peak


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved", "zb-h1", "interleaved-zb", "zb-v", "dualpipe-v",
                                      "dualpipe"])
def test_in_flight_memory_formula_counts_the_simulated_orders(schedule):
    """ZB-H1 holds p on every rank where 1F1B holds p − i; interleaved ZB v·p; ZB-V 2p; DualPipeV
    2p + 1 (a pair's forward is counted before its backward frees); DualPipe p + 1."""
    for p, m, v in _grid(schedule):
        orders = step_orders(schedule, p, m, v)
        for i in range(p):
            assert _peak_held(orders[i]) == in_flight_microbatches(schedule, p, i, m, v), (p, m, v, i)


def _torch_steps(actions, chunks):
    kinds = {"FORWARD": "F", "BACKWARD_INPUT": "B", "BACKWARD_WEIGHT": "W", "FULL_BACKWARD": "BW"}
    out = []
    for a in actions:
        if a is None:
            continue
        parts = a.sub_actions or (a,)
        out.append(tuple(Action(kinds[x.computation_type.name], chunks.index(x.stage_index), x.microbatch_index)
                         for x in parts))
    return out


def test_orders_are_torchs():
    """Each rank's steps equal torch 2.13's ``_calculate_single_rank_operations`` (idle slots dropped)."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    for p in (2, 3, 4):
        for m in sorted({p, p + 1, 2 * p - 1, 2 * p, 3 * p + 1}):
            rounds = max(1, m // p)
            for v in (1, 2, 3):
                if m % rounds:
                    continue
                state = SimpleNamespace(n_local_stages=v, microbatches_per_round=m // rounds, pp_group_size=p,
                                        _n_microbatches=m)
                ours = step_orders("zb-h1" if v == 1 else "interleaved-zb", p, m, v)
                for i in range(p):
                    theirs = schedules.ScheduleInterleavedZeroBubble._calculate_single_rank_operations(state, i)
                    assert _torch_steps(theirs, rank_chunks("interleaved-zb", p, v)[i]) == ours[i], (p, m, v, i)
            state = SimpleNamespace(pp_group_size=p, _n_microbatches=m, num_stages=2 * p)
            for name, cls in (("zb-v", schedules.ScheduleZBVZeroBubble), ("dualpipe-v", schedules.ScheduleDualPipeV)):
                if name == "dualpipe-v" and m < 2 * p:
                    continue
                ours = step_orders(name, p, m, 2)
                for i in range(p):
                    theirs = cls._calculate_single_rank_operations(state, i)
                    assert _torch_steps(theirs, rank_chunks(name, p, 2)[i]) == ours[i], (name, p, m, i)
