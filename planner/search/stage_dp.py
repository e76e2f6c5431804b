"""Inter-operator pass of Alpa: slice a layer sequence into pipeline stages by dynamic programming.

Alpa (Zheng et al., OSDI'22, section 5.2, eq. 2-3) minimises the pipeline latency

    T* = min over slicings of { sum_{i=1..S} t_i  +  (B - 1) * max_{j} t_j }        (eq. 2)

where t_i is the time of stage i for one micro-batch (forward + backward) and B the number
of micro-batches. The max term is handled by enumerating t_max over the candidate stage
times and solving, for each t_max,

    F(s, k; t_max) = min_{k <= i <= K} { t(k..i) + F(s - 1, i + 1; t_max) }          (eq. 3)
                     subject to t(k..i) <= t_max and memory(k..i) <= cap,
    F(0, K + 1; t_max) = 0,

F(s, k) being the least total latency of putting layers k..K on s stages. Then
T*(t_max) = F(S, 1; t_max) + (B - 1) * t_max. Our stages all use the same sub-mesh (the
planner fixes dp x tp per stage), so only the layer boundaries are chosen; the first and
last stage also carry the embedding and output layer (``first_extra_*``, ``last_extra_*``),
which makes non-uniform stages worthwhile.

Pure Python: no torch, no I/O. ``brute_force_slice_stages`` is the twin used by the tests.
"""

from __future__ import annotations

import bisect
import math
from itertools import combinations
from typing import Iterator, Sequence

_REL_EPS = 1e-12


def _prefix(values: Sequence[float]) -> list[float]:
    out = [0.0]
    for v in values:
        out.append(out[-1] + float(v))
    return out


class _Stages:
    """Stage time and memory of layers [k, i) on stage index ``s`` (0-based)."""

    def __init__(self, costs, mem, act, inflight, num_stages, extras):
        self.t, self.m, self.a = _prefix(costs), _prefix(mem), _prefix(act)
        self.inflight, self.num_stages = inflight, num_stages
        self.first_s, self.last_s, self.first_b, self.last_b = extras

    def extra_s(self, s: int) -> float:
        """What stage s carries beside its layers: the embedding on the first, the head on the last."""
        return (self.first_s if s == 0 else 0.0) + (self.last_s if s == self.num_stages - 1 else 0.0)

    def extra_bytes(self, s: int) -> float:
        return (self.first_b if s == 0 else 0.0) + (self.last_b if s == self.num_stages - 1 else 0.0)

    def time_s(self, s: int, k: int, i: int) -> float:
        return self.t[i] - self.t[k] + self.extra_s(s)

    def memory_bytes(self, s: int, k: int, i: int) -> float:
        return self.m[i] - self.m[k] + self.inflight[s] * (self.a[i] - self.a[k]) + self.extra_bytes(s)


def _solve_dp(st: _Stages, num_layers: int, t_max: float, cap: float):
    """Eq. 3 for one t_max: returns (F(S, 1), layers per stage) or None if infeasible.

    Ties in F are broken by the smaller sum of squared stage times (more balanced stages).
    """
    S, K = st.num_stages, num_layers
    tol = _REL_EPS * max(1.0, abs(t_max))
    limit_s = t_max + tol
    inf = math.inf
    # stages s..S-1 over layers k..K-1: least F, its sum of squared stage times, next boundary
    f_of = [[inf] * (K + 1) for _ in range(S + 1)]
    q_of = [[inf] * (K + 1) for _ in range(S + 1)]
    next_of = [[-1] * (K + 1) for _ in range(S + 1)]
    f_of[S][K], q_of[S][K], next_of[S][K] = 0.0, 0.0, K
    times, held, acts = st.t, st.m, st.a  # ``_Stages.time_s`` and ``memory_bytes`` inlined: the inner loop
    most = _most_layers(times, limit_s)
    for s in range(S - 1, -1, -1):
        f_after, q_after = f_of[s + 1], q_of[s + 1]
        extra_s, extra_bytes, inflight = st.extra_s(s), st.extra_bytes(s), st.inflight[s]
        f_here, q_here, next_here = f_of[s], q_of[s], next_of[s]
        # stage s starts at layer k only where the s stages before it can hold k layers and the
        # S - s from it the rest, at most ``most`` layers each: other states are unreachable from
        # the first layer or cannot reach the last, so leaving them at inf changes no answer
        for k in range(min(K - (S - s), s * most), max(s, K - (S - s) * most) - 1, -1):
            best_f, best_q, best_i = inf, inf, -1
            t_k, m_k, a_k = times[k], held[k], acts[k]
            for i in range(k + 1, K - (S - s - 1) + 1):
                rest_f = f_after[i]
                if rest_f == inf:
                    continue
                t = times[i] - t_k + extra_s
                if t > limit_s:
                    break
                if held[i] - m_k + inflight * (acts[i] - a_k) + extra_bytes > cap:
                    continue
                f, q = t + rest_f, t * t + q_after[i]
                if f < best_f - tol or (f <= best_f + tol and q < best_q):
                    best_f, best_q, best_i = f, q, i
            f_here[k], q_here[k], next_here[k] = best_f, best_q, best_i
    if f_of[0][0] == inf:
        return None
    counts, k = [], 0
    for s in range(S):
        i = next_of[s][k]
        counts.append(i - k)
        k = i
    return f_of[0][0], tuple(counts)


def _most_layers(times: list[float], limit_s: float) -> int:
    """An upper bound on the layers one stage can hold within ``limit_s``: any n consecutive layers
    take at least the n cheapest layers' time (plus one, for the rounding of prefix sums)."""
    costs = sorted(b - a for a, b in zip(times, times[1:]))
    total, n = 0.0, 0
    for cost in costs:
        total += cost
        if total > limit_s * (1 + 1e-9):
            break
        n += 1
    return min(n + 1, len(costs))


def _feasible(st: _Stages, num_layers: int, t_max: float, cap: float) -> bool:
    """Whether some slicing keeps every stage within ``t_max`` and ``cap``: the same predicate as
    ``_solve_dp(...) is not None``, in O(S·K) instead of O(S·K²).

    Greedy: each stage ends as late as its time, memory and the one layer owed to every later
    stage allow. Both limits only tighten as a stage grows, so if any slicing ends stage s at b_s,
    greedy ends it at g_s >= b_s (induction: stage s starts no later, so [g_(s-1), b_s) fits too).
    """
    S, K = st.num_stages, num_layers
    limit_s = t_max + _REL_EPS * max(1.0, abs(t_max))
    times, held, acts = st.t, st.m, st.a  # ``_Stages.time_s`` and ``memory_bytes`` inlined
    k = 0
    for s in range(S):
        last_end = K - (S - s - 1)
        extra_s, extra_bytes, inflight = st.extra_s(s), st.extra_bytes(s), st.inflight[s]
        t_k, m_k, a_k = times[k], held[k], acts[k]
        end = k
        while end < last_end and times[end + 1] - t_k + extra_s <= limit_s \
                and held[end + 1] - m_k + inflight * (acts[end + 1] - a_k) + extra_bytes <= cap:
            end += 1
        if end == k:
            return False
        k = end
    return k == K


def _candidate_t_max(st: _Stages, num_layers: int, low: float = -math.inf, high: float = math.inf) -> list[float]:
    """Every stage time a slicing can produce (Alpa enumerates t_max over these) within [low, high]:
    the first stage's windows start at layer 0, the last stage's end at the last layer, and only a
    middle stage's may start and end anywhere. An optimal slicing's largest stage time is among them,
    and a t_max that no stage time equals gives no value below the one of the largest stage time its
    slicing has. The window of a start layer is found by bisection on the prefix sums, widened by a
    relative 1e-9 against their rounding, and each value then held to [low, high] as computed."""
    values: set[float] = set()
    times, S, K = st.t, st.num_stages, num_layers
    first_s = st.extra_s(0)
    values.update([times[i] - times[0] + first_s for i in range(1, K + 1)])  # ``time_s`` of stage 0
    if S > 1:
        last_s = st.extra_s(S - 1)
        values.update([times[K] - times[k] + last_s for k in range(K)])
    if S > 2:  # a middle stage carries no extra
        if low == -math.inf and high == math.inf:
            for k in range(1, K):
                t_k = times[k]
                values.update([times[i] - t_k for i in range(k + 1, K)])
        else:
            widen = 1e-9 * max(abs(low) if low > -math.inf else 0.0, abs(high) if high < math.inf else 0.0,
                               abs(times[K]), 1.0)
            for k in range(1, K):
                t_k = times[k]
                start = max(k + 1, bisect.bisect_left(times, t_k + low - widen, k + 1, K))
                stop = bisect.bisect_right(times, t_k + high + widen, start, K)
                values.update([times[i] - t_k for i in range(start, stop)])
    return sorted(v for v in values if low <= v <= high)


def slice_stages(layer_costs_s: Sequence[float], layer_memory_bytes: Sequence[float], num_stages: int,
                 num_microbatches: int, memory_cap_bytes: float, *, first_extra_s: float = 0.0,
                 last_extra_s: float = 0.0, first_extra_bytes: float = 0.0, last_extra_bytes: float = 0.0,
                 layer_activation_bytes: Sequence[float] | None = None,
                 inflight_microbatches: Sequence[int] | None = None) -> tuple[int, ...] | None:
    """Layers per pipeline stage minimising Alpa's eq. 2 under a per-stage memory cap.

    ``layer_costs_s[l]``: forward + backward time of layer l for one micro-batch (seconds).
    ``layer_memory_bytes[l]``: memory of layer l that does not grow with micro-batches in
    flight (weights, gradients, optimizer states), bytes. ``layer_activation_bytes[l]``
    (optional): activation bytes of one micro-batch, multiplied on stage s by
    ``inflight_microbatches[s]`` (1F1B: S - s; GPipe: B; default 1 for every stage).
    Extras are added to the first / last stage. Returns a tuple of ``num_stages`` positive
    counts summing to the number of layers, or None when no slicing fits.

    The candidate t_max are enumerated in windows (``_candidate_windows``): every slicing's
    largest stage time is at least the mean stage time, so the first window starts there, and
    a window whose largest candidate is feasible holds the least feasible one. The answer is
    the one the whole candidate list gives (``tests/test_alpa_stage_dp.py``).
    """
    K, S, B = len(layer_costs_s), num_stages, num_microbatches
    if len(layer_memory_bytes) != K:
        raise ValueError("layer_memory_bytes must have one entry per layer")
    if S < 1 or B < 1:
        raise ValueError("num_stages and num_microbatches must be at least 1")
    if S > K:
        return None
    act = list(layer_activation_bytes) if layer_activation_bytes is not None else [0.0] * K
    inflight = list(inflight_microbatches) if inflight_microbatches is not None else [1] * S
    st = _Stages(layer_costs_s, layer_memory_bytes, act, inflight, S,
                 (first_extra_s, last_extra_s, first_extra_bytes, last_extra_bytes))
    # Every slicing's F (eq. 3) is the same total: all layers' times plus both extras, since each
    # layer and each extra lands on exactly one stage. So it bounds F for any t_max.
    f_min = st.t[K] + st.first_s + st.last_s
    best_value, best_counts = math.inf, None
    started = False
    for cands in _candidate_windows(st, K, f_min / S, memory_cap_bytes):
        # Feasibility only grows with t_max: binary-search the first feasible candidate.
        lo = 0 if started else bisect.bisect_left(range(len(cands)), True,
                                                   key=lambda j: _feasible(st, K, cands[j], memory_cap_bytes))
        if lo == len(cands):
            continue
        started = True
        for t_max in cands[lo:]:
            if f_min + (B - 1) * t_max >= best_value:
                return best_counts  # no larger t_max can win (Alpa's early stop, section 5.2)
            found = _solve_dp(st, K, t_max, memory_cap_bytes)
            if found is not None and found[0] + (B - 1) * t_max < best_value:
                best_value, best_counts = found[0] + (B - 1) * t_max, found[1]
    return best_counts


def _candidate_windows(st: _Stages, num_layers: int, mean_s: float, cap: float) -> Iterator[list[float]]:
    """``_candidate_t_max`` in consecutive windows, in order, together all of them: those below the mean
    stage time less a relative 1e-9 (none feasible: a slicing's largest stage is at least its mean,
    up to rounding) are left out; then [mean, 2·mean], and while the window's largest candidate is
    not feasible, windows twice as wide; then the rest."""
    low = mean_s * (1 - 1e-9) if mean_s > 0 else -math.inf
    high = 2 * mean_s
    while mean_s > 0 and high < st.t[num_layers] + st.first_s + st.last_s:
        window = _candidate_t_max(st, num_layers, low, high)
        yield window
        if window and _feasible(st, num_layers, window[-1], cap):
            low, high = math.nextafter(high, math.inf), math.inf
            break
        low, high = math.nextafter(high, math.inf), 2 * high
    yield _candidate_t_max(st, num_layers, low, math.inf)


def pipeline_latency_s(counts: Sequence[int], layer_costs_s: Sequence[float], num_microbatches: int, *,
                       first_extra_s: float = 0.0, last_extra_s: float = 0.0) -> float:
    """Alpa eq. 2 for a given slicing: sum of stage times + (B - 1) x the largest."""
    times, k = [], 0
    for s, n in enumerate(counts):
        t = sum(layer_costs_s[k:k + n]) + (first_extra_s if s == 0 else 0.0)
        times.append(t + (last_extra_s if s == len(counts) - 1 else 0.0))
        k += n
    return sum(times) + (num_microbatches - 1) * max(times)


def stage_memory_bytes(counts: Sequence[int], layer_memory_bytes: Sequence[float], *,
                       first_extra_bytes: float = 0.0, last_extra_bytes: float = 0.0,
                       layer_activation_bytes: Sequence[float] | None = None,
                       inflight_microbatches: Sequence[int] | None = None) -> list[float]:
    """Memory of each stage of a slicing (same accounting as ``slice_stages``)."""
    act = layer_activation_bytes or [0.0] * len(layer_memory_bytes)
    inflight = inflight_microbatches or [1] * len(counts)
    out, k = [], 0
    for s, n in enumerate(counts):
        m = sum(layer_memory_bytes[k:k + n]) + inflight[s] * sum(act[k:k + n])
        m += (first_extra_bytes if s == 0 else 0.0) + (last_extra_bytes if s == len(counts) - 1 else 0.0)
        out.append(m)
        k += n
    return out


def brute_force_slice_stages(layer_costs_s, layer_memory_bytes, num_stages, num_microbatches,
                             memory_cap_bytes, **extras) -> tuple[float, tuple[int, ...]] | None:
    """Twin of ``slice_stages``: every slicing, returns (best eq. 2 value, one best slicing)."""
    K = len(layer_costs_s)
    time_extras = {k: v for k, v in extras.items() if k in ("first_extra_s", "last_extra_s")}
    mem_extras = {k: v for k, v in extras.items() if k not in time_extras}
    best = None
    for cuts in combinations(range(1, K), num_stages - 1):
        bounds = (0, *cuts, K)
        counts = tuple(bounds[j + 1] - bounds[j] for j in range(num_stages))
        if max(stage_memory_bytes(counts, layer_memory_bytes, **mem_extras)) > memory_cap_bytes:
            continue
        value = pipeline_latency_s(counts, layer_costs_s, num_microbatches, **time_extras)
        if best is None or value < best[0]:
            best = (value, counts)
    return best
