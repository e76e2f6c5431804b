"""Goodput and the checkpoint interval: Young (1974) and Daly (2006) worked by hand."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from costmodels.convention import MEGATRON
from costmodels.goodput import (FAILURES_PER_GPU_HOUR, checkpoint_state_bytes, daly_interval_s,
                                daly_useful_fraction, goodput, mtbf_s, young_interval_s)
from costmodels.params import total_params
from costmodels.presets import load_model
from costmodels.training import TrainingSpec
from hardware_specs import load_node, make_cluster

MIN, HOUR = 60.0, 3600.0


@pytest.mark.parametrize("mtbf_h, tau_min", [(24, 117), (6, 57), (0.25, 9.1)])
def test_daly_reproduces_his_figures(mtbf_h, tau_min):
    """Daly 2006, Figs. 3-5: δ = 5 min, M = 24 h, 6 h, 15 min give τ_opt = 117, 57, 9.1 min.
    By hand for 24 h: √(2·5·1440) = 120; δ/2M = 5/2880; 120·(1 + 0.04167/3 + 0.001736/9) − 5 = 116.7."""
    assert daly_interval_s(5 * MIN, mtbf_h * HOUR) / MIN == pytest.approx(tau_min, abs=0.5 if tau_min > 10 else 0.05)


def test_young_is_daly_to_first_order_and_daly_caps_at_m():
    assert young_interval_s(5 * MIN, 24 * HOUR) == pytest.approx(120 * MIN)  # √(2·5·1440) min
    assert daly_interval_s(10.0, 1e9) == pytest.approx(young_interval_s(10.0, 1e9), rel=1e-3)
    assert daly_interval_s(3 * HOUR, HOUR) == HOUR  # δ ≥ 2M: checkpoint once per M


def test_daly_optimum_maximises_the_useful_fraction():
    delta, restart, M = 5 * MIN, 10 * MIN, 6 * HOUR
    best = daly_interval_s(delta, M)
    at = [daly_useful_fraction(best * f, delta, restart, M) for f in (0.5, 0.8, 1.0, 1.25, 2.0)]
    assert at[2] == max(at)


def test_failure_rate_is_llama3s_interruptions():
    """419 unexpected interruptions / (54 days · 24 h · 16,384 GPUs) = 1.973e-5 per GPU-hour;
    on 16,384 GPUs that is one every 3.09 hours (the Llama 3 report: about one every three hours)."""
    assert FAILURES_PER_GPU_HOUR == pytest.approx(1.973e-5, rel=1e-3)
    assert mtbf_s(16_384) / HOUR == pytest.approx(3.09, rel=1e-2)


def test_llama3_70b_on_64_h100_by_hand():
    """The README's job with Megatron's bf16 AdamW states (2 + 12 bytes per parameter):
    Ψ = 70.55e9, checkpoint 14Ψ = 987.8 GB; 8 nodes write 0.977 GB/s each, δ = 126.4 s;
    M = 1 / (1.973e-5 · 64) h = 791.8 h = 2.8506e6 s; τ_Young = √(2 · 126.4 · 2.8506e6) = 26,844 s;
    Daly: x = δ/2M = 2.217e-5, τ = 26,844 · (1 + √x/3 + x/9) − 126.4 = 26,760 s, which at a
    47.122 s step is 567.9 -> 568 steps, τ = 26,765 s; R = 600 + 126.4 s;
    T_s/T_w = τ / (M e^(R/M) (e^((τ+δ)/M) − 1)) = 26,765 / 27,026 = 0.9904."""
    model = load_model("llama3-70b")
    training = TrainingSpec(global_batch_size=512, seq_len=8192)
    size = checkpoint_state_bytes(model, training, MEGATRON)
    assert size == 14 * total_params(model)
    g = goodput(size, make_cluster(load_node("h100-sxm-80gb"), 64), num_gpus=64, step_time_s=47.122, tokens_per_s=89_010.0)
    assert g.checkpoint_write_s == pytest.approx(126.4, rel=1e-3)
    assert g.mtbf_s / HOUR == pytest.approx(791.8, rel=1e-3)
    assert g.interval_steps == 568
    assert g.useful_fraction == pytest.approx(0.9904, abs=2e-4)
    assert g.tokens_per_s == pytest.approx(89_010 * g.useful_fraction)
    assert math.isclose(g.restart_s, 600 + g.checkpoint_write_s)


def test_lora_checkpoint_holds_frozen_weights_once_and_adapter_states():
    """FSDP2 keeps everything fp32: frozen weights 4 B, adapters 4 + 8 B (AdamW) per element."""
    from costmodels.params import lora_params_per_layer
    from costmodels.runtimes import FSDP2

    model = load_model("tiny-llama")
    training = TrainingSpec(global_batch_size=8, seq_len=64, lora_rank=8, runtime="torch")
    adapters = model.num_layers * lora_params_per_layer(model, 8, training.lora_targets)
    assert checkpoint_state_bytes(model, training, FSDP2) == 4 * total_params(model) + 12 * adapters


def test_plan_reports_goodput_and_launch_checkpoints_at_its_interval(tmp_path):
    from planner.cli import main

    plan = tmp_path / "plan.json"
    args = ["plan", "--model", "tiny-llama", "--hardware", "cpu", "--gpus", "4", "--global-batch", "8",
            "--seq-len", "64", "--precision", "fp32", "--top", "1", "--runtime", "torch"]  # the job with train.py
    table = CliRunner().invoke(main, args)
    assert table.exit_code == 0 and "goodput" in table.output and "checkpoint every" in table.output
    assert CliRunner().invoke(main, [*args, "--out", str(plan)]).exit_code == 0
    predicted = json.loads(plan.read_text())["best"]["predicted"]
    g = predicted["goodput"]
    assert 0 < g["useful_fraction"] < 1
    assert g["tokens_per_s"] == pytest.approx(predicted["tokens_per_s"] * g["useful_fraction"], rel=1e-5)
    every = g["checkpoint_every_steps"]
    assert every == max(1, round(g["interval_s"] / predicted["step_time_s"]))
    result = CliRunner().invoke(main, ["launch", str(plan), "--out", str(tmp_path / "job")])
    assert result.exit_code == 0, result.output
    assert f'train.py" --checkpoint-every {every} "$@"' in (tmp_path / "job" / "launch.sh").read_text()
