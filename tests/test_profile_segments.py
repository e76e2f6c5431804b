"""The segmented (multi-regime) alpha-beta fit: known regimes recovered, DP equals brute force,
predictions monotone in size, and what the profile and the cost model do with the regimes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from profiles import fit, segments
from profiles.build import fit_collective
from profiles.segments import HockneySegment

SIZES = tuple(4096 * 2**i for i in range(17))  # 4 KiB .. 256 MiB, the full CPU profile's sizes
MIB = 2**20
OP, N = "all_gather", 2  # bus factor (n-1)/n = 1/2


def two_regimes(size: float) -> float:
    """α 200 µs, β 4 GB/s up to 16 MiB; from 32 MiB α 1 ms, β 1 GB/s (a cache-overflow shape)."""
    if size <= 16 * MIB:
        return 2e-4 + 0.5 * size / 4e9
    return 1e-3 + 0.5 * size / 1e9


def one_regime(size: float) -> float:
    return 2e-4 + 0.5 * size / 4e9


def noisy(law, noise: float, seed: int) -> list[float]:
    """The law's times times lognormal noise of relative size ``noise`` (seeded, reproducible)."""
    rng = np.random.default_rng(seed)
    return [law(s) * float(np.exp(rng.normal(0.0, noise))) for s in SIZES]


def test_noise_free_two_regime_curve_recovers_break_alpha_and_beta() -> None:
    regimes = segments.fit_segmented(OP, N, SIZES, [two_regimes(s) for s in SIZES])
    assert [(r.first_size_bytes, r.last_size_bytes) for r in regimes] == [(4096, 16 * MIB), (32 * MIB, 256 * MIB)]
    assert regimes[0].latency_s == pytest.approx(2e-4, rel=1e-6)
    assert regimes[0].bus_bandwidth_bytes_per_s == pytest.approx(4e9, rel=1e-6)
    assert regimes[1].latency_s == pytest.approx(1e-3, rel=1e-6)
    assert regimes[1].bus_bandwidth_bytes_per_s == pytest.approx(1e9, rel=1e-6)


def test_noisy_two_regime_curve_finds_the_break_and_the_slow_bandwidth() -> None:
    """5% noise, 40 seeded draws: the break between 16 and 32 MiB is found in at least 36 (measured:
    40 of 40, and 200 of 200 seeds), and the last regime's β is within 10% of 1 GB/s in every draw
    (measured 0.94-1.08 GB/s)."""
    found = 0
    for seed in range(40):
        regimes = segments.fit_segmented(OP, N, SIZES, noisy(two_regimes, 0.05, seed))
        found += any(r.last_size_bytes == 16 * MIB for r in regimes) and regimes[-1].first_size_bytes == 32 * MIB
        assert regimes[-1].bus_bandwidth_bytes_per_s == pytest.approx(1e9, rel=0.10)
    assert found >= 36


def test_single_line_gives_one_segment() -> None:
    regimes = segments.fit_segmented(OP, N, SIZES, [one_regime(s) for s in SIZES])
    assert len(regimes) == 1
    assert regimes[0].latency_s == pytest.approx(2e-4, rel=1e-6)
    assert regimes[0].bus_bandwidth_bytes_per_s == pytest.approx(4e9, rel=1e-6)


def test_noisy_single_line_mostly_gives_one_segment() -> None:
    """Schwarz's criterion with σ estimated from 17 points splits a pure line now and then.
    Measured with 5% noise: 30 of these 40 draws (160 of 200 seeds) give one segment; with the true
    σ plugged in, 189 of 200, so most false splits come from the estimate of σ. A false split
    follows the noise: the median draw stays within 2.8% of the true line at every size, the worst
    (a 3-point regime at 4-16 KiB with a steep slope, carried on by the running maximum) 31%."""
    single, worst = 0, []
    for seed in range(40):
        regimes = segments.fit_segmented(OP, N, SIZES, noisy(one_regime, 0.05, seed))
        single += len(regimes) == 1
        worst.append(max(abs(segments.segmented_time_s(OP, N, regimes, s) / one_regime(s) - 1) for s in SIZES))
    assert single >= 28
    assert float(np.median(worst)) < 0.05


@settings(max_examples=40, deadline=None)
@given(times=st.lists(st.floats(1e-5, 1e-1), min_size=6, max_size=10), op=st.sampled_from(fit.COLLECTIVE_OPS))
def test_dynamic_programme_equals_brute_force(times: list[float], op: str) -> None:
    sizes = SIZES[: len(times)]
    assert segments.fit_segmented(op, 2, sizes, times) == segments.fit_segmented_brute_force(op, 2, sizes, times)


@settings(max_examples=100, deadline=None)
@given(noise=st.lists(st.floats(-0.5, 0.5), min_size=len(SIZES), max_size=len(SIZES)),
       queries=st.lists(st.floats(1.0, 1e10), min_size=2, max_size=30),
       op=st.sampled_from(fit.COLLECTIVE_OPS))
def test_regime_predictions_never_get_faster_for_bigger_messages(noise: list[float], queries: list[float],
                                                                  op: str) -> None:
    """Even when a later regime is faster (a protocol switch) or the medians are noisy, the
    prediction is nondecreasing in size: inside regimes, between them and beyond both ends."""
    times = [two_regimes(s) * math.exp(e) for s, e in zip(SIZES, noise)]
    regimes = segments.fit_segmented(op, 2, SIZES, times)
    predicted = [segments.segmented_time_s(op, 2, regimes, q) for q in sorted(queries)]
    assert all(a <= b * (1 + 1e-12) for a, b in zip(predicted, predicted[1:]))


def _regime(first: int, last: int, latency_s: float, bandwidth: float) -> HockneySegment:
    return HockneySegment(first_size_bytes=first, last_size_bytes=last, latency_s=latency_s,
                          bus_bandwidth_bytes_per_s=bandwidth, rms_relative_error=0.0)


def test_between_regimes_the_slower_line_and_after_a_faster_switch_the_running_maximum() -> None:
    # send_recv (factor 1). Slow regime up to 1 MB: 1 ms + S/1 GB/s. From 4 MB a faster one: S/2 GB/s.
    slow, fast = _regime(1000, 10**6, 1e-3, 1e9), _regime(4 * 10**6, 10**8, 0.0, 2e9)
    regimes = (slow, fast)
    at = lambda s: segments.segmented_time_s("send_recv", 2, regimes, s)  # noqa: E731
    assert at(10**6) == pytest.approx(2e-3)                       # inside the first regime: its line
    assert at(2 * 10**6) == pytest.approx(max(3e-3, 1e-3))        # between: the slower of the two lines
    # At 4 MB the fast line says 2 ms, but 4 MB cannot beat the slow line's 5 ms just below it.
    assert at(4 * 10**6) == pytest.approx(5e-3)
    assert at(2 * 10**7) == pytest.approx(1e-2)                   # far enough on, the fast line again
    assert at(10**9) == pytest.approx(0.5)                        # beyond the last regime: its line
    assert at(10) == pytest.approx(1e-3 + 10 / 1e9)               # below the first regime: its line


def test_a_slower_regime_after_the_cache_sets_the_tail_of_the_profile_curve() -> None:
    """Beyond the largest measured size the cost model extends the measured curve with the last
    regime's β (1 GB/s here), not the single line's, which averages in the faster sizes."""
    sizes = SIZES[:-1]  # up to 128 MiB
    curve = fit_collective(op=OP, num_ranks=N, ranks_per_node=N, num_nodes=1, dtype="fp32", sizes_bytes=sizes,
                           median_time_s=tuple(two_regimes(s) for s in sizes))
    assert curve.bus_bandwidth_bytes_per_s > 1.2e9               # the single line is too fast
    extra = 1024 * MIB
    expected = two_regimes(sizes[-1]) + 0.5 * extra / 1e9
    assert curve.time_s(sizes[-1] + extra) == pytest.approx(expected, rel=1e-6)
    assert curve.regime_time_s(sizes[-1] + extra) == pytest.approx(two_regimes(sizes[-1] + extra), rel=1e-6)


@pytest.mark.parametrize(("sizes", "times", "needle"), [
    ((4096, 2048, 8192), (1e-4, 2e-4, 3e-4), "strictly increasing"),
    ((4096, 8192), (1e-4,), "as many times as sizes"),
    ((), (), "at least one point"),
])
def test_bad_curves_are_refused_with_the_reason(sizes, times, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        segments.fit_segmented("all_reduce", 2, sizes, times)


def test_too_few_sizes_to_split_give_one_regime() -> None:
    regimes = segments.fit_segmented(OP, N, SIZES[:5], [two_regimes(s) for s in SIZES[:5]])
    assert len(regimes) == 1 and regimes[0].last_size_bytes == SIZES[4]
