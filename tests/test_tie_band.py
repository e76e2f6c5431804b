"""The tie band is the model's measured between-layout error (issue #28, part 3): read from a record
with provenance, used by the search, and the pick among tied layouts goes to the least risky."""

import json
import math
import sys
from pathlib import Path

import pytest

from costmodels.bands import shipped_memory_band
from costmodels.layout import Layout
from costmodels.tie_band import (MECHANISMS_IN_USE, TIE_BAND_FILE, TieBand, in_use, num_uncertain,
                                 shipped_tie_band, tie_band_from_record)
from planner.search.ranking import MeshBand, mesh_of, prefer_simplest, tie_key, tie_reason

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))

MEASURED = TieBand(band_rel=0.10, source="test", mechanism_error_rel={
    "tp": 0.04, "pp": 0.06, "cp": None, "ep": None, "zero_stage": None, "recompute": None,
    "micro_batch_size": 0.09, "schedule": 0.35})
"""A band of 10% with tp, pp and micro-batches measured below it, the schedule above it, the rest unmeasured."""


class _Plan:
    """The fields of a CostBreakdown that the ranking reads (cap 100 bytes)."""

    def __init__(self, step_time_s, peak_memory_bytes=1.0, **layout):
        self.step_time_s, self.peak_memory_bytes = step_time_s, peak_memory_bytes
        self.layout, self.memory_capacity_bytes = Layout(**layout), 100.0
        self.memory_usable_bytes = 100.0


def test_the_shipped_band_is_the_record_written_by_the_benchmark_with_its_provenance():
    doc = json.loads(TIE_BAND_FILE.read_text(encoding="utf-8"))
    band = shipped_tie_band()
    assert band.band_rel == doc["band_rel"] and 0 < band.band_rel < 1
    assert doc["provenance"]["command"].endswith("benchmarks/tie_band.py --write")
    assert "costmodels/data/tie_band.json" in band.source and str(doc["num_pairs"]) in band.source
    for name in MECHANISMS_IN_USE:  # unmeasured where fewer than min_pairs single-mechanism pairs
        entry = doc["mechanisms"][name]
        assert (entry["median_rel"] is None) == (entry["num_pairs"] < doc["min_pairs"])


def test_the_record_matches_the_published_runs_and_the_model_as_they_stand():
    # rerun benchmarks/tie_band.py --write when this fails: the model or the data moved
    import tie_band as bench

    doc = json.loads(TIE_BAND_FILE.read_text(encoding="utf-8"))
    fresh = bench.record(bench.fit_rows(bench.DATA))
    assert fresh["num_pairs"] == doc["num_pairs"] and fresh["band_rel"] == pytest.approx(doc["band_rel"], abs=1e-3)
    assert {m: e["num_pairs"] for m, e in fresh["mechanisms"].items()} == \
        {m: e["num_pairs"] for m, e in doc["mechanisms"].items()}
    for runtime, entry in fresh["runtimes"].items():
        assert {m: e["median_rel"] for m, e in entry["mechanisms"].items()} == \
            pytest.approx({m: e["median_rel"] for m, e in doc["runtimes"][runtime]["mechanisms"].items()}, abs=1e-3)


def test_pair_error_is_the_log_error_of_the_predicted_ratio():
    # predicted 2:1, measured 1.6:1 -> |ln(2 / 1.6)| = ln 1.25
    from planner.published.pairs import relative_error

    assert relative_error([math.log(2 / 1.6)]) == pytest.approx(0.25)


def test_a_missing_record_falls_back_to_a_fixed_band_that_says_so(tmp_path):
    shipped_tie_band.cache_clear()
    try:
        band = shipped_tie_band(tmp_path / "none.json")
    finally:
        shipped_tie_band.cache_clear()
    assert band.band_rel == 0.01 and "no measured record" in band.source
    assert all(band.uncertain(m) for m in MECHANISMS_IN_USE)


def test_a_malformed_record_is_refused():
    with pytest.raises(ValueError, match="band_rel"):
        tie_band_from_record({"band_rel": 1.5}, "x.json")


def test_mechanisms_in_use_and_which_are_uncertain():
    layout = Layout(dp=2, tp=2, pp=2, zero_stage=1, micro_batch_size=2, num_microbatches=4, schedule="interleaved",
                    virtual_stages=2, recompute="selective")
    assert in_use(layout) == ("tp", "pp", "zero_stage", "recompute", "micro_batch_size", "schedule")
    # tp, pp and micro-batches measured under the band; ZeRO and recompute unmeasured; schedule above it
    assert num_uncertain(layout, MEASURED) == 3
    assert num_uncertain(Layout(dp=8), MEASURED) == 0


def test_a_tied_layout_that_fits_without_offload_beats_one_that_offloads():
    # Optimizer offload is unmeasured (no published sweep varies it alone), so it is uncertain: the
    # offloading plan, 5% faster and lighter, loses the tie to the one that keeps its optimizer on
    # the GPU while that one fits; a faster offload plan outside the band still wins.
    assert "optimizer_offload" in in_use(Layout(dp=8, zero_stage=1, optimizer_offload=True))
    offload = _Plan(10.0, 40.0, dp=8, zero_stage=1, optimizer_offload=True)
    on_gpu = _Plan(10.5, 70.0, dp=8, zero_stage=1)
    ranked, num_tied, reason = prefer_simplest((offload, on_gpu), MEASURED, memory_band=shipped_memory_band())
    assert ranked[0] is on_gpu and num_tied == 2
    assert reason.startswith("fewest uncertain mechanisms (1 against 2: the runner-up's optimizer_offload)")
    ranked, _, _ = prefer_simplest((offload, _Plan(11.5, 70.0, dp=8, zero_stage=1)), MEASURED, memory_band=shipped_memory_band())
    assert ranked[0] is offload


def test_two_layouts_within_the_measured_band_tie_and_the_less_risky_wins():
    # 10.0 s with ZeRO-1 (unmeasured: uncertain) and 10.8 s with tp 2 (measured 4% < 10%): 8% apart,
    # inside the 10% band, so they tie and the one without an uncertain mechanism wins though slower
    fast = _Plan(10.0, dp=8, zero_stage=1)
    certain = _Plan(10.8, dp=4, tp=2, sequence_parallel=True)
    ranked, num_tied, reason = prefer_simplest((fast, certain), MEASURED, memory_band=shipped_memory_band())
    assert ranked[0] is certain and num_tied == 2
    assert reason.startswith("fewest uncertain mechanisms (0 against 1: the runner-up's zero_stage)")
    assert "no memory risk" in reason
    # outside the band (12% apart) the faster one stands, and with nothing tied there is no reason to give
    ranked, num_tied, reason = prefer_simplest((fast, _Plan(11.2, dp=4, tp=2, sequence_parallel=True)), MEASURED, memory_band=shipped_memory_band())
    assert ranked[0] is fast and num_tied == 1 and reason == ""
    # one plan whose mesh held several tied layouts: the reason says the tie was settled in its mesh
    _, num_tied, reason = prefer_simplest((fast,), MEASURED, memory_band=shipped_memory_band(), tied_in_mesh={mesh_of(fast.layout): 3})
    assert num_tied == 3 and reason.startswith("least risky of the layouts tied in its own mesh")


def test_memory_risk_comes_before_uncertain_mechanisms_inside_a_mesh():
    from costmodels.bands import shipped_memory_band

    high = shipped_memory_band().high_rel
    assert 99 * (1 + high) > 100 > 50 * (1 + high)
    band = MeshBand(MEASURED, shipped_memory_band())
    for plan in (_Plan(10.0, 99.0, dp=8), _Plan(10.5, 50.0, dp=8, zero_stage=3)):
        band.offer(plan)
    pick, classes = band.simplest()
    assert pick.layout.zero_stage == 3 and classes == 2  # uncertain ZeRO-3, but its memory band stays under


def test_the_reason_never_claims_no_memory_risk_when_the_pick_has_it():
    from costmodels.bands import shipped_memory_band

    memory_band = shipped_memory_band()
    risky = [_Plan(10.0, 99.0, dp=8), _Plan(10.2, 99.5, dp=4, tp=2, sequence_parallel=True)]
    reason = tie_reason(risky[0], risky, memory_band, MEASURED)
    assert "no memory risk" not in reason and "crosses the cap" in reason
    assert tie_key(risky[0], memory_band, MEASURED)[0] is True


def test_the_table_headline_takes_the_reason_and_never_says_simplest_without_memory_risk():
    from planner.plan.plan_file import SearchStats
    from planner.plan.render import tie_note

    stats = SearchStats(solver="search", space_size=10, evaluated=5, tie_band=0.1, num_tied=3, tie_band_source="src",
                        tie_reason="simplest layout; its memory band crosses the cap (every tied layout's does)")
    note = tie_note(stats)
    assert note.startswith("3 layouts indistinguishable (within the 10.0% tie band)")
    assert "without memory risk" not in note and "crosses the cap" in note


def test_plan_json_states_the_band_its_source_and_why_the_pick_won():
    import planner

    report = planner.plan(model="llama3-8b", hardware="h100-sxm-80gb", gpus=8, global_batch=64, seq_len=4096)
    search = report.to_dict()["search"]
    band = shipped_tie_band(runtime="megatron")
    assert search["tie_band"] == band.band_rel and search["tie_band_source"] == band.source
    assert search["num_tied"] >= 1 and search["tie_reason"]


def test_explain_prints_how_many_layouts_were_indistinguishable(tmp_path):
    from click.testing import CliRunner

    from planner.cli import main

    out = tmp_path / "plan.json"
    runner = CliRunner()
    made = runner.invoke(main, ["plan", "--model", "llama3-8b", "--hardware", "h100-sxm-80gb", "--gpus", "8",
                                "--global-batch", "64", "--seq-len", "4096", "--out", str(out)])
    assert made.exit_code == 0, made.output
    search = json.loads(out.read_text())["search"]
    result = runner.invoke(main, ["explain", str(out)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert f"{search['num_tied']} layout" in text and "indistinguishable within the" in text
    assert shipped_tie_band(runtime="megatron").source in text and f"picked for {search['tie_reason']}" in text


RECORD = {"band_rel": 0.10, "num_pairs": 40, "num_sweeps": 4, "min_pairs": 5,
          "mechanisms": {"tp": {"median_rel": 0.05}, "pp": {"median_rel": 0.08}, "zero_stage": {"median_rel": 0.09}},
          "runtimes": {"megatron": {"mechanisms": {"tp": {"median_rel": 0.13}, "zero_stage": {"median_rel": 0.12},
                                                   "pp": {"median_rel": None}}}}}
"""A record: pooled tp, pp and ZeRO under the 10% band; on megatron's own pairs tp and ZeRO above it,
pp too few pairs (so the pooled figure)."""


def test_a_mechanism_is_uncertain_per_runtime_where_its_own_pairs_say_so():
    pooled = tie_band_from_record(RECORD, "r.json")
    megatron = tie_band_from_record(RECORD, "r.json", "megatron")
    titan = tie_band_from_record(RECORD, "r.json", "torchtitan")  # no pairs of its own: the pooled figures
    assert not pooled.uncertain("tp") and megatron.uncertain("tp") and not titan.uncertain("tp")
    assert megatron.mechanism_error_rel["pp"] == 0.08 and not megatron.uncertain("pp")
    assert megatron.uncertain("cp") and pooled.uncertain("cp")  # unmeasured anywhere
    assert "megatron's own pairs" in megatron.source and "own pairs" not in titan.source


def test_the_zero_stage_is_in_use_where_it_departs_from_the_runtimes_standard():
    # Megatron's recipes run the distributed optimizer (ZeRO-1); torchtitan's FSDP (ZeRO-3); the
    # torch job has no standard (0)
    megatron = tie_band_from_record(RECORD, "r.json", "megatron")
    titan = tie_band_from_record(RECORD, "r.json", "torchtitan")
    torch_job = tie_band_from_record(RECORD, "r.json", "torch")
    assert (megatron.standard_zero_stage, titan.standard_zero_stage, torch_job.standard_zero_stage) == (1, 3, 0)
    assert "zero_stage" not in megatron.in_use(Layout(dp=8, zero_stage=1))
    assert "zero_stage" in megatron.in_use(Layout(dp=8, zero_stage=0))
    assert "zero_stage" in torch_job.in_use(Layout(dp=8, zero_stage=1))
    assert "zero_stage" not in titan.in_use(Layout(dp=8, zero_stage=3))
    # ZeRO-0 on megatron is a departure whose error (12% on its own pairs) is above the band
    assert num_uncertain(Layout(dp=8, zero_stage=0), megatron) == 1
    assert num_uncertain(Layout(dp=8, zero_stage=1), megatron) == 0


def test_a_tie_between_plain_ddp_and_the_distributed_optimizer_goes_to_megatrons_standard():
    # two tied Megatron plans, the distributed optimizer's 2% slower: by ZeRO stage alone plain DDP
    # is simpler, but on megatron the distributed optimizer is the standard, and not running it is
    # the uncertain departure
    megatron = tie_band_from_record(RECORD, "r.json", "megatron")
    ddp = _Plan(10.0, 60.0, dp=8, zero_stage=0)
    distopt = _Plan(10.2, 40.0, dp=8, zero_stage=1)
    ranked, _, reason = prefer_simplest((ddp, distopt), megatron, memory_band=shipped_memory_band())
    assert ranked[0] is distopt and "the runner-up's zero_stage" in reason
    torch_job = tie_band_from_record(RECORD, "r.json", "torch")
    ranked, _, _ = prefer_simplest((ddp, distopt), torch_job, memory_band=shipped_memory_band())
    assert ranked[0] is ddp


def test_pairs_count_under_a_mechanism_they_differ_in_alone_or_both_run():
    from planner.published.pairs import LayoutPair, by_mechanism_in_use

    def pair(runtime, differs, held, error):
        return LayoutPair(family="f", sweep=("s",), rows=(("a",), ("b",)), differs_in=differs, runtime=runtime,
                          held=held, log_error=error)

    pairs = [pair("megatron", ("tp",), ("pp",), 0.1), pair("megatron", ("tp", "pp"), (), 0.2),
             pair("megatron", ("micro_batch_size",), ("tp", "pp"), 0.3), pair("torch", ("tp",), (), 0.4)]
    mine = by_mechanism_in_use(pairs, "megatron")
    assert mine["tp"] == (1, 1, [0.1, 0.3]) and mine["pp"] == (0, 2, [0.1, 0.3])
    assert by_mechanism_in_use(pairs)["tp"] == (2, 1, [0.1, 0.3, 0.4])


def test_the_readme_default_runs_the_distributed_optimizer():
    """Issue #37 item 6: Llama-3-70B on 64 H100 under megatron. The distributed optimizer is
    megatron's standard ZeRO stage, so the tie no longer counts it against a plan (plain DDP is the
    departure, uncertain where megatron's own pairs put it above the band); and Megatron-Core's
    published recipe (Megatron-Bridge's llama3_70b_pretrain_config), faster by the model than the
    tie's pick, makes the pick at least as fast as it."""
    import planner

    report = planner.plan(model="llama3-70b", hardware="h100-sxm-80gb", gpus=64, global_batch=512, seq_len=8192)
    band = shipped_tie_band(runtime="megatron")
    assert band.standard_zero_stage == 1
    assert report.best.layout.zero_stage == 1
    recipe = report.search["recipe"]
    assert recipe.startswith("recipe llama3_70b_pretrain_config") and "picked" in recipe
