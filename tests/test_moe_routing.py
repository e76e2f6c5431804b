"""MoE as trained now, worked by hand: the busiest expert rank under dropless or capacity routing,
its expert GEMMs, the permute/unpermute traffic, and the --moe-imbalance option."""

from __future__ import annotations

from dataclasses import replace

import pytest

import planner
from costmodels.assumptions import DEFAULT_ASSUMPTIONS as A
from costmodels.compute import Rates
from costmodels.convention import MEGATRON
from costmodels.layer_costs import LayerCosts, LayerKey
from costmodels.model_spec import MoESpec
from costmodels.moe_costs import moe_permute_bytes
from costmodels.presets import PRESETS
from costmodels.training import TrainingSpec
from hardware_specs import SpecError, load_node, make_cluster


def test_busiest_rank_factor_by_routing_mode():
    base = dict(num_experts=8, top_k=2, expert_ffn_hidden_size=64)
    assert MoESpec(**base, load_imbalance=1.3).busiest_token_factor == 1.3  # dropless: all of the excess
    assert MoESpec(**base, load_imbalance=1.3, capacity_factor=1.25).busiest_token_factor == 1.25  # dropped above
    assert MoESpec(**base, load_imbalance=1.1, capacity_factor=1.25).busiest_token_factor == 1.1
    assert MoESpec(**base, capacity_factor=1.25, pad_to_capacity=True).busiest_token_factor == 1.25  # padded
    with pytest.raises(SpecError, match="capacity_factor must be 0"):
        MoESpec(**base, capacity_factor=0.5)


def test_permute_traffic_by_hand():
    # tiny-mixtral: h = 256, k = 2. 100 tokens, 2-byte elements: permute reads 100·256 and writes
    # 2·100·256 elements, unpermute reads 2·100·256 and writes 100·256: 2·2·100·256·(1 + 2) bytes.
    assert moe_permute_bytes(PRESETS["tiny-mixtral"], 100, 2) == 2 * 2 * 100 * 256 * 3 == 307_200


def _moe_forward(model, **key):
    training = TrainingSpec(global_batch_size=1, seq_len=4096)
    cluster = make_cluster(load_node("h100-sxm-80gb"), 8)
    layers = LayerCosts(model, training, cluster, Rates(cluster.hardware, "bf16", None, A), None, A,
                        convention=MEGATRON)
    return layers.forward(LayerKey(**{**dict(moe=True, b=1, s_local=4096, tp=1, sp=False, cp=1, ep=1), **key}))


def test_imbalance_scales_the_busiest_ranks_expert_flops():
    # tiny-mixtral, T = 4096 tokens, k = 2 of E = 4 experts, h = 256, f = 512 gated (3 matrices):
    # expert FLOPs on the busiest rank = 2·T·k·imbalance·3·h·f, so raising the imbalance from 1 to 2
    # adds 2·4096·2·3·256·512 FLOPs; attention, router and shared parts do not change.
    m = PRESETS["tiny-mixtral"]
    skewed = replace(m, moe=replace(m.moe, load_imbalance=2.0))
    assert _moe_forward(skewed).flops - _moe_forward(m).flops == 2 * 4096 * 2 * 3 * 256 * 512


def test_expert_tp_keeps_expert_flops_per_rank():
    # Under SP with tp 2, expert tp 1 computes half the tokens with whole experts; expert tp 2 all
    # the tokens with half experts: the same FLOPs per rank, 2·T·k·3·h·f / 2.
    m = PRESETS["tiny-mixtral"]
    one = _moe_forward(m, tp=2, sp=True, etp=1)
    two = _moe_forward(m, tp=2, sp=True, etp=2)
    assert one.flops == pytest.approx(two.flops)


def test_moe_imbalance_option_reaches_the_cost_model():
    kw = dict(model="tiny-mixtral", hardware="h100-sxm-80gb", gpus=1, global_batch=8, seq_len=1024,
              layout=planner.Layout(num_microbatches=8))
    assert planner.evaluate(**kw, moe_imbalance=1.5).step_time_s > planner.evaluate(**kw).step_time_s
    with pytest.raises(SpecError, match="moe_imbalance=: tiny-llama has no mixture-of-experts"):
        planner.evaluate(**{**kw, "model": "tiny-llama"}, moe_imbalance=1.5)


def test_mtp_module_sits_on_the_last_stage():
    # tiny-deepseek with one MTP module (DeepSeek-V3 Sec. 2.2), pp 2: the last stage holds its
    # mtp_params more parameters (bf16 weights: 2 bytes each under Megatron's ZeRO-0 accounting) and
    # runs one more block and head; the first stage does not change.
    from costmodels.params import mtp_params

    base = PRESETS["tiny-deepseek"]
    with_mtp = replace(base, num_mtp_layers=1)
    kw = dict(hardware="h100-sxm-80gb", gpus=2, global_batch=8, seq_len=256,
              layout=planner.Layout(pp=2, num_microbatches=8))
    a, b = planner.evaluate(model=base, **kw), planner.evaluate(model=with_mtp, **kw)
    assert b.stages[0].params_bytes == a.stages[0].params_bytes
    assert b.stages[1].params_bytes - a.stages[1].params_bytes == pytest.approx(2 * mtp_params(with_mtp))
    assert b.stages[1].activations_bytes > a.stages[1].activations_bytes
    assert b.model_flops_per_step == a.model_flops_per_step  # MFU counts the main model, as papers do


def test_mtp_experts_split_over_expert_parallelism():
    # The MTP block is an MoE layer: its routed experts are split over ep like the others'. At
    # ep 2 (dp 2, pp 2) the last stage holds the MTP module's dense part whole and half of its
    # mtp_expert_params: 2 bytes x (mtp_params - mtp_expert_params / 2) more than without MTP.
    from costmodels.params import mtp_expert_params, mtp_params

    base = PRESETS["tiny-deepseek"]
    with_mtp = replace(base, num_mtp_layers=1)
    assert mtp_expert_params(with_mtp) == base.moe.num_experts * 3 * base.hidden_size * base.moe.expert_ffn_hidden_size
    kw = dict(hardware="h100-sxm-80gb", gpus=4, global_batch=8, seq_len=256,
              layout=planner.Layout(dp=2, ep=2, pp=2, num_microbatches=4))
    a, b = planner.evaluate(model=base, **kw), planner.evaluate(model=with_mtp, **kw)
    expected = 2 * (mtp_params(with_mtp) - mtp_expert_params(with_mtp) / 2)
    assert b.stages[1].params_bytes - a.stages[1].params_bytes == pytest.approx(expected)
