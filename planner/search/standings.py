"""Each mesh's plans found so far in the exact search (``planner.search.solve``), the cutoff they
set, and the result they make.

A layout that passes every cut is offered with its step time as ``bounds.step_time_s`` sums it (the
step time ``CostModel.estimate`` reports, summed in another order: equal up to rounding); it is
costed in full only if the result needs it. Of the 200-350 layouts the reference searches offer,
the result reads a few dozen: the fastest of each mesh that may be returned (one past both the K-th
fastest mesh and the fastest's band edge on summed times, with margins, cannot be), then the bands
of the meshes it returns (``ranking.ranked_plans``), with the peaks the search costed already.
Every choice the result makes is made on full estimates, over a superset of the layouts it could
read (``SUMMED_SLACK``), so it is the one brute force makes; a plan that only sits in a returned
mesh's band, not its pick, is read for its layout and peak.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from costmodels.bands import Band
from costmodels.breakdown import CostBreakdown
from costmodels.estimate import CostModel
from costmodels.layout import Layout
from costmodels.tie_band import TieBand

from .ranking import MeshBand, ranked_plans

SUMMED_SLACK = 1e-9
"""Relative margin between a summed step time and the estimate's: they add the same terms in another
order, so they differ by a few units in the last place; a layout is costed in full wherever it is
within this margin of a choice the result makes."""
RANK_ROUNDING_S = 2e-12
"""Step times within this of each other may round alike in ``ranking.rank_key`` (to 1e-12 s), where
peak memory then orders them: every offer within it of a mesh's fastest is costed in full."""


def _margin_s(seconds: float) -> float:
    """Twice the most a summed step time of about ``seconds`` and its estimate may differ by, with the
    rounding of ``ranking.rank_key``: a summed time past another by more lies past it on estimates."""
    return 2 * (seconds * SUMMED_SLACK + RANK_ROUNDING_S)


@dataclass(frozen=True, slots=True)
class Offer:
    """A layout that fits, with its summed step time and, where the search costed it already, its estimate."""

    layout: Layout
    step_time_s: float
    breakdown: CostBreakdown | None = None
    peak_memory_bytes: float | None = None
    """``CostModel.peak_memory_bytes`` of the layout where the search costed it (never one derived from a twin)."""


class _Band:
    """One mesh's offers within the tie band (with ``SUMMED_SLACK``) of its fastest summed step time."""

    def __init__(self, band_rel: float) -> None:
        self.limit = (1 + band_rel) * (1 + SUMMED_SLACK)
        self.fastest_s = float("inf")
        self.offers: list[Offer] = []

    def offer(self, offer: Offer) -> bool:
        """Keep ``offer`` if it is within the band; whether it is the mesh's fastest so far."""
        faster = offer.step_time_s < self.fastest_s
        if faster:
            self.fastest_s = offer.step_time_s
            self.offers = [o for o in self.offers if o.step_time_s <= self.fastest_s * self.limit]
        if offer.step_time_s <= self.fastest_s * self.limit:
            self.offers.append(offer)
        return faster


class Standings:
    """Each mesh's band of offers (keyed by ``MeshChoice.degrees``: a mesh's placements and
    dispatchers share one band, as brute force's ``ranking.mesh_of`` does), and the step time a new
    mesh must beat to enter the top K."""

    def __init__(self, cost_model: CostModel, top_k: int, band: TieBand, memory_band: Band | None) -> None:
        self.cost_model = cost_model
        self.top_k = top_k
        self.tie_band = band
        self.memory_band = memory_band
        self.band_rel = band.band_rel
        self.bands: dict[tuple, _Band] = {}
        self._threshold_s = float("inf")

    def __bool__(self) -> bool:
        """Whether any layout fits."""
        return bool(self.bands)

    def offer(self, degrees: tuple, offer: Offer) -> None:
        band = self.bands.get(degrees)
        if band is None:
            band = self.bands[degrees] = _Band(self.band_rel)
        if band.offer(offer) and len(self.bands) >= self.top_k:
            fastest = heapq.nsmallest(self.top_k, (b.fastest_s for b in self.bands.values()))
            self._threshold_s = max(fastest[-1], fastest[0] * (1 + self.band_rel))

    def cutoff_s(self, degrees: tuple, slack: float) -> float:
        """A subtree whose bound exceeds this holds neither a faster plan for a mesh that
        ``ranking.ranked_plans`` returns (a top-K mesh, or one tied with the fastest) nor one within
        the band of such a mesh's fastest: the band above the smaller of the mesh's fastest and the
        threshold (the larger of the K-th fastest mesh's step time, inf while fewer than K meshes
        have a plan, and the band's edge above the fastest of all), widened by ``slack``."""
        band = self.bands.get(degrees)
        mesh_best = band.fastest_s if band is not None else float("inf")
        return (1 + self.band_rel) * min(mesh_best, self._threshold_s) * (1 + slack)

    def whole_cutoff_s(self, degrees: tuple, slack: float) -> float:
        """``cutoff_s`` for a bound that covers every plan of the mesh not yet found (the mesh before its
        visit, or every pair of a visit from this one on): where the mesh has no plan at or below the
        threshold, the threshold itself, widened by ``slack`` and the margins between summed and
        estimated times (``SUMMED_SLACK``, ``RANK_ROUNDING_S``). A mesh none of whose plans reaches
        the threshold is slower on estimates than the K-th fastest mesh and than the fastest's band
        edge, so it is returned neither among the first K nor as tied, and none of its plans is read;
        a bound past the threshold then cuts all it covers, the band above it included. Only for a
        mesh alone in its band: a placement or dispatcher twin (same degrees) may still bring the band
        a plan at or below the threshold, and then its band (``solve``)."""
        band = self.bands.get(degrees)
        if band is not None and band.fastest_s <= self._threshold_s:
            return self.cutoff_s(degrees, slack)
        return min(self.cutoff_s(degrees, slack), self._threshold_s * (1 + slack) + _margin_s(self._threshold_s))

    def result(self) -> tuple[tuple[CostBreakdown, ...], dict[tuple, int]]:
        """``ranking.ranked_plans`` of the meshes' bands, as brute force makes it, costing in full only
        what decides it: every mesh's offers within ``SUMMED_SLACK`` of its fastest (which is its
        fastest, and so which meshes are returned, is decided on estimates), each returned mesh's
        pick, and an offer whose summed time is too close to its band's edge to place it. The rest
        of a returned mesh's band enters it as a ``_Summed`` plan: the pick reads of them only their
        layouts, their peak memory (``CostModel.peak_memory_bytes``, the estimate's own) and whether
        they are inside the band."""
        exact: dict[tuple, MeshBand] = {}
        for degrees in self._contenders():
            band = self.bands[degrees]
            exact[degrees] = MeshBand(self.tie_band, self.memory_band)
            for offer in band.offers:
                if offer.step_time_s <= band.fastest_s * (1 + SUMMED_SLACK) + RANK_ROUNDING_S:
                    exact[degrees].offer(self._costed(offer))
        if not exact:
            return (), {}
        order = sorted(exact, key=lambda degrees: exact[degrees].fastest_key)
        tied_s = exact[order[0]].fastest.step_time_s * (1 + self.band_rel)
        returned = order[:self.top_k] + [d for d in order[self.top_k:] if exact[d].fastest.step_time_s <= tied_s]
        for degrees in returned:
            band, mesh_band = self.bands[degrees], exact[degrees]
            limit_s, usable = mesh_band.limit_s(), mesh_band.fastest.memory_usable_bytes
            for offer in band.offers:
                if offer.step_time_s <= band.fastest_s * (1 + SUMMED_SLACK) + RANK_ROUNDING_S:
                    continue  # costed above
                if abs(offer.step_time_s - limit_s) <= limit_s * SUMMED_SLACK:
                    mesh_band.offer(self._costed(offer))  # too close to the edge to place on its sum
                elif offer.step_time_s <= limit_s:
                    peak = offer.breakdown.peak_memory_bytes if offer.breakdown is not None else \
                        offer.peak_memory_bytes if offer.peak_memory_bytes is not None else \
                        self.cost_model.peak_memory_bytes(offer.layout)
                    mesh_band.plans.append(_Summed(offer.layout, offer.step_time_s, peak, usable))
            pick, _ = mesh_band.simplest()
            if isinstance(pick, _Summed):  # the pick is returned: costed in full
                mesh_band.plans[mesh_band.plans.index(pick)] = self.cost_model.estimate(pick.layout)
        return ranked_plans({d: exact[d] for d in returned}, self.top_k, self.tie_band)

    def _contenders(self) -> list[tuple]:
        """The meshes ``result`` may return, decided on summed step times: a mesh whose fastest, less
        its margin (``SUMMED_SLACK`` and ``RANK_ROUNDING_S``, twice over), is slower than the K-th
        fastest mesh's and than the fastest mesh's band edge, each with its margin added, is slower on
        estimates than K meshes and than the tie band of the fastest, so neither among the first K nor
        tied; its band is never costed."""
        fastest = sorted(band.fastest_s for band in self.bands.values())
        if not fastest:
            return []
        kth_s = fastest[min(self.top_k, len(fastest)) - 1]
        limit_s = max(kth_s + _margin_s(kth_s), (fastest[0] + _margin_s(fastest[0])) * (1 + self.band_rel))
        return [degrees for degrees, band in self.bands.items()
                if band.fastest_s - _margin_s(band.fastest_s) <= limit_s]

    def _costed(self, offer: Offer) -> CostBreakdown:
        return offer.breakdown if offer.breakdown is not None else self.cost_model.estimate(offer.layout)


@dataclass(frozen=True, slots=True)
class _Summed:
    """What ``ranking.MeshBand.simplest`` reads of a plan in a band (``ranking.tie_key``) that is not
    the band's fastest, for a layout not costed in full: its step time as summed (placed inside the
    band on it), its peak and the job's usable memory."""

    layout: Layout
    step_time_s: float
    peak_memory_bytes: float
    memory_usable_bytes: float
