"""Ties inside the band go to the simplest layout, deterministically, in both solvers (issue #17)."""

import pytest

from planner.runtime.convention import CONVENTIONS

import planner
from costmodels.estimate import CostModel
from costmodels.job import Job
from planner.brute_force import solve_brute_force
from planner.ranking import TIE_BAND, prefer_simplest, simplicity_key
from planner.search import solve
from planner.space import SearchOptions
from test_search import _case


def test_llama3_8b_on_8_h100_picks_plain_data_parallel_over_cp_at_the_same_time():
    report = planner.plan(model="llama3-8b", hardware="h100-sxm-80gb", gpus=8, global_batch=64, seq_len=4096)
    best = report.best.layout
    assert (best.dp, best.cp, best.ep, best.optimizer_offload) == (8, 1, 1, False)
    assert report.search["num_tied"] >= 2
    fastest = min([report.best, *report.candidates], key=lambda b: b.step_time_s)
    assert report.best.step_time_s <= fastest.step_time_s * (1 + TIE_BAND)


def test_the_tie_is_said_in_the_table():
    from click.testing import CliRunner

    from planner.cli import main

    result = CliRunner().invoke(main, ["plan", "--model", "llama3-8b", "--hardware", "h100-sxm-80gb", "--gpus", "8",
                                       "--global-batch", "64", "--seq-len", "4096"])
    assert result.exit_code == 0, result.output
    assert "layouts within 1%: picked the simplest" in result.output


def test_simplicity_key_prefers_fewer_exotic_axes_then_fewer_axes_then_lower_zero_then_fewer_microbatches():
    from costmodels.layout import Layout

    plain = Layout(dp=8, zero_stage=1, num_microbatches=1)
    assert simplicity_key(plain) < simplicity_key(Layout(dp=1, cp=8, zero_stage=1, num_microbatches=1))
    assert simplicity_key(plain) < simplicity_key(Layout(dp=4, tp=2, zero_stage=1, num_microbatches=1))
    assert simplicity_key(plain) < simplicity_key(Layout(dp=8, zero_stage=3, num_microbatches=1))
    assert simplicity_key(plain) < simplicity_key(Layout(dp=8, zero_stage=1, num_microbatches=2))


@pytest.mark.parametrize("seed", range(12))
def test_brute_force_equals_search_under_the_tie_rule(seed):
    model, training, cluster, fraction = _case(seed)

    def run(solver):
        cost_model = CostModel(Job(model=model, training=training, cluster=cluster, memory_fraction=fraction,
                                   convention=CONVENTIONS[training.runtime]))
        return prefer_simplest(solver(cost_model, cluster.num_gpus, cluster.gpus_per_node, SearchOptions(), top_k=6).ranked)

    (fast, fast_tied), (slow, slow_tied) = run(solve), run(solve_brute_force)
    assert [b.layout for b in fast] == [b.layout for b in slow]
    assert fast_tied == slow_tied

