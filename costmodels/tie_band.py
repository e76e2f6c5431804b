"""The tie band: how close two layouts' predicted step times may be before the model cannot tell
them apart, measured, not chosen.

``benchmarks/tie_band.py --write`` scores every pair of measured layouts inside one published sweep
(``planner.published.pairs``): the error of the model's predicted step-time ratio against the
measured ratio. The band is the median of those errors: for half of the measured pairs the model's
ratio misses by more, so two layouts whose predicted step times are closer than this are ordered
wrongly often (a symmetric error as large as the gap reverses the order about a quarter of the
time). Per mechanism (tp, pp, cp, ...), the median over pairs that differ in that mechanism alone;
a mechanism with fewer than the record's ``min_pairs`` such pairs is unmeasured.

Among tied layouts the pick goes to the least risky (``planner.search.ranking.tie_key``): memory
band under the cap, then the fewest *uncertain* mechanisms in use (error larger than the band, or
unmeasured; ``num_uncertain``), then the simplest. Pure: the record is read when the band is first
asked for, never at import.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from .layout import Layout

TIE_BAND_FILE = Path(__file__).parent / "data" / "tie_band.json"
"""Record written by ``benchmarks/tie_band.py --write``."""
FALLBACK_BAND_REL = 0.01
"""Band used when no record is found (a chosen figure, said so in ``source``)."""
MECHANISMS_IN_USE = ("tp", "pp", "cp", "ep", "zero_stage", "recompute", "micro_batch_size", "schedule",
                     "optimizer_offload")
"""The mechanisms ``in_use`` looks for (``planner.published.pairs.MECHANISMS``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TieBand:
    """The relative step-time band within which layouts tie, and which mechanisms are uncertain."""

    band_rel: float
    """Layouts whose step time is within ``fastest × (1 + band_rel)`` tie (a fraction, ≥ 0)."""
    source: str
    """Where the figure comes from, in one phrase (record path, statistic, counts)."""
    mechanism_error_rel: dict[str, float | None]
    """Median between-layout error per mechanism (``MECHANISMS_IN_USE``); None: unmeasured."""

    def uncertain(self, mechanism: str) -> bool:
        """Unmeasured, or its between-layout error is larger than the band."""
        error = self.mechanism_error_rel.get(mechanism)
        return error is None or error > self.band_rel

    def to_dict(self) -> dict[str, Any]:
        return {"band_rel": self.band_rel, "source": self.source,
                "uncertain_mechanisms": [m for m in MECHANISMS_IN_USE if self.uncertain(m)]}


def in_use(layout: Layout) -> tuple[str, ...]:
    """The mechanisms a layout uses beyond plain data parallelism: a degree above 1, a ZeRO stage,
    recomputation, micro-batches above 1, a schedule other than 1F1B / GPipe (which differ in memory
    only, and share their step time), optimizer offload (no published sweep measures it alone, so it
    is unmeasured: a tied layout that fits without it is picked before one that offloads)."""
    used = {"tp": layout.tp > 1, "pp": layout.pp > 1, "cp": layout.cp > 1, "ep": layout.ep > 1,
            "zero_stage": layout.zero_stage > 0, "recompute": layout.recompute != "none",
            "micro_batch_size": layout.micro_batch_size > 1,
            "schedule": layout.schedule not in ("1f1b", "gpipe"),
            "optimizer_offload": layout.optimizer_offload}
    return tuple(m for m in MECHANISMS_IN_USE if used[m])


def num_uncertain(layout: Layout, band: TieBand) -> int:
    """How many of the mechanisms the layout uses have a large or unmeasured between-layout error."""
    return sum(band.uncertain(m) for m in in_use(layout))


def tie_band_from_record(doc: dict[str, Any], record: str) -> TieBand:
    """The band of a ``benchmarks/tie_band.py`` record (raises ``ValueError`` on a malformed one)."""
    band = doc.get("band_rel")
    if not isinstance(band, (int, float)) or isinstance(band, bool) or not 0 <= band < 1:
        raise ValueError(f"{record}: band_rel must be a fraction in [0, 1), got {band!r}")
    mechanisms = doc.get("mechanisms") or {}
    errors = {m: _error(mechanisms.get(m)) for m in MECHANISMS_IN_USE}
    pairs = doc.get("num_pairs")
    sweeps = doc.get("num_sweeps")
    return TieBand(band_rel=float(band), mechanism_error_rel=errors,
                   source=f"median between-layout error of {pairs} measured pairs in {sweeps} sweeps ({record})")


@lru_cache(maxsize=4)
def shipped_tie_band(path: Path = TIE_BAND_FILE) -> TieBand:
    """The shipped band (read once), or ``FALLBACK_BAND_REL`` with every mechanism unmeasured when
    the record is missing."""
    record = str(path.relative_to(Path(__file__).parents[1])) if path.is_relative_to(Path(__file__).parents[1]) \
        else str(path)
    if not path.is_file():
        return TieBand(band_rel=FALLBACK_BAND_REL, mechanism_error_rel={m: None for m in MECHANISMS_IN_USE},
                       source=f"fixed {FALLBACK_BAND_REL:.0%}: no measured record ({record} missing)")
    return tie_band_from_record(json.loads(path.read_text(encoding="utf-8")), record)


def _error(entry: Any) -> float | None:
    value = entry.get("median_rel") if isinstance(entry, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
