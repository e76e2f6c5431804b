"""The kernel constants are the device's: fitted on one H100's and one H200's kernel times
(``benchmarks/data/gpu/device``), shipped as generated, and no shipped rate exceeds what a device
sustains."""

import sys
from pathlib import Path

import pytest

from costmodels.assumptions import DEFAULT_ASSUMPTIONS, UNCALIBRATED
from costmodels.calibration import DEVICE_CALIBRATION_MODULE, DEVICE_CONSTANTS, module_text
from costmodels.compute import Rates, backward_gemms
from costmodels.flops import Gemm
from hardware_specs.loader import load_node
from planner.published.device_kernels import fit_attention, fit_gemm, sustained_share
from planner.published.device_records import DEVICE_RECORD_NAMES, load_device_record, load_sustained_record

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))

RECORDS = [load_device_record(tag) for tag in DEVICE_RECORD_NAMES]


def test_backward_runs_the_input_and_weight_gradient_gemms_at_their_own_shapes():
    # Y = X W with X 8192 x 8192 (tokens x h) and W 8192 x 1280 (70B's QKV at tp 8):
    # dX = dY W^T is 8192 x 8192 reduced over 1280; dW = X^T dY is 8192 x 1280 reduced over the tokens.
    dgrad, wgrad = backward_gemms(Gemm(m=8192, n=1280, k=8192, count=3))
    assert (dgrad.m, dgrad.n, dgrad.k, dgrad.count) == (8192, 8192, 1280, 3)
    assert (wgrad.m, wgrad.n, wgrad.k, wgrad.count) == (8192, 1280, 8192, 3)
    assert dgrad.flops == wgrad.flops == Gemm(m=8192, n=1280, k=8192, count=3).flops


def test_the_shipped_kernel_constants_are_the_fit_on_the_device_records():
    import device_kernels

    gemm = fit_gemm(RECORDS)
    native, legacy = fit_attention(RECORDS)
    assert {**gemm.constants, **native.constants, **legacy.constants} == DEVICE_CONSTANTS
    assert DEVICE_CALIBRATION_MODULE.read_text() == module_text(device_kernels.MODULE_DOCSTRING, DEVICE_CONSTANTS)
    for name, value in DEVICE_CONSTANTS.items():
        assert getattr(DEFAULT_ASSUMPTIONS, name) == value
    # the fit explains the timed calls: GEMMs within 6%, attention within 4% (median)
    assert gemm.median_abs_error < 0.06 and native.median_abs_error < 0.04
    # FlashAttention-2 on Hopper runs at about half of cuDNN's native kernel (FlashAttention-3's paper: 35% vs 75%)
    assert 0.4 < legacy.constants["legacy_attention_share"] < 0.6


@pytest.mark.parametrize("tag", DEVICE_RECORD_NAMES)
def test_presets_carry_the_measured_sustained_share_and_no_rate_exceeds_it(tag):
    record, sustained = load_device_record(tag), load_sustained_record(tag)
    hardware = load_node(record.preset).hardware
    assert hardware.sustained_rate_share == pytest.approx(sustained_share(sustained, record), abs=5e-4)
    # the shipped large-GEMM rate: efficiency x bf16 peak x the sustained share, under the minute-long rate
    ceiling = DEFAULT_ASSUMPTIONS.gemm_efficiency * hardware.peak_flops("bf16") * hardware.tensor_rate_share()
    assert ceiling <= sustained.gemm_flops_per_s
    rates = Rates(hardware, "bf16", None, DEFAULT_ASSUMPTIONS)
    big = Gemm(m=8192, n=8192, k=8192)
    assert big.flops / rates.gemm_time_s(big) <= sustained.gemm_flops_per_s


def test_a_profiles_measured_share_replaces_the_presets():
    from profiles.schema import HardwareProfile

    hardware = load_node("h100-sxm-80gb").hardware
    big = Gemm(m=8192, n=8192, k=8192)
    preset = Rates(hardware, "bf16", None, UNCALIBRATED).gemm_time_s(big)
    measured = HardwareProfile(device_type="cuda", provenance={}, sustained_rate_share=0.5)
    assert Rates(hardware, "bf16", measured, UNCALIBRATED).gemm_time_s(big) == pytest.approx(
        preset * hardware.tensor_rate_share() / 0.5)
