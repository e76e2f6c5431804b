"""Alpa's inter-operator stage DP (Zheng et al., OSDI'22, eq. 2-3) against its brute-force twin."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from planner.search.stage_dp import brute_force_slice_stages, pipeline_latency_s, slice_stages, stage_memory_bytes


def _instance(rng: random.Random):
    k = rng.randint(1, 9)
    s = rng.randint(1, k)
    costs = [rng.uniform(0.1, 2.0) for _ in range(k)]
    mem = [rng.uniform(0.1, 1.0) for _ in range(k)]
    act = [rng.uniform(0.0, 0.3) for _ in range(k)]
    extras = dict(first_extra_s=rng.uniform(0, 2), last_extra_s=rng.uniform(0, 2),
                  first_extra_bytes=rng.uniform(0, 1), last_extra_bytes=rng.uniform(0, 1),
                  layer_activation_bytes=act, inflight_microbatches=[s - i for i in range(s)])
    return costs, mem, s, rng.randint(1, 16), rng.uniform(0.5, 5.0), extras


def test_stage_dp_equals_brute_force_on_random_instances():
    rng = random.Random(5)
    checked_feasible = 0
    for _ in range(300):
        costs, mem, s, b, cap, extras = _instance(rng)
        got = slice_stages(costs, mem, s, b, cap, **extras)
        ref = brute_force_slice_stages(costs, mem, s, b, cap, **extras)
        if ref is None:
            assert got is None
            continue
        checked_feasible += 1
        assert got is not None and len(got) == s and sum(got) == len(costs) and min(got) >= 1
        value = pipeline_latency_s(got, costs, b, first_extra_s=extras["first_extra_s"],
                                   last_extra_s=extras["last_extra_s"])
        assert value == pytest.approx(ref[0], rel=1e-12)
        mem_extras = {k: v for k, v in extras.items() if k not in ("first_extra_s", "last_extra_s")}
        assert max(stage_memory_bytes(got, mem, **mem_extras)) <= cap
    assert checked_feasible > 100  # the instances exercise the optimiser, not only infeasibility


def test_uniform_layers_split_evenly():
    assert slice_stages([1.0] * 12, [1.0] * 12, 4, 8, 1e9) == (3, 3, 3, 3)


def test_embedding_and_head_make_end_stages_shorter():
    """Heavy first/last stages (embedding, output layer) get fewer layers (non-uniform split)."""
    counts = slice_stages([1.0] * 30, [0.0] * 30, 4, 16, 1e9, first_extra_s=3.0, last_extra_s=3.0)
    assert sum(counts) == 30
    assert counts[0] < counts[1] and counts[-1] < counts[-2]
    uniform_value = pipeline_latency_s((8, 7, 7, 8), [1.0] * 30, 16, first_extra_s=3.0, last_extra_s=3.0)
    assert pipeline_latency_s(counts, [1.0] * 30, 16, first_extra_s=3.0, last_extra_s=3.0) < uniform_value


def test_memory_cap_moves_layers_and_reports_infeasible():
    # 1F1B: stage 0 holds 2 micro-batches of activations, stage 1 holds 1.
    act, inflight = [1.0] * 6, [2, 1]
    counts = slice_stages([1.0] * 6, [0.0] * 6, 2, 4, 5.0, layer_activation_bytes=act, inflight_microbatches=inflight)
    assert counts == (2, 4)
    assert slice_stages([1.0] * 6, [0.0] * 6, 2, 4, 3.0, layer_activation_bytes=act,
                        inflight_microbatches=inflight) is None
    assert slice_stages([1.0] * 3, [0.0] * 3, 4, 4, 1e9) is None  # more stages than layers


def test_importing_planner_alpa_does_not_import_torch():
    code = ("import sys, planner, planner.alpa, planner.search.stage_dp, planner.alpa.ilp, planner.alpa.shard; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def _slice_over_every_candidate(costs, mem, s, b, cap, **extras):
    """``slice_stages`` as Alpa states it: every candidate t_max listed (``_candidate_t_max`` without a
    window), the first feasible found by bisection, then the DP from there to the early stop."""
    import bisect
    import math

    from planner.search.stage_dp import _candidate_t_max, _feasible, _solve_dp, _Stages
    k = len(costs)
    if s > k:
        return None
    act = extras.get("layer_activation_bytes") or [0.0] * k
    st = _Stages(costs, mem, act, extras.get("inflight_microbatches") or [1] * s, s,
                 (extras.get("first_extra_s", 0.0), extras.get("last_extra_s", 0.0),
                  extras.get("first_extra_bytes", 0.0), extras.get("last_extra_bytes", 0.0)))
    cands = _candidate_t_max(st, k)
    lo = bisect.bisect_left(range(len(cands)), True, key=lambda j: _feasible(st, k, cands[j], cap))
    f_min, best = st.t[k] + st.first_s + st.last_s, (math.inf, None)
    for t_max in cands[lo:]:
        if f_min + (b - 1) * t_max >= best[0]:
            break
        found = _solve_dp(st, k, t_max, cap)
        if found is not None and found[0] + (b - 1) * t_max < best[0]:
            best = (found[0] + (b - 1) * t_max, found[1])
    return best[1]


def test_the_windowed_candidates_give_the_slicing_every_candidate_gives():
    """``slice_stages`` lists its candidate t_max in windows from the mean stage time up; the slicing,
    tie-breaks included, is the one listing them all gives: on random instances, on many equal layers
    (where prefix-sum rounding makes near-equal candidates) and where memory forces wide stages."""
    rng = random.Random(11)
    instances = [_instance(rng) for _ in range(300)]
    for _ in range(60):
        k = rng.randint(8, 80)
        s = rng.randint(2, min(k, 24))
        cost = rng.uniform(1e-3, 1.0)
        extras = dict(first_extra_s=rng.uniform(0, 3) * cost, last_extra_s=rng.uniform(0, 3) * cost,
                      layer_activation_bytes=[0.1] * k, inflight_microbatches=[s - i for i in range(s)])
        cap = rng.choice([1e9, rng.uniform(1.0, 4.0) * k / s])  # some caps force uneven, wider stages
        instances.append(([cost] * k, [rng.uniform(0.5, 1.0) for _ in range(k)], s, rng.randint(1, 64), cap, extras))
    uneven = 0
    for costs, mem, s, b, cap, extras in instances:
        got = slice_stages(costs, mem, s, b, cap, **extras)
        assert got == _slice_over_every_candidate(costs, mem, s, b, cap, **extras)
        uneven += got is not None and len(set(got)) > 1
    assert uneven > 50
