"""The tie band: how close two layouts' predicted step times may be before the model cannot tell
them apart, measured, not chosen.

``benchmarks/tie_band.py --write`` scores every pair of measured layouts inside one published sweep
(``planner.published.pairs``): the error of the model's predicted step-time ratio against the
measured ratio. The band is the median of those errors: for half of the measured pairs the model's
ratio misses by more, so two layouts whose predicted step times are closer than this are ordered
wrongly often (a symmetric error as large as the gap reverses the order about a quarter of the
time).

Per runtime and mechanism (tp, pp, cp, ...), the median over that runtime's pairs that differ in the
mechanism alone or both run it at one setting (``planner.published.pairs.by_mechanism_in_use``): the
model's word between layouts of that runtime where the mechanism is what moves or what they share.
A runtime with fewer than the record's ``min_pairs`` such pairs takes the figure over every
runtime's pairs, and with fewer than that too the mechanism is unmeasured. A mechanism is in use
where a layout departs from plain data parallelism and from its runtime's standard ZeRO stage
(``costmodels.capabilities.RuntimeCapabilities.standard_zero_stage``: Megatron's distributed
optimizer is its recipes' default, so not running it is the departure).

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

from .capabilities import CAPABILITIES
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
    """Median between-layout error per mechanism (``MECHANISMS_IN_USE``) on ``runtime``'s pairs, or
    over every runtime's where it has too few; None: unmeasured."""
    runtime: str = ""
    """The runtime the mechanism figures are for; empty: every runtime's pairs."""
    standard_zero_stage: int = 0
    """``runtime``'s standard ZeRO stage: a layout uses ``zero_stage`` where it departs from it."""

    def uncertain(self, mechanism: str) -> bool:
        """Unmeasured, or its between-layout error is larger than the band."""
        error = self.mechanism_error_rel.get(mechanism)
        return error is None or error > self.band_rel

    def in_use(self, layout: Layout) -> tuple[str, ...]:
        """``in_use`` on this band's runtime."""
        return in_use(layout, self.standard_zero_stage)

    def to_dict(self) -> dict[str, Any]:
        return {"band_rel": self.band_rel, "source": self.source,
                "uncertain_mechanisms": [m for m in MECHANISMS_IN_USE if self.uncertain(m)]}


def in_use(layout: Layout, standard_zero_stage: int = 0) -> tuple[str, ...]:
    """The mechanisms a layout uses beyond plain data parallelism: a degree above 1, a ZeRO stage
    other than its runtime's standard one (``standard_zero_stage``; 0 where the runtime has none),
    recomputation, micro-batches above 1, a schedule other than 1F1B / GPipe (which differ in memory
    only, and share their step time), optimizer offload (no published sweep measures it alone, so it
    is unmeasured: a tied layout that fits without it is picked before one that offloads)."""
    used = {"tp": layout.tp > 1, "pp": layout.pp > 1, "cp": layout.cp > 1, "ep": layout.ep > 1,
            "zero_stage": layout.zero_stage != standard_zero_stage, "recompute": layout.recompute != "none",
            "micro_batch_size": layout.micro_batch_size > 1,
            "schedule": layout.schedule not in ("1f1b", "gpipe"),
            "optimizer_offload": layout.optimizer_offload}
    return tuple(m for m in MECHANISMS_IN_USE if used[m])


def num_uncertain(layout: Layout, band: TieBand) -> int:
    """How many of the mechanisms the layout uses on ``band``'s runtime have a large or unmeasured
    between-layout error there."""
    return sum(band.uncertain(m) for m in band.in_use(layout))


def tie_band_from_record(doc: dict[str, Any], record: str, runtime: str = "") -> TieBand:
    """The band of a ``benchmarks/tie_band.py`` record for ``runtime`` (its own mechanism figures
    where the record has them, else the pooled ones; empty: the pooled ones); raises ``ValueError``
    on a malformed record."""
    band = doc.get("band_rel")
    if not isinstance(band, (int, float)) or isinstance(band, bool) or not 0 <= band < 1:
        raise ValueError(f"{record}: band_rel must be a fraction in [0, 1), got {band!r}")
    pooled = doc.get("mechanisms") or {}
    own = ((doc.get("runtimes") or {}).get(runtime) or {}).get("mechanisms") or {}
    errors = {m: _error(own.get(m)) if _error(own.get(m)) is not None else _error(pooled.get(m))
              for m in MECHANISMS_IN_USE}
    pairs = doc.get("num_pairs")
    sweeps = doc.get("num_sweeps")
    where = f"; mechanisms measured on {runtime}'s own pairs where it has {doc.get('min_pairs')} or more" if own else ""
    return TieBand(band_rel=float(band), mechanism_error_rel=errors, runtime=runtime,
                   standard_zero_stage=standard_zero_stage(runtime),
                   source=f"median between-layout error of {pairs} measured pairs in {sweeps} sweeps ({record}){where}")


@lru_cache(maxsize=16)
def shipped_tie_band(path: Path = TIE_BAND_FILE, runtime: str = "") -> TieBand:
    """The shipped band for ``runtime`` (read once per runtime), or ``FALLBACK_BAND_REL`` with every
    mechanism unmeasured when the record is missing."""
    record = str(path.relative_to(Path(__file__).parents[1])) if path.is_relative_to(Path(__file__).parents[1]) \
        else str(path)
    if not path.is_file():
        return TieBand(band_rel=FALLBACK_BAND_REL, mechanism_error_rel={m: None for m in MECHANISMS_IN_USE},
                       runtime=runtime, standard_zero_stage=standard_zero_stage(runtime),
                       source=f"fixed {FALLBACK_BAND_REL:.0%}: no measured record ({record} missing)")
    return tie_band_from_record(json.loads(path.read_text(encoding="utf-8")), record, runtime)


def standard_zero_stage(runtime: str) -> int:
    """The ZeRO stage ``runtime``'s published recipes run (``RuntimeCapabilities.standard_zero_stage``;
    0 for a name without a capability table)."""
    return CAPABILITIES[runtime].standard_zero_stage if runtime in CAPABILITIES else 0


def _error(entry: Any) -> float | None:
    value = entry.get("median_rel") if isinstance(entry, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
