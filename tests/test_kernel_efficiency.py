"""Kernel efficiency by shape: GEMM tile/wave quantisation and depth, attention block length and
head dim, the ring exchange of context parallelism, each against a hand-worked value."""

from __future__ import annotations

import pytest

from costmodels.assumptions import UNCALIBRATED, Assumptions
from costmodels.compute import Rates
from costmodels.flops import Gemm
from costmodels.kernel_efficiency import (attention_block_efficiency, attention_head_dim_efficiency,
                                          best_quantisation_efficiency, depth_efficiency,
                                          quantisation_efficiency)
from costmodels.overlap import ring_exposed_s
from hardware_specs import load_node


def test_datasheet_peak_is_sms_times_tensor_rate_times_the_clock():
    # H100 SXM: 4 tensor cores x 512 dense bf16 FMA x 2 FLOPs = 4096 FLOPs/clock/SM; A100: 4 x 256 x 2.
    for name, per_sm in (("h100-sxm-80gb", 4096), ("a100-sxm-80gb", 2048)):
        hw = load_node(name).hardware
        assert hw.num_sms * per_sm * hw.sustained_clock_hz == pytest.approx(hw.peak_flops("bf16"), rel=2e-3)
    assert load_node("cpu").hardware.num_sms == 0


def test_wave_quantisation_of_a_square_gemm_on_132_sms():
    # 4096x4096 output, 128x256 tiles: 32 * 16 = 512 tiles in ceil(512/132) = 4 waves of 132 slots;
    # every tile choice gives 512/528 here (128x128: 1024 tiles in 8 waves; 64x128: 2048 in 16).
    assert quantisation_efficiency(4096, 4096, 4096, 132, (128, 256)) == pytest.approx(512 / 528)
    assert best_quantisation_efficiency(4096, 4096, 4096, 132) == pytest.approx(512 / 528)
    # One tile more than the SMs hold, k too short to split (128 < 2 * 256): 133 tiles in 2 waves.
    assert quantisation_efficiency(133 * 128, 128, 128, 132, (128, 128)) == pytest.approx(133 / 264)


def test_tile_quantisation_of_a_tiny_gemm_with_split_k_and_no_sm_count_no_loss():
    # A 100x100 output with 64x128 tiles: 2 tiles holding 2 * 8192 outputs, 10^4 of them useful.
    # k = 4096 splits each tile min(132 // 2, 4096 // 256) = 16 ways: 32 units in one wave of 132.
    share = 1e4 / (2 * 64 * 128) * 32 / 132
    assert quantisation_efficiency(100, 100, 4096, 132, (64, 128)) == pytest.approx(share)
    assert best_quantisation_efficiency(100, 100, 4096, 132) == pytest.approx(share)
    assert best_quantisation_efficiency(100, 100, 4096, 0) == 1.0
    assert best_quantisation_efficiency(1, 4096, 4096, 132) == 1.0  # one token: a bandwidth-bound GEMV


def test_a_shallow_gemm_loses_its_prologue_and_epilogue():
    # k = 512 (h/t of a tp 8 slice of a 4096 model) with k0 = 128: 512 / 640 = 0.8; k = 8192: 0.985.
    assert depth_efficiency(512, 128.0) == pytest.approx(0.8)
    assert depth_efficiency(8192, 128.0) == pytest.approx(8192 / 8320)


def test_rates_charge_a_tp8_slice_of_a_small_model_less_than_the_ceiling():
    # Row-parallel output projection of an 8B model at tp 8: m = 16384 tokens, n = 4096, k = 512.
    # Best tile 64x128: 256 * 32 = 8192 tiles in 63 waves (8316 slots): 8192/8316; depth 512/640.
    hw = load_node("h100-sxm-80gb").hardware
    a = UNCALIBRATED
    rates = Rates(hw, "bf16", None, a)
    m, n, k = 16384, 4096, 512
    share = (8192 / 8316) * (512 / 640)
    assert rates.gemm_shape_efficiency(m, n, k) == pytest.approx(share)
    assert rates.gemm_time_s(Gemm(m=m, n=n, k=k)) == pytest.approx(
        2 * m * n * k / (a.gemm_efficiency * share * hw.peak_flops("bf16") * hw.tensor_rate_share()))


def test_attention_block_and_head_dim_factors():
    # s½ = 256: a 1k block runs at 1024/1280 = 0.8, an 8k one at 8192/8448; CP 8 of an 8k sequence
    # runs its ring steps on 1k blocks, so it is 0.8 / 0.9697 = 0.825x as fast per FLOP.
    assert attention_block_efficiency(1024, 256.0) == pytest.approx(0.8)
    assert attention_block_efficiency(8192, 256.0) == pytest.approx(8192 / 8448)
    # d½ = 32: head dim 64 relative to 128 = (64/96) / (128/160) = 5/6.
    assert attention_head_dim_efficiency(64, 32.0) == pytest.approx(5 / 6)
    assert attention_head_dim_efficiency(128, 32.0) == pytest.approx(1.0)
    hw = load_node("h100-sxm-80gb").hardware
    rates = Rates(hw, "bf16", None, UNCALIBRATED)
    assert rates.attention_rate(1024, 128) / rates.attention_rate(8192, 128) == pytest.approx(0.8 / (8192 / 8448))
    assert rates.attention_rate(8192, 128) == pytest.approx(
        hw.peak_flops("bf16") * UNCALIBRATED.attention_efficiency * hw.tensor_rate_share() * 8192 / 8448)


def test_ring_exchange_is_exposed_where_it_outlasts_its_block_and_slows_it_otherwise():
    a = Assumptions(overlap_slowdown=0.1)
    # 3 transfers of 2 s, each beside a 3 s block: hidden, but each slows its block by 0.1 * 2 s.
    assert ring_exposed_s(2.0, 3.0, 3, a) == pytest.approx(0.6)
    # 3 s transfers beside 2 s blocks: 1 s exposed each plus 0.1 * 2 s slowdown: 3 * 1.2.
    assert ring_exposed_s(3.0, 2.0, 3, a) == pytest.approx(3.6)
    assert ring_exposed_s(3.0, 2.0, 0, a) == 0.0


def test_fused_attention_backward_runs_2_5x_the_flops_at_three_quarters_of_the_forward_rate():
    from costmodels.compute import DATASHEET, PROFILE

    rates = Rates(load_node("h100-sxm-80gb").hardware, "bf16", None, Assumptions(attention_backward_efficiency=0.75))
    assert rates.attention_backward_s(1.0, DATASHEET, fused=True) == pytest.approx(2.5 / 0.75)
    assert rates.attention_backward_s(1.0, PROFILE, fused=True) == pytest.approx(2.5)  # measured: as timed
    assert rates.attention_backward_s(1.0, DATASHEET, fused=False) == pytest.approx(2.0)  # eager: two GEMMs


def test_a_measured_gemm_rate_wins_over_the_shape_factors():
    # The shipped CPU profile's bf16 GEMM table, put under an H100's datasheet: a tp 8 slice shape
    # takes FLOPs / measured rate, with no quantisation or depth factor on top.
    from pathlib import Path

    from profiles import load_profile

    profile = load_profile(Path(__file__).parent.parent / "profiles" / "data" / "cpu-gloo-2proc.json")
    hw = load_node("h100-sxm-80gb").hardware
    m, n, k = 2048, 512, 512
    measured = profile.gemm_flops_per_s(m, n, k, "bf16")
    assert measured
    seconds, source = Rates(hw, "bf16", profile, UNCALIBRATED).gemm_time_and_source(Gemm(m=m, n=n, k=k))
    assert source == "profile" and seconds == pytest.approx(2 * m * n * k / measured)
