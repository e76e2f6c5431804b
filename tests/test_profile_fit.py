"""Pure fitting code of the profiler: bus factors, alpha-beta, monotone smoothing, interpolation."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from profiles import fit
from profiles.build import fit_collective

SIZES = tuple(4096 * 2**i for i in range(14))  # 4 KiB .. 32 MiB, powers of two


@pytest.mark.parametrize(("op", "n", "factor"), [
    ("all_reduce", 8, 2 * 7 / 8),      # nccl-tests PERFORMANCE.md: 2(n-1)/n
    ("all_reduce", 2, 1.0),
    ("all_gather", 4, 3 / 4),          # (n-1)/n
    ("reduce_scatter", 16, 15 / 16),
    ("all_to_all", 2, 1 / 2),
    ("broadcast", 8, 1.0),
    ("send_recv", 2, 1.0),
])
def test_bus_factor_is_the_nccl_tests_convention(op: str, n: int, factor: float) -> None:
    assert fit.bus_factor(op, n) == pytest.approx(factor)


def test_bus_factor_rejects_unknown_op() -> None:
    with pytest.raises(ValueError, match="all_reduce"):
        fit.bus_factor("allreduce", 2)


@settings(max_examples=60, deadline=None)
@given(alpha=st.floats(1e-6, 1e-2), beta=st.floats(1e8, 1e12),
       op=st.sampled_from(fit.COLLECTIVE_OPS), n=st.integers(2, 64))
def test_alpha_beta_fit_recovers_noise_free_model(alpha: float, beta: float, op: str, n: int) -> None:
    times = [alpha + fit.bus_factor(op, n) * s / beta for s in SIZES]
    got_alpha, got_beta = fit.fit_alpha_beta(op, n, SIZES, times)
    assert got_alpha == pytest.approx(alpha, rel=1e-6)
    assert got_beta == pytest.approx(beta, rel=1e-6)


def test_alpha_beta_fit_of_flat_curve_has_no_bandwidth_term() -> None:
    alpha, beta = fit.fit_alpha_beta("all_reduce", 2, SIZES, [1e-3] * len(SIZES))
    assert alpha == pytest.approx(1e-3)
    assert beta is None
    assert fit.alpha_beta_time_s("all_reduce", 2, 1e9, alpha, beta) == pytest.approx(1e-3)


def test_alpha_beta_bandwidth_is_bus_bandwidth() -> None:
    # All-reduce of S over n = 4 at 10 GB/s bus bandwidth takes 2(n-1)/n·S/β = 1.5·S/β.
    beta, s = 10e9, 64 * 2**20
    times = [2e-5 + 1.5 * size / beta for size in SIZES + (s,)]
    _, got_beta = fit.fit_alpha_beta("all_reduce", 4, SIZES + (s,), times)
    assert got_beta == pytest.approx(beta)
    # The measured busbw at 64 MiB is within the latency share (2e-5 of 1e-2 s = 0.2%) of β.
    assert fit.bus_bandwidth_bytes_per_s("all_reduce", 4, s, times[-1]) == pytest.approx(beta, rel=3e-3)


def test_pool_adjacent_violators_known_answer() -> None:
    # [1, 3, 2, 4]: the violating pair (3, 2) pools to its mean 2.5.
    assert fit.isotonic_nondecreasing([1, 3, 2, 4]) == [1, 2.5, 2.5, 4]
    assert fit.isotonic_nondecreasing([5, 4, 3]) == [4, 4, 4]
    assert fit.isotonic_nondecreasing([1, 2, 3]) == [1, 2, 3]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(1e-6, 1.0), min_size=2, max_size=20))
def test_monotone_smoothing_is_nondecreasing_and_keeps_sorted_input(times: list[float]) -> None:
    smoothed = fit.monotone_log_smooth(times)
    assert all(a <= b * (1 + 1e-12) for a, b in zip(smoothed, smoothed[1:]))
    if times == sorted(times):
        assert smoothed == pytest.approx(times)


@settings(max_examples=100, deadline=None)
@given(noisy=st.lists(st.floats(1e-5, 1e-1), min_size=len(SIZES), max_size=len(SIZES)),
       queries=st.lists(st.floats(1.0, 1e10), min_size=2, max_size=30),
       op=st.sampled_from(fit.COLLECTIVE_OPS))
def test_interpolated_curve_is_monotone_everywhere(noisy: list[float], queries: list[float], op: str) -> None:
    """Even from noisy, non-monotone medians the curve never gets faster for a bigger message,
    inside the measured range and beyond it on both sides."""
    curve = fit_collective(op=op, num_ranks=2, ranks_per_node=2, num_nodes=1, dtype="fp32",
                           sizes_bytes=SIZES, median_time_s=tuple(noisy))
    queries = sorted(queries)
    times = [curve.time_s(q) for q in queries]
    assert all(a <= b * (1 + 1e-9) for a, b in zip(times, times[1:]))


def test_interpolation_is_linear_in_log_log_and_hits_measured_points() -> None:
    sizes, times = (1000.0, 4000.0), (1e-4, 4e-4)  # t ∝ S on this segment
    assert fit.interpolate_time_s(sizes, times, 1000.0, 0.0) == pytest.approx(1e-4)
    assert fit.interpolate_time_s(sizes, times, 4000.0, 0.0) == pytest.approx(4e-4)
    # Halfway in log S (S = 2000) the log-log line gives t = 2e-4 (a linear one would too here).
    assert fit.interpolate_time_s(sizes, times, 2000.0, 0.0) == pytest.approx(2e-4)
    # On a power law t ∝ S^0.5, log-log interpolation is exact, linear interpolation is not.
    sizes, times = (1.0, 16.0), (1.0, 4.0)
    assert fit.interpolate_time_s(sizes, times, 4.0, 0.0) == pytest.approx(2.0)


def test_interpolation_extrapolates_with_the_fitted_bandwidth() -> None:
    sizes, times = (1000.0, 2000.0), (1e-4, 2e-4)
    assert fit.interpolate_time_s(sizes, times, 10.0, 1e-7) == pytest.approx(1e-4)  # latency floor
    assert fit.interpolate_time_s(sizes, times, 3000.0, 1e-7) == pytest.approx(2e-4 + 1000 * 1e-7)


@settings(max_examples=40, deadline=None)
@given(t0=st.floats(1e-6, 1e-3), rate=st.floats(1e9, 1e15), bandwidth=st.floats(1e9, 1e13))
def test_throughput_fit_recovers_roofline_with_overhead(t0: float, rate: float, bandwidth: float) -> None:
    shapes = [(m, n, k) for m in (128, 1024, 8192) for n in (256, 4096) for k in (64, 2048)]
    flops = [2.0 * m * n * k for m, n, k in shapes]
    traffic = [2.0 * (m * k + k * n + m * n) for m, n, k in shapes]
    times = [t0 + f / rate + b / bandwidth for f, b in zip(flops, traffic)]
    got = fit.fit_throughput(flops, traffic, times)
    predicted = [fit.throughput_time_s(f, b, *got) for f, b in zip(flops, traffic)]
    assert fit.rms_relative_error(predicted, times) < 1e-6


def test_throughput_fit_keeps_a_rate_when_times_are_flat_in_work() -> None:
    """Overhead-bound or noisy points (times that do not grow with work, seen on a CI machine
    for fp32 attention) still give a compute rate: t = F/R through the origin, whose rate sits
    below every point's achieved F/t maximum and above its minimum."""
    flops = [1e6, 4e6, 1.6e7, 6.4e7]
    times = [2.1e-3, 2.0e-3, 1.9e-3, 1.8e-3]  # noise made them fall: no slope survives
    overhead, rate, bandwidth = fit.fit_throughput(flops, [8.0 * f for f in flops], times)
    achieved = [f / t for f, t in zip(flops, times)]
    assert rate is not None and min(achieved) <= rate <= max(achieved)
    assert overhead == 0.0 and bandwidth is None
    # The profile written from such points loads back (the reader refuses a fit with no rate).
    from profiles.build import fit_compute_table
    from profiles.schema import GemmPoint
    table = fit_compute_table("fp32", tuple(GemmPoint(m=m, n=64, k=64, time_s=t)
                                            for m, t in zip((16, 64, 256, 1024), times)))
    assert table.fit.flops_per_s is not None


def test_rms_relative_error_closed_form() -> None:
    # Errors +10% and -10%: RMS 10%.
    assert fit.rms_relative_error([1.1, 1.8], [1.0, 2.0]) == pytest.approx(0.1)
    assert math.isclose(fit.rms_relative_error([], []), 0.0)


# The fit check of issue 15 on the collectives profile measured here at √2 steps (command and
# load average in its provenance; printed by benchmarks/profile_fit.py): fit on sizes[::2], predict
# the sizes[1::2] that lie inside a fitted regime. Worst error inside regimes per collective, with
# the machine loaded (load average 2.2 before, 7.4 after, other sessions' jobs included):
# all_to_all 21% meets 25%; the five below miss it. Each miss is a single size whose own median
# sits off its neighbours' line by more than the bar; the noise estimates of these curves
# (relative_noise) are 8-15%, so 25% is under 3σ of one point.
_INSIDE_MISSES = {
    "all_reduce": "45% at 2896 KiB (the median is 31% below its regime's line; noise 15%)",
    "all_gather": "38% at 11585 KiB (noise 13%)",
    "reduce_scatter": "35% at 11585 KiB (noise 8%)",
    "broadcast": "30% at 362 KiB (noise 12%)",
    "send_recv": "47% at 2896 KiB, the 2-4 MiB step the full-grid fit splits off as a regime (noise 9%)",
}
# The same command on a quiet machine (load average 0.7 before, no other job; the `-quiet` file):
# all_to_all (22%) and send_recv (20%) meet 25%. Below 1 MiB the medians are then 2-4x the loaded
# run's and not monotonic in size (all_reduce 4 KiB 2.2 ms, 22.75 KiB 1.3 ms): an idle vCPU's wake-up
# latency, which a loaded machine hides, dominates the small messages.
_QUIET_INSIDE_MISSES = {
    "all_reduce": "79% at 362 KiB (noise 12%)",
    "all_gather": "138% at 90.5 KiB (noise 11%)",
    "reduce_scatter": "80% at 45.25 KiB (noise 10%)",
    "broadcast": "38% at 181 MiB (noise 9%)",
}
SQRT2_PROFILE = Path(__file__).resolve().parent.parent / "profiles" / "data" / "cpu-gloo-2proc-collectives.json"
QUIET_SQRT2_PROFILE = SQRT2_PROFILE.with_name("cpu-gloo-2proc-collectives-quiet.json")


def _cases() -> list:
    cases = []
    for path, misses in ((SQRT2_PROFILE, _INSIDE_MISSES), (QUIET_SQRT2_PROFILE, _QUIET_INSIDE_MISSES)):
        for op in fit.COLLECTIVE_OPS:
            marks = [pytest.mark.xfail(strict=True, reason=f"not met on this machine: {misses[op]}")] \
                if op in misses else []
            cases.append(pytest.param(path, op, marks=marks, id=f"{path.stem}-{op}"))
    return cases


@pytest.mark.parametrize(("path", "op"), _cases())
def test_regimes_predict_held_out_sizes_inside_regimes_of_the_sqrt2_profile(path: Path, op: str) -> None:
    """Regimes fitted on every other size of the √2-step gloo profile (real medians) predict each
    held-out size that lies inside a fitted regime within 25% (issue 15's bar). Strict per
    collective, so a profile or a fit that meets 25% turns its case red."""
    from profiles import fit_check, load_profile

    curve = load_profile(path).collective_curve(op, 2, 2, 1)
    assert curve is not None and len(curve.sizes_bytes) == 33
    _, held = fit_check.held_out_inside_regimes(op, 2, curve.sizes_bytes, curve.median_time_s)
    inside = [h for h in held if h.inside]
    assert len(inside) >= 10
    misses = [f"{h.size_bytes} B: {h.error:+.0%}" for h in inside if abs(h.error) > fit_check.HELD_OUT_BAR]
    assert not misses, misses


@pytest.mark.parametrize("op", fit.COLLECTIVE_OPS)
def test_regime_boundaries_of_the_sqrt2_profile_are_bracketed_by_adjacent_sizes(op: str) -> None:
    """Every break of the stored regimes lies between two adjacent measured sizes, one √2 step apart."""
    from profiles import fit_check, load_profile

    curve = load_profile(SQRT2_PROFILE).collective_curve(op, 2, 2, 1)
    assert curve is not None
    for last, first in fit_check.boundaries(curve.segments):
        i = curve.sizes_bytes.index(last)
        assert curve.sizes_bytes[i + 1] == first and first / last <= math.sqrt(2) * 1.1


@pytest.mark.parametrize("break_mib", [1, 3, 12])
def test_a_known_break_on_the_sqrt2_grid_is_located_within_one_grid_step(break_mib: int) -> None:
    """Two Hockney lines (α 200 µs, β 4 GB/s, then α 1 ms, β 1 GB/s) switching at a size that is
    not a grid point, 3% noise: the fitted break lies within one √2 step of the true one, and the
    held-out sizes inside the regimes are predicted within 25%."""
    import numpy as np

    from profiles import fit_check, segments
    from profiles.shapes import sqrt2_steps

    sizes = sqrt2_steps(4096, 256 * 2**20)
    switch = break_mib * 2**20 * 1.2
    rng = np.random.default_rng(break_mib)
    times = [(2e-4 + 0.5 * s / 4e9 if s < switch else 1e-3 + 0.5 * s / 1e9) * float(np.exp(rng.normal(0, 0.03)))
             for s in sizes]
    regimes = segments.fit_segmented("all_gather", 2, sizes, times)
    located = [first for _, first in fit_check.boundaries(regimes)]
    assert any(abs(math.log(first / switch, math.sqrt(2))) <= 1.0 for first in located), located
    _, held = fit_check.held_out_inside_regimes("all_gather", 2, sizes, times)
    assert all(abs(h.error) <= fit_check.HELD_OUT_BAR for h in held if h.inside)
