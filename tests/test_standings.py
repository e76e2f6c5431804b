"""``planner.search.standings``: offers made on summed step times give the result that full estimates
give (``ranking.ranked_plans`` over ``MeshBand``s, as brute force builds it), while costing in full
only what decides it."""

from __future__ import annotations

import functools
import random

import pytest

from costmodels.bands import shipped_memory_band
from costmodels.bounds import step_time_s
from costmodels.breakdown import CostBreakdown
from costmodels.estimate import CostModel
from costmodels.job import Job
from costmodels.presets import load_model
from costmodels.runtimes import CONVENTIONS
from costmodels.training import TrainingSpec
from hardware_specs import load_node, make_cluster
from planner.search.ranking import MeshBand, mesh_of, ranked_plans, tie_band
from planner.search.space import SearchOptions, all_layouts
from planner.search.standings import SUMMED_SLACK, Offer, Standings

pytestmark = pytest.mark.xdist_group("test_standings")
"""One worker: its tests share the estimates of ``_fitting_of``."""


class _Counting(CostModel):
    """A cost model that counts its full estimates."""

    estimates = 0

    def estimate(self, layout):
        _Counting.estimates += 1
        return super().estimate(layout)


def _job(model: str, gpus: int, runtime: str) -> _Counting:
    training = TrainingSpec(global_batch_size=16, seq_len=512, precision="bf16", runtime=runtime)
    return _Counting(Job(model=load_model(model), training=training, cluster=make_cluster(load_node("h100-sxm-80gb"), gpus),
                         memory_fraction=0.5, convention=CONVENTIONS[runtime]))


def _fitting(cm: CostModel) -> list[CostBreakdown]:
    return list(_fitting_of(cm.model.name, cm.cluster.num_gpus, cm.training.runtime))


@functools.lru_cache(maxsize=None)
def _fitting_of(model: str, gpus: int, runtime: str) -> tuple[CostBreakdown, ...]:
    """Every fitting layout's estimate for ``_job(model, gpus, runtime)``, costed once per session."""
    cm = CostModel(_job(model, gpus, runtime).job)
    layouts = all_layouts(cm.model, cm.training, cm.cluster.num_gpus, cm.cluster.gpus_per_node, SearchOptions())
    return tuple(b for b in map(cm.estimate, layouts) if b.fits)


@pytest.mark.parametrize(("model", "gpus", "runtime", "top_k"), [
    ("tiny-llama", 8, "megatron", 3), ("tiny-mixtral", 8, "megatron", 4), ("tiny-gpt", 4, "torch", 2),
    ("llama2-7b", 8, "megatron", 5)])
def test_summed_offers_give_the_full_estimates_result(model, gpus, runtime, top_k):
    """Every fitting layout offered on its summed step time (moved by up to ``jitter`` x the slack, as
    another summing order would move it) gives the ranked plans and tied counts that the same
    layouts' full estimates give through ``MeshBand`` and ``ranked_plans``; the plans returned are
    full estimates, and far fewer layouts are costed in full than offered."""
    cm = _job(model, gpus, runtime)
    band, memory_band = tie_band(runtime), shipped_memory_band(runtime)
    full = _fitting(cm)
    bands: dict[tuple, MeshBand] = {}
    for b in full:
        bands.setdefault(mesh_of(b.layout), MeshBand(band, memory_band)).offer(b)
    want, want_tied = ranked_plans(bands, top_k, band)

    rng = random.Random(7)
    summed = [step_time_s(cm, b.layout) for b in full]
    for jitter in (0.0, 0.3):
        standings = Standings(cm, top_k, band, memory_band)
        for b, seconds in zip(full, summed):
            seconds *= 1 + jitter * SUMMED_SLACK * rng.uniform(-1, 1)
            standings.offer(mesh_of(b.layout), Offer(layout=b.layout, step_time_s=seconds))
        _Counting.estimates = 0
        got, got_tied = standings.result()
        assert [p.layout for p in got] == [p.layout for p in want], jitter
        assert [p.step_time_s for p in got] == [p.step_time_s for p in want], jitter
        assert got_tied == want_tied, jitter
        assert all(isinstance(p, CostBreakdown) for p in got)
        assert 0 < _Counting.estimates < len(full)


def test_an_offer_at_its_bands_edge_is_placed_by_its_estimate():
    """An offer whose summed time lies within the slack of its band's edge is costed in full, so
    whether it is tied is decided on its estimate, as brute force decides it."""
    cm = _job("tiny-llama", 8, "megatron")
    band, memory_band = tie_band("megatron"), shipped_memory_band("megatron")
    full = sorted(_fitting(cm), key=lambda b: b.step_time_s)
    fastest = full[0]
    mesh = [b for b in full if mesh_of(b.layout) == mesh_of(fastest.layout)]
    assert len(mesh) > 1
    other = mesh[1]
    edge_s = fastest.step_time_s * (1 + band.band_rel)
    standings = Standings(cm, 1, band, memory_band)
    standings.offer(mesh_of(fastest.layout), Offer(layout=fastest.layout, step_time_s=fastest.step_time_s))
    # summed just inside the edge, while the estimate (other's own time) decides
    standings.offer(mesh_of(other.layout), Offer(layout=other.layout, step_time_s=edge_s * (1 - SUMMED_SLACK / 2)))
    _Counting.estimates = 0
    got, got_tied = standings.result()
    assert _Counting.estimates == 2  # the fastest, and the offer at the edge
    exact = MeshBand(band, memory_band)
    exact.offer(fastest)
    exact.offer(other)
    want, want_tied = ranked_plans({mesh_of(fastest.layout): exact}, 1, band)
    assert [p.layout for p in got] == [p.layout for p in want] and got_tied == want_tied


class _Recording(_Counting):
    """A counting cost model that records the meshes it costs in full and counts the peaks it costs."""

    meshes: set = set()
    peaks = 0

    def estimate(self, layout):
        _Recording.meshes.add(mesh_of(layout))
        return super().estimate(layout)

    def peak_memory_bytes(self, layout):
        _Recording.peaks += 1
        return super().peak_memory_bytes(layout)


def _recording(model: str, gpus: int, runtime: str) -> _Recording:
    cm = _job(model, gpus, runtime)
    return _Recording(Job(model=cm.model, training=cm.training, cluster=cm.cluster, memory_fraction=0.5,
                          convention=CONVENTIONS[runtime]))


def test_meshes_that_cannot_be_returned_are_never_costed():
    """A mesh whose fastest summed time (less its margin) is past both the K-th fastest mesh's and the
    fastest's band edge is neither among the first K nor tied, and none of its offers is costed in full."""
    cm = _recording("llama2-7b", 8, "megatron")
    band, memory_band = tie_band("megatron"), shipped_memory_band("megatron")
    full = _fitting(cm)
    standings = Standings(cm, 2, band, memory_band)
    for b in full:
        standings.offer(mesh_of(b.layout), Offer(layout=b.layout, step_time_s=step_time_s(cm, b.layout)))
    _Recording.meshes = set()
    got, _ = standings.result()
    returned = {mesh_of(p.layout) for p in got}
    offered = {mesh_of(b.layout) for b in full}
    assert _Recording.meshes <= returned and _Recording.meshes
    assert len(offered) > len(returned)  # some meshes with offers were passed over


def test_a_peak_the_search_costed_is_not_costed_again():
    """An offer that carries its peak (``Offer.peak_memory_bytes``, the search's own costing) is placed in
    its band with it; without it, the result costs the peak."""
    cm = _recording("llama2-7b", 8, "megatron")
    band, memory_band = tie_band("megatron"), shipped_memory_band("megatron")
    full = _fitting(cm)
    results, peaks = [], []
    for carried in (False, True):
        standings = Standings(cm, 3, band, memory_band)
        for b in full:
            standings.offer(mesh_of(b.layout), Offer(layout=b.layout, step_time_s=step_time_s(cm, b.layout),
                                                     peak_memory_bytes=b.peak_memory_bytes if carried else None))
        _Recording.peaks = 0
        results.append(standings.result())
        peaks.append(_Recording.peaks)
    assert results[0] == results[1]
    assert peaks[0] > 0 and peaks[1] < peaks[0]


def test_a_mesh_without_a_plan_at_the_threshold_is_cut_at_the_threshold_not_the_band_above_it():
    """``whole_cutoff_s``: a mesh with no plan yet, or only plans past the threshold (the larger of the
    K-th fastest mesh's time and the fastest's band edge), can be returned only through a plan at or
    below the threshold, so a bound over all its remaining plans is cut there; a mesh with a plan at or
    below it keeps its band (``cutoff_s``)."""
    cm = _job("tiny-llama", 8, "megatron")
    band, memory_band = tie_band("megatron"), shipped_memory_band("megatron")
    layout = _fitting(cm)[0].layout
    standings = Standings(cm, 2, band, memory_band)
    assert standings.whole_cutoff_s((9,), 0.0) == standings.cutoff_s((9,), 0.0) == float("inf")
    standings.offer((1,), Offer(layout=layout, step_time_s=1.0))
    standings.offer((2,), Offer(layout=layout, step_time_s=1.05))
    threshold = max(1.05, 1.0 * (1 + band.band_rel))
    standings.offer((3,), Offer(layout=layout, step_time_s=threshold * 1.05))  # past the threshold
    for degrees, mesh_best in (((1,), 1.0), ((2,), 1.05)):
        assert standings.whole_cutoff_s(degrees, 0.0) == standings.cutoff_s(degrees, 0.0) == \
            pytest.approx((1 + band.band_rel) * mesh_best)
    for degrees in ((3,), (9,)):  # a plan past the threshold only, or none
        assert standings.cutoff_s(degrees, 0.0) == pytest.approx((1 + band.band_rel) * threshold)
        assert standings.whole_cutoff_s(degrees, 0.0) == pytest.approx(threshold, rel=1e-8)
