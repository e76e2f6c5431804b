"""Calibration fitting (pure): recover known factors from step times the cost model itself
generated with those factors, and the schedule orders the dry run and the plots rely on."""

from __future__ import annotations

from dataclasses import replace

import pytest

import planner
from costmodels.assumptions import DEFAULT_ASSUMPTIONS
from planner.validate.calibrate import Run, fit, interval_s, predict_all
from planner.validate.schedule import rank_order, simulate



def _runs(factors: dict) -> list[Run]:
    report = planner.plan(model="tiny-llama", hardware="cpu", gpus=4, gpus_per_node=4, global_batch=8, seq_len=64,
                          precision="fp32", launchable=True, top_k=8)
    layouts = [report.best.layout] + [c.layout for c in report.candidates]
    inputs = report.inputs
    truth = predict_all([Run(inputs=inputs, layout=L, measured_step_time_s=1.0) for L in layouts],
                        replace(DEFAULT_ASSUMPTIONS, **factors))
    return [Run(inputs=inputs, layout=L, measured_step_time_s=t) for L, t in zip(layouts, truth)]


def test_fit_recovers_compute_scale_and_overhead():
    runs = _runs({"compute_scale": 3.0, "step_overhead_s": 0.01})
    cal = fit(runs, names=("compute_scale", "step_overhead_s"), rounds=6)
    assert cal.median_abs_error_before > 0.5
    assert cal.median_abs_error_after < 0.02
    assert cal.factors["compute_scale"] == pytest.approx(3.0, rel=0.1)  # coordinate descent in a correlated valley


def test_interval_is_symmetric_in_log_space():
    low, high = interval_s(2.0, 0.1)
    assert low * high == pytest.approx(4.0)
    assert interval_s(2.0, 0.0) == (2.0, 2.0)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 4)])
def test_1f1b_holds_at_most_p_minus_i_microbatches(p, m):
    for i in range(p):
        live = peak = 0
        for kind, _, _ in rank_order("1f1b", p, i, m):
            live += 1 if kind == "F" else -1
            peak = max(peak, live)
        assert peak == min(m, p - i)
    gpipe = rank_order("gpipe", p, 0, m)
    assert [k for k, _, _ in gpipe] == ["F"] * m + ["B"] * m


@pytest.mark.parametrize("schedule,v", [("1f1b", 1), ("gpipe", 1), ("interleaved", 2)])
def test_simulated_step_matches_bubble_formula(schedule, v):
    """Uniform stages, no transfer: (m + (p - 1)/v)·(t_f + t_b) (Narayanan et al. SC'21)."""
    p, m, tf, tb = 4, 8, 1.0, 2.0
    bars = simulate(schedule, p, m, v, [tf / v] * p, [tb / v] * p, 0.0)
    assert max(b.end_s for b in bars) == pytest.approx((m + (p - 1) / v) * (tf + tb))
    assert len([b for b in bars if b.kind == "F"]) == p * m * v


@pytest.mark.parametrize("recompute, forwards", [("none", 1), ("full", 2)])
def test_host_time_per_layer_is_once_forward_ratio_backward_and_again_when_recomputed(recompute, forwards):
    """``layer_overhead_s`` x adds x per layer forward, ``backward_host_ratio`` x in backward and x
    per recomputed forward, for every micro-batch; ``tp_layer_overhead_s`` only to DTensor (torch
    runtime) TP layers."""
    from costmodels.estimate import CostModel
    from costmodels.job import Job
    from costmodels.layout import Layout
    from costmodels.presets import load_model
    from costmodels.training import TrainingSpec
    from hardware_specs import load_node, make_cluster
    from costmodels.runtimes import CONVENTIONS

    model, cluster = load_model("tiny-llama"), make_cluster(load_node("cpu"), 2)
    layout = Layout(dp=1, tp=2, pp=1, sequence_parallel=True, num_microbatches=4, recompute=recompute)
    x = 0.001
    for runtime, tp_extra in (("megatron", 0.0), ("torch", 0.002)):
        training = TrainingSpec(global_batch_size=4, seq_len=64, precision="fp32", runtime=runtime)
        convention = CONVENTIONS[runtime]
        uncharged = replace(DEFAULT_ASSUMPTIONS, layer_overhead_s=0.0, tp_layer_overhead_s=0.0)
        base = CostModel(Job(model=model, training=training, cluster=cluster, assumptions=uncharged,
                             convention=convention)).estimate(layout).step_time_s
        charged = replace(DEFAULT_ASSUMPTIONS, layer_overhead_s=x, tp_layer_overhead_s=0.002)
        step = CostModel(Job(model=model, training=training, cluster=cluster, assumptions=charged,
                             convention=convention)).estimate(layout).step_time_s
        issues = forwards + DEFAULT_ASSUMPTIONS.backward_host_ratio
        assert step - base == pytest.approx(4 * model.num_layers * issues * (x + tp_extra))
