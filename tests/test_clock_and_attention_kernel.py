"""Power-limited clock and the runtime's attention kernel: each rate against a hand-worked value."""

from __future__ import annotations

from dataclasses import replace

import pytest

from costmodels.assumptions import UNCALIBRATED
from costmodels.compute import Rates
from costmodels.flops import Gemm
from costmodels.kernel_efficiency import attention_kernel_share
from hardware_specs import load_node
from autoplan_base.errors import SpecError
from costmodels.runtimes import FSDP2


def test_a_500w_h100_sustains_the_cube_root_of_its_power_share_of_the_clock():
    # f ~ P^(1/3): 1830 MHz x (500/700)^(1/3) = 1636 MHz, a share of 1636/1830 = 0.894.
    hw = load_node("h100-hbm2e-96gb-500w").hardware
    assert hw.power_limited_clock_hz == pytest.approx(1830e6 * (500 / 700) ** (1 / 3), rel=1e-3)
    assert hw.clock_share() == pytest.approx(1636 / 1830)
    assert load_node("h100-sxm-80gb").hardware.clock_share() == 1.0  # no limit given: the datasheet clock


def test_a_power_limited_part_runs_a_compute_bound_gemm_slower_by_the_clock_share_but_quotes_the_same_peak():
    # 8192^3 bf16 GEMM: compute-bound on both parts (2*8192^3 FLOPs over 3 * 2 * 8192^2 bytes = 2731
    # FLOP/byte, far above 989e12 / 2.4e12 = 412), so its time scales by exactly 1830 / 1636.
    full = Rates(load_node("h100-sxm-80gb").hardware, "bf16", None, UNCALIBRATED)
    capped = Rates(load_node("h100-hbm2e-96gb-500w").hardware, "bf16", None, UNCALIBRATED)
    g = Gemm(m=8192, n=8192, k=8192)
    assert capped.gemm_time_s(g) / full.gemm_time_s(g) == pytest.approx(1830 / 1636)
    assert capped.attention_rate(8192, 128) / full.attention_rate(8192, 128) == pytest.approx(1636 / 1830)
    assert capped.mfu_peak == full.mfu_peak == pytest.approx(989e12)


def test_power_limited_clock_above_the_datasheet_clock_is_refused():
    hw = load_node("h100-sxm-80gb").hardware
    with pytest.raises(SpecError, match="power_limited_clock_mhz"):
        replace(hw, power_limited_clock_hz=2000e6)


def test_an_sm80_attention_kernel_runs_at_the_legacy_share_on_hopper_only():
    assert attention_kernel_share(8.0, 9.0, 0.5) == 0.5  # FlashAttention-2 on H100
    assert attention_kernel_share(8.0, 8.0, 0.5) == 1.0  # on A100, its own architecture
    assert attention_kernel_share(8.0, 8.9, 0.5) == 1.0  # Ada (8.9) runs the sm80 path natively
    assert attention_kernel_share(0.0, 9.0, 0.5) == 1.0  # a kernel written per part (cuDNN under TE)
    assert attention_kernel_share(8.0, 0.0, 0.5) == 1.0  # compute capability unknown


def test_flash_attention_2_runtimes_pay_the_legacy_share_on_h100_and_not_on_a100():
    # Megatron-DeepSpeed's flash_attn and torchtitan's published runs ran FlashAttention-2 (sm80): on
    # H100 (9.0) their attention rate is legacy_attention_share (0.5) of the rate a Megatron (cuDNN)
    # run gets; on A100 (8.0) the same. The generated job's SDPA runs cuDNN's on Hopper (native).
    from costmodels.convention import DEEPSPEED
    from costmodels.runtimes import TORCHTITAN

    assert FSDP2.attention_kernel_capability == 0.0
    for name, share in (("h100-sxm-80gb", UNCALIBRATED.legacy_attention_share), ("a100-sxm-80gb", 1.0)):
        hw = load_node(name).hardware
        megatron = Rates(hw, "bf16", None, UNCALIBRATED)
        for convention in (DEEPSPEED, TORCHTITAN):
            legacy = Rates(hw, "bf16", None, UNCALIBRATED, attention_kernel_capability=convention.attention_kernel_capability)
            assert legacy.attention_rate(8192, 128) / megatron.attention_rate(8192, 128) == pytest.approx(share)
        torch = Rates(hw, "bf16", None, UNCALIBRATED, attention_kernel_capability=FSDP2.attention_kernel_capability)
        assert torch.attention_rate(8192, 128) == megatron.attention_rate(8192, 128)
        g = Gemm(m=8192, n=8192, k=8192)
        assert torch.gemm_time_s(g) == megatron.gemm_time_s(g)  # GEMMs are cuBLAS's either way


def test_a_moe_layer_forward_pays_the_dispatcher_sync_once_and_its_backward_none():
    # tiny-mixtral on one H100, 1 x 4096 tokens: with moe_sync_overhead_s = 2 ms the MoE layer's
    # forward grows by exactly 2 ms and a dense layer's not at all; the backward of the rank
    # (gemm, attention and 2x memory/host terms) does not contain sync_s.
    from costmodels.assumptions import Assumptions
    from costmodels.convention import MEGATRON
    from costmodels.layer_costs import LayerCosts, LayerKey
    from costmodels.presets import PRESETS
    from costmodels.training import TrainingSpec
    from hardware_specs import make_cluster

    model = PRESETS["tiny-mixtral"]
    cluster = make_cluster(load_node("h100-sxm-80gb"), 8)

    def forward(assumptions, moe):
        rates = Rates(cluster.hardware, "bf16", None, assumptions)
        layers = LayerCosts(model, TrainingSpec(global_batch_size=1, seq_len=4096), cluster, rates, None,
                            assumptions, convention=MEGATRON)
        return layers.forward(LayerKey(moe=moe, b=1, s_local=4096, tp=1, sp=False, cp=1, ep=1))

    synced, plain = Assumptions(moe_sync_overhead_s=2e-3), Assumptions(moe_sync_overhead_s=0.0)
    assert forward(synced, True).compute_s - forward(plain, True).compute_s == pytest.approx(2e-3)
    assert forward(synced, True).sync_s == 2e-3
    assert forward(synced, False).compute_s == forward(plain, False).compute_s


def test_fsdp_copy_out_moves_twice_the_gathered_bytes_and_copy_in_six_bytes_per_fp32_reduced_gradient():
    from costmodels.rank_time import sharded_copy_bytes

    # 1 GB of bf16 parameters gathered: read the all-gather output and write the parameters, 2 GB.
    # 1e9 gradients reduced in fp32 (4 GB): read 2 bytes of bf16 gradient and write 4, 6 GB.
    assert sharded_copy_bytes(1e9, 4e9, 2, 4) == (2e9, 6e9)


def _fsdp2_copies(zero_stage):
    """llama3-8b, FSDP2 over 8 H100s, 2 micro-batches of 1 x 2048: the rank's times with and
    without the copy kernels, and one all-gather's copy-out and one reduce-scatter's copy-in in
    seconds at 0.8 x 3.35 TB/s (uncalibrated memory-bound rate)."""
    from costmodels.assignment import rank_layers, rank_params
    from costmodels.estimate import CostModel
    from costmodels.layout import Layout
    from costmodels.rank_time import rank_times, sharded_copy_bytes
    from planner.api import resolve_job

    job = resolve_job(model="llama3-8b", hardware="h100-sxm-80gb", gpus=8, global_batch=16, seq_len=2048,
                      runtime="torch").cost_job(UNCALIBRATED)
    layout = Layout(dp=8, zero_stage=zero_stage, micro_batch_size=1, num_microbatches=2)
    with_copies = CostModel(job)
    without = CostModel(replace(job, convention=replace(FSDP2, gather_copy_kernels=False)))
    rank = rank_layers(with_copies, layout)[0]
    params = rank_params(with_copies, layout, rank)
    sb, elements = with_copies.states, params.dense + params.expert  # all trainable, nothing frozen
    out, into = sharded_copy_bytes(sb.gathered * elements, sb.reduced * elements, 2, sb.reduced)
    bandwidth = 0.8 * 3.35e12
    return rank_times(with_copies, layout, rank), rank_times(without, layout, rank), out / bandwidth, into / bandwidth


def test_fsdp2_zero3_charges_its_copies_in_the_data_parallel_term_of_each_micro_batch():
    # ZeRO-3 gathers twice per micro-batch (forward, backward) and reduce-scatters once.
    copies, plain, out_s, into_s = _fsdp2_copies(3)
    assert copies.dp_mb_s - plain.dp_mb_s == pytest.approx(2 * out_s + into_s)
    assert copies.dp_tail_s == plain.dp_tail_s


def test_fsdp2_zero1_pays_its_copies_once_per_step_in_the_tail():
    # ZeRO-1 gathers once per step and reduce-scatters after the last micro-batch.
    copies, plain, out_s, into_s = _fsdp2_copies(1)
    assert copies.dp_mb_s == plain.dp_mb_s
    assert copies.dp_tail_s - plain.dp_tail_s == pytest.approx(out_s + into_s)


def test_eager_elementwise_bytes_per_element_at_bf16():
    from costmodels.eager_elementwise import (eager_norm_bytes_per_element, eager_rotary_bytes_per_element,
                                              eager_swiglu_bytes_per_element)

    # RMSNorm: (2+4) + (4+4) + 4 + (4+4) + (4+2) + (2+2) = 36 bytes against a fused 2 + 2: 32 extra.
    assert eager_norm_bytes_per_element(2) == 32
    # SwiGLU: silu reads and writes f, the product reads 2f and writes f: 5 x 2 against 3 x 2: 4 extra.
    assert eager_swiglu_bytes_per_element(2) == 4
    # complex rotary: (2+4) + (4+4) + (4+2) = 20 bytes against 2 + 2: 16 extra.
    assert eager_rotary_bytes_per_element(2) == 16


def test_an_uncompiled_fsdp2_layer_moves_the_eager_bytes_and_a_compiled_one_does_not():
    # llama3-8b, one H100, 2 x 8192 tokens, tp 1: per token 14336 x 4 (SwiGLU) + (4096 + 1024) x 16
    # (rotary q and k) = 139,264 bytes (the norms are PyTorch's fused RMSNorm kernel on a GPU, no
    # more than a fused layer's); x 16,384 tokens = 2.28 GB, which takes 2.28e9 / (0.8 x 3.35e12)
    # = 0.85 ms more in the layer's forward memory-bound term.
    from costmodels.convention import MEGATRON
    from costmodels.layer_costs import LayerCosts, LayerKey
    from costmodels.presets import PRESETS
    from costmodels.training import TrainingSpec
    from hardware_specs import make_cluster

    cluster = make_cluster(load_node("h100-sxm-80gb"), 8)

    def memory_s(convention, compiled):
        training = TrainingSpec(global_batch_size=2, seq_len=8192, runtime=convention.runtime, compiled=compiled)
        layers = LayerCosts(PRESETS["llama3-8b"], training, cluster, Rates(cluster.hardware, "bf16", None, UNCALIBRATED),
                            None, UNCALIBRATED, convention=convention)
        return layers.forward(LayerKey(moe=False, b=2, s_local=8192, tp=1, sp=False, cp=1, ep=1)).memory_s

    extra = 16384 * (14336 * 4 + (4096 + 1024) * 16)
    assert memory_s(FSDP2, False) - memory_s(FSDP2, True) == pytest.approx(extra / (0.8 * 3.35e12))
    assert memory_s(MEGATRON, False) == memory_s(MEGATRON, True)  # fused kernels either way


def test_torchtitan_rows_compile_where_their_table_or_command_says():
    # Tables 1 and 3 list torch.compile per row; Tables 2, 4-6 and the async-TP and Trainy commands
    # compile every run; other frameworks never set it.
    from pathlib import Path

    from planner.published.runs import load_rows, map_row

    rows = {r["id"]: r for r in load_rows(Path(__file__).parents[1] / "benchmarks" / "data" / "published_runs.json")}
    compiled = {rid: map_row(rows[rid], load_node).compiled for rid in (
        "torchtitan-t1-8b-8gpu-fsdp", "torchtitan-t1-8b-8gpu-fsdp-torchcompile", "torchtitan-t3-8b-128gpu-fsdp",
        "torchtitan-t2-8b-8gpu-fsdp8-cp1", "torchtitan-asynctp-8b-64gpu-bf16-vanilla", "megatron-sc21-t1-1.7B")}
    assert compiled == {"torchtitan-t1-8b-8gpu-fsdp": False, "torchtitan-t1-8b-8gpu-fsdp-torchcompile": True,
                        "torchtitan-t3-8b-128gpu-fsdp": False, "torchtitan-t2-8b-8gpu-fsdp8-cp1": True,
                        "torchtitan-asynctp-8b-64gpu-bf16-vanilla": True, "megatron-sc21-t1-1.7B": False}


def test_a_compiled_job_round_trips_through_its_plan_file_and_an_uncompiled_one_omits_the_key():
    from costmodels.presets import PRESETS
    from costmodels.training import TrainingSpec
    from planner.plan.plan_file import PlanInputs

    for compiled in (True, False):
        inputs = PlanInputs(model="llama3-8b", model_spec=PRESETS["llama3-8b"], hardware="h100-sxm-80gb", gpus=8,
                            gpus_per_node=8, training=TrainingSpec(global_batch_size=8, seq_len=4096, runtime="torch",
                                                                   compiled=compiled))
        raw = inputs.to_dict()
        assert ("compiled" in raw["training"]) is compiled
        assert PlanInputs.from_dict(raw).training.compiled is compiled


def test_in_fp32_the_eager_casts_are_no_kernels():
    from costmodels.eager_elementwise import eager_norm_bytes_per_element, eager_rotary_bytes_per_element

    # fp32 RMSNorm: pow (4+4), mean 4, multiply (4+4), weight (4+4) = 28 against a fused 4 + 4: 20 extra;
    # fp32 rotary: the complex product alone (4+4), as much as a fused kernel: 0 extra.
    assert eager_norm_bytes_per_element(4) == 20
    assert eager_rotary_bytes_per_element(4) == 0
