"""costmodels/backward_peak.py: the step phase that sets an eager runtime's peak, hand-worked, and
against autoplan's own job run on this CPU (``benchmarks/memory_twin.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import planner
from costmodels.activations import ActivationShape
from costmodels.backward_peak import BackwardTerms, clip_square_bytes, layer_transient_bytes, peak_phase
from costmodels.presets import load_model

REPO = Path(__file__).resolve().parents[1]


def _shape(**kw) -> ActivationShape:
    base = dict(b=1, s=128, s_kv=128, tp=1, sequence_parallel=False, elem_bytes=2, fused_attention=True, eager=True)
    return ActivationShape(**{**base, **kw})


def test_layer_transient_is_the_gated_mlps_three_gradients_or_the_weight_cast():
    # tiny-llama: h 256, f 768, q 256; s 128, b 1, bf16.
    # three f-wide gradients: 3 · 2 · 128 · 768 = 589,824
    # autocast: one f-wide gradient + the 16-bit gradient of the 768 x 256 weight:
    #   2 · 128 · 768 + 2 · 768 · 256 = 196,608 + 393,216 = 589,824 (a tie), and accumulating adds
    #   its fp32 cast 4 · 768 · 256 = 786,432: 1,376,256
    model = load_model("tiny-llama")
    assert layer_transient_bytes(model, _shape(), weight_cast=False, accumulating=False) == 589_824
    assert layer_transient_bytes(model, _shape(), weight_cast=True, accumulating=False) == 589_824
    assert layer_transient_bytes(model, _shape(), weight_cast=True, accumulating=True) == 1_376_256
    # tensor parallelism splits both
    assert layer_transient_bytes(model, _shape(tp=2), weight_cast=True, accumulating=True) == 1_376_256 / 2


def test_the_clip_copies_the_largest_gradient_in_fp32():
    assert clip_square_bytes(1_000) == 4_000


def _terms(**kw) -> BackwardTerms:
    base = dict(layer_transient_bytes=0.0, layer_saved_bytes=0.0, recompute_bytes=0.0, layer_grads_bytes=0.0,
                head_grads_bytes=0.0, embedding_grads_bytes=0.0, loss_kept_bytes=0.0, clip_bytes=0.0)
    return BackwardTerms(**{**base, **kw})


def test_each_phase_sets_the_peak_where_its_terms_dominate():
    # A = 100 saved + 20 working; G = 60
    small_layers = _terms(layer_saved_bytes=25, layer_grads_bytes=10, layer_transient_bytes=5, loss_kept_bytes=8)
    phase = peak_phase(activations_bytes=120, working_bytes=20, grads_bytes=60, held=False, terms=small_layers)
    assert (phase.name, phase.total_bytes) == ("loss", 120)
    # large layers: g = 40 > a + r = 25; last layer: λ = 40 + 5 with G - E - g = 60 - 0 - 40 -> 65
    large = _terms(layer_saved_bytes=25, layer_grads_bytes=40, layer_transient_bytes=5, head_grads_bytes=10)
    phase = peak_phase(activations_bytes=30, working_bytes=0, grads_bytes=60, held=False, terms=large)
    assert (phase.name, phase.total_bytes) == ("last layer backward", 65)
    # first layer: S - L - a + λ with H = 100 - 8 - 25 + 45 + 10 = 122 beats the loss's 120
    first = _terms(layer_saved_bytes=25, layer_grads_bytes=40, layer_transient_bytes=5, head_grads_bytes=10,
                   loss_kept_bytes=8)
    phase = peak_phase(activations_bytes=120, working_bytes=20, grads_bytes=60, held=False, terms=first)
    assert (phase.name, phase.total_bytes) == ("first layer backward", 122)
    # the clip: G + its copy
    phase = peak_phase(activations_bytes=30, working_bytes=0, grads_bytes=60, held=False,
                       terms=_terms(clip_bytes=12))
    assert (phase.name, phase.total_bytes) == ("clip", 72)
    # held: every gradient in every phase; the first layer adds r + τ - L over the saved activations
    phase = peak_phase(activations_bytes=120, working_bytes=20, grads_bytes=60, held=True,
                       terms=_terms(recompute_bytes=15, layer_transient_bytes=10, loss_kept_bytes=1))
    assert (phase.name, phase.activations_bytes, phase.grads_bytes) == ("first layer backward", 124, 60)


@pytest.mark.parametrize("runtime", ["torch", "torchtitan"])
def test_the_phases_never_hold_less_than_activations_or_gradients_alone(runtime):
    """Every phase list starts with the loss backward, and one micro-batch's list holds the
    optimizer step's gradients: the peak is never under max(A, G) (A + G when held)."""
    for model, seq, m, recompute in (("llama3-8b", 2048, 1, "none"), ("llama3-8b", 8192, 1, "full"),
                                     ("tiny-llama", 128, 2, "selective"), ("tiny-llama", 512, 1, "none")):
        stage = planner.evaluate(model=model, hardware="h100-sxm-80gb", gpus=1, gpus_per_node=1, global_batch=m,
                                 seq_len=seq, runtime=runtime,
                                 layout=planner.Layout(num_microbatches=m, recompute=recompute)).peak_stage
        grads = stage.grads_bytes + stage.grads_freed_bytes
        live = stage.activations_bytes + stage.grads_bytes
        floor = stage.schedule_activations_bytes + grads if m > 1 else max(stage.schedule_activations_bytes, grads)
        assert live >= floor * (1 - 1e-12), (model, seq, m, recompute, stage.peak_phase)


def test_torchtitan_clips_without_a_copy_and_the_torch_job_with_one():
    kwargs = dict(model="llama3-8b", hardware="h100-sxm-80gb", gpus=1, gpus_per_node=1, global_batch=1, seq_len=512,
                  layout=planner.Layout())
    torch_job = planner.evaluate(runtime="torch", **kwargs).peak_stage
    titan = planner.evaluate(runtime="torchtitan", **kwargs).peak_stage
    assert torch_job.peak_phase == "clip"
    assert titan.peak_phase != "clip"
    # the copy is the fp32 square of the largest tensor, the 128,256 x 4,096 output head
    assert torch_job.activations_bytes == 4 * 128_256 * 4_096


@pytest.mark.slow
def test_the_job_on_this_cpu_peaks_where_the_model_says():
    """``benchmarks/memory_twin.py``: autoplan's job on this CPU under bf16 autocast, Llama-3-70B's
    layer scaled 1/32 (2 layers): at one micro-batch it peaks at the clip, under full recomputation
    in the last layer's backward (which the rule before the phases put 7% under); the model's peak
    within 1.5% of the profiler's in both."""
    cases = ["l70-s128-mb1x1-none", "l70-s128-mb2x1-full"]
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "memory_twin.py"), "--json",
                          *[arg for c in cases for arg in ("--case", c)]],
                         capture_output=True, text=True, check=True, cwd=REPO)
    rows = {r["case"]: r for r in json.loads(out.stdout[out.stdout.index("["):])}
    assert rows["l70-s128-mb1x1-none"]["phase"] == "clip"
    assert rows["l70-s128-mb2x1-full"]["phase"] == "last layer backward"
    for row in rows.values():
        assert abs(row["error"]) <= 0.015, row
    assert rows["l70-s128-mb2x1-full"]["loss_phase_rule_error"] < -0.05
