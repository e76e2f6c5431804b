"""How well the collective fits of a profile predict sizes they did not see (prints figures, asserts nothing).

    .venv/bin/python benchmarks/profile_fit.py [profiles/data/cpu-gloo-2proc.json]

For every measured curve: the regimes fitted to all its sizes (what the profile file stores) and
where each break lies; issue 15's check (``profiles.fit_check``: regimes fitted on every other size,
the held-out sizes inside a regime predicted, those on a switch listed apart); the held-out check of issue 3 for one alpha-beta line and for the segmented fit (fit on every other
size, sizes[::2], predict the sizes in between, each error and the worst); and leave-one-out over
the interior sizes for the two in-range lookups, log-space interpolation of the smoothed curve
(what the cost model uses) and the regimes (RMS and worst error); and the time of a 1 GiB call,
beyond the measured sizes, extended with the last regime's β (what the cost model does) and with
the single line's β (what it did before the regimes).
Reads the file only; measures nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from profiles import fit, fit_check, load_profile, segments
from profiles.schema import CollectiveCurve

SHIPPED = Path(__file__).resolve().parent.parent / "profiles" / "data" / "cpu-gloo-2proc.json"


def held_out_errors(curve: CollectiveCurve) -> tuple[list[float], list[float]]:
    """Relative errors at sizes[1::2] of (one line, regimes), both fitted on sizes[::2]."""
    op, n = curve.op, curve.num_ranks
    sizes, times = curve.sizes_bytes, curve.median_time_s
    alpha, beta = fit.fit_alpha_beta(op, n, sizes[::2], times[::2])
    regimes = segments.fit_segmented(op, n, sizes[::2], times[::2])
    line = [(fit.alpha_beta_time_s(op, n, s, alpha, beta) - t) / t for s, t in zip(sizes[1::2], times[1::2])]
    seg = [(segments.segmented_time_s(op, n, regimes, s) - t) / t for s, t in zip(sizes[1::2], times[1::2])]
    return line, seg


def leave_one_out_errors(curve: CollectiveCurve) -> tuple[list[float], list[float]]:
    """Relative errors at each interior size of (interpolation, regimes) fitted without it."""
    op, n = curve.op, curve.num_ranks
    sizes, times = list(curve.sizes_bytes), list(curve.median_time_s)
    interp, seg = [], []
    for i in range(1, len(sizes) - 1):
        s, t = sizes[:i] + sizes[i + 1:], times[:i] + times[i + 1:]
        smoothed = fit.monotone_log_smooth(t)
        interp.append((fit.interpolate_time_s(s, smoothed, sizes[i], 0.0) - times[i]) / times[i])
        regimes = segments.fit_segmented(op, n, s, t)
        seg.append((segments.segmented_time_s(op, n, regimes, sizes[i]) - times[i]) / times[i])
    return interp, seg


def _summary(errors: list[float]) -> str:
    rms = fit.rms_relative_error([1 + e for e in errors], [1.0] * len(errors))
    return f"rms {rms:.0%}, worst {max(map(abs, errors)):.0%}"


def beyond_range_s(curve: CollectiveCurve, size_bytes: float) -> tuple[float, float]:
    """Seconds at ``size_bytes`` past the measured sizes: (last regime's slope, single line's slope)."""
    sizes, smoothed = curve.sizes_bytes, curve.smoothed_time_s
    single = fit.tail_seconds_per_byte(curve.op, curve.num_ranks, sizes, smoothed, curve.bus_bandwidth_bytes_per_s)
    return curve.time_s(size_bytes), fit.interpolate_time_s(sizes, smoothed, size_bytes, single)


def describe(regime: segments.HockneySegment) -> str:
    beta = f"{regime.bus_bandwidth_bytes_per_s / 1e9:.3g} GB/s" if regime.bus_bandwidth_bytes_per_s else "-"
    return (f"{_size(regime.first_size_bytes)}..{_size(regime.last_size_bytes)}: α {regime.latency_s * 1e6:.0f} µs, "
            f"β {beta}, rms {regime.rms_relative_error:.0%}")


def _size(size_bytes: int) -> str:
    return f"{size_bytes / 2**20:.4g} MiB" if size_bytes >= 1 << 20 else f"{size_bytes / 2**10:.4g} KiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("profile", nargs="?", default=str(SHIPPED))
    profile = load_profile(parser.parse_args().profile)
    for curve in profile.collectives:
        where = f"{curve.ranks_per_node}/node x {curve.num_nodes}"
        noise = segments.relative_noise(curve.sizes_bytes, curve.median_time_s)
        print(f"{curve.op}, {curve.num_ranks} ranks {where}: noise σ {noise:.1%}")
        for regime in curve.segments:
            print(f"  regime {describe(regime)}")
        for last, first in fit_check.boundaries(curve.segments):
            print(f"  break between {_size(last)} and {_size(first)}")
        line, seg = held_out_errors(curve)
        print("  held out, one line: " + " ".join(f"{e:+.0%}" for e in line) + f"  worst {max(map(abs, line)):.0%}")
        print("  held out, regimes:  " + " ".join(f"{e:+.0%}" for e in seg) + f"  worst {max(map(abs, seg)):.0%}")
        _, held = fit_check.held_out_inside_regimes(curve.op, curve.num_ranks, curve.sizes_bytes, curve.median_time_s)
        inside = [h for h in held if h.inside]
        if inside:
            worst = max(inside, key=lambda h: abs(h.error))
            print(f"  held out inside regimes ({len(inside)} sizes): worst {worst.error:+.0%} at {_size(worst.size_bytes)}"
                  f"; on a switch: " + " ".join(f"{_size(h.size_bytes)} {h.error:+.0%}" for h in held if not h.inside))
        interp, seg = leave_one_out_errors(curve)
        print(f"  leave one out: interpolation {_summary(interp)}; regimes {_summary(seg)}")
        regimes_s, single_s = beyond_range_s(curve, 2**30)
        print(f"  1 GiB: {regimes_s:.3f} s with the last regime's β, {single_s:.3f} s with the single line's")


if __name__ == "__main__":
    main()
