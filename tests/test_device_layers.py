"""Per-layer compute against the layers one H100 and one H200 ran (``benchmarks/device_layers.py``):
the megatron runtime's fused layer is never costed faster than the fastest measured way to run it
(>= 0.97 x), and the torch runtime's eager layer lands within 15% of the measured eager layer."""

import pytest

from planner.published.device_layers import (MEGATRON_FLOOR_SHARE, TORCH_EAGER_BAND, compare_layers,
                                             per_layer_compute_s)
from planner.published.device_records import DEVICE_RECORD_NAMES, load_device_record

COMPARISONS = {tag: {(r.case.name, r.case.seq_len): r for r in compare_layers(load_device_record(tag))}
               for tag in DEVICE_RECORD_NAMES}
CELLS = [(tag, key) for tag, rows in COMPARISONS.items() for key in rows]
FLOOR_WITH_HOST_GAPS = {("h100-2026-11-28", ("l8-tp2", 4096))}
HOST_GAPS = ("the H100's bare-kernel floor of Llama-8B at tp 2, sequence 4096 (5.45 ms) sums twelve kernel "
             "timings taken one call at a time, each with its host dispatch time (about 0.7 ms in all, "
             "benchmarks/device_kernels.py); the model costs the layer at 0.96 of it")
"""The one cell below the rule, and why. Strict: the test fails once the model reaches the rule there."""


@pytest.mark.parametrize("tag,key", CELLS, ids=[f"{t}-{n}-s{s}" for t, (n, s) in CELLS])
def test_megatron_layer_is_not_faster_than_the_device_ran_it(tag, key, request):
    if (tag, key) in FLOOR_WITH_HOST_GAPS:
        request.applymarker(pytest.mark.xfail(strict=True, reason=HOST_GAPS))
    assert COMPARISONS[tag][key].megatron_share_of_fastest >= MEGATRON_FLOOR_SHARE


@pytest.mark.parametrize("tag,key", CELLS, ids=[f"{t}-{n}-s{s}" for t, (n, s) in CELLS])
def test_torch_layer_is_within_the_band_of_the_measured_eager_layer(tag, key):
    assert abs(COMPARISONS[tag][key].torch_share_of_eager - 1) <= TORCH_EAGER_BAND


def test_per_layer_compute_is_the_difference_of_two_depths_and_scales_with_the_sequence():
    record = load_device_record(DEVICE_RECORD_NAMES[0])
    short, long = (next(c for c in record.cases if c.name == "l70-tp8" and c.seq_len == s) for s in (4096, 8192))
    short_s, long_s = (per_layer_compute_s(c, record.preset, "megatron") for c in (short, long))
    # twice the tokens: the GEMMs double, the causal attention quadruples
    assert 2.0 < long_s / short_s < 2.6
    # the fused runtime costs no more than the eager one on the same layer
    assert per_layer_compute_s(long, record.preset, "megatron") <= per_layer_compute_s(long, record.preset, "torch")
