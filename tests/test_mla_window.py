"""Multi-head latent attention and sliding-window attention, worked by hand: parameters, FLOPs,
saved activations, attention time."""

from __future__ import annotations

from dataclasses import replace

import pytest

from costmodels.activations import ActivationShape, attention_core_bytes, layer_bytes, mla_block_bytes
from costmodels.assumptions import DEFAULT_ASSUMPTIONS as A
from costmodels.compute import Rates
from costmodels.convention import MEGATRON
from costmodels.flops import (attention_core_flops, attention_gemms, mean_window_fraction, model_flops_per_token,
                              window_fraction)
from costmodels.layer_costs import LayerCosts, LayerKey
from costmodels.model_spec import MLASpec, ModelSpec
from costmodels.moe_costs import ring_steps
from costmodels.params import mla_params
from costmodels.presets import PRESETS
from costmodels.training import TrainingSpec
from hardware_specs import load_node, make_cluster

# h = 256, a = 8 heads, d_c' = 64, d_c = 32, d_h = 32, d_h^R = 16, d_v = 32 (so d_qk = 48).
MLA = ModelSpec(name="mla", num_layers=2, hidden_size=256, ffn_hidden_size=512, num_attention_heads=8,
                num_kv_heads=8, vocab_size=1024, gated_mlp=True, activation="silu", norm="rmsnorm",
                positions="rotary",
                mla=MLASpec(q_lora_rank=64, kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32))


def test_mla_parameters_by_matrix():
    # q down 256·64 + norm 64 + q up 64·(8·48); kv down 256·(32 + 16) + norm 32; kv up 32·8·(32 + 32);
    # out 8·32·256 (DeepSeek-V2 eq. 9-18).
    expected = 256 * 64 + 64 + 64 * 384 + 256 * 48 + 32 + 32 * 512 + 256 * 256
    assert mla_params(MLA) == expected == 135_264
    without_q_latent = replace(MLA, mla=replace(MLA.mla, q_lora_rank=0))
    assert mla_params(without_q_latent) == 256 * 384 + 256 * 48 + 32 + 32 * 512 + 256 * 256


def test_deepseek_v3_attention_is_187m_per_layer():
    # h = 7168, a = 128, d_c' = 1536, d_c = 512, d_h = 128, d_h^R = 64, d_v = 128:
    # 7168·1536 + 1536 + 1536·128·192 + 7168·576 + 512 + 512·128·256 + 128·128·7168.
    assert mla_params(PRESETS["deepseek-v3"]) == 187_107_328


def test_mla_gemm_flops_split_over_tp_and_match_the_weights():
    # tokens T = 256, t = 2. Down-projections stay whole: 2·T·256·48 (kv) + 2·T·256·64 (q);
    # up-projections split over heads (4 per rank): 2·T·64·(4·48) + 2·T·32·(4·64);
    # out row-parallel: 2·T·128·256.
    T = 256
    flops = sum(g.flops for g in attention_gemms(MLA, T, tp=2))
    assert flops == 2 * T * (256 * 48 + 256 * 64 + 64 * 192 + 32 * 256 + 128 * 256) == 41_943_040
    # With SP each rank runs the down-projections on its T/2 tokens only.
    sp = sum(g.flops for g in attention_gemms(MLA, T, tp=2, sp=True))
    assert flops - sp == 2 * (T // 2) * (256 * 48 + 256 * 64)
    # Without tp every weight is used once per token: 2·T·(params − the two latent norms).
    assert sum(g.flops for g in attention_gemms(MLA, T, tp=1)) == 2 * T * (mla_params(MLA) - 64 - 32)


def test_mla_core_flops_use_key_and_value_widths():
    # 2·b·s²·(a·d_qk + a·d_v)/t = 2·2·128²·(384 + 256)/2 for b = 2, s = 128, t = 2.
    assert attention_core_flops(MLA, 2, 128, 128, 2) == 2 * 2 * 128**2 * 640 / 2 == 20_971_520
    # MHA keeps Megatron's 4·b·s²·(a·d)/t.
    llama = PRESETS["tiny-llama"]
    assert attention_core_flops(llama, 2, 128, 128, 2) == 4 * 2 * 128**2 * 256 / 2


def _shape(**kw) -> ActivationShape:
    values = dict(b=2, s=128, s_kv=128, tp=2, sequence_parallel=False, elem_bytes=2, fused_attention=True)
    return ActivationShape(**{**values, **kw})


def test_mla_saved_activations_with_and_without_recomputing_the_up_projections():
    # b = 2, s = 128 (s·b = 256), t = 2 (4 heads per rank), 2-byte elements, no SP, no dropout.
    # norm input and down-projection input: 2 · 2·256·256 = 262,144
    # latents as the norms receive them: 2·256·(64 + 32) = 49,152; shared rotary key 2·256·16 = 8,192
    # output-projection input: 2·256·4·32 = 65,536             -> kept always: 385,024
    # normalised latents again (49,152) and Q, K, V: 2·256·4·(2·48 + 32) = 262,144
    kept = 262_144 + 49_152 + 8_192 + 65_536
    assert mla_block_bytes(MLA, _shape(), recompute_up=True) == kept == 385_024
    assert mla_block_bytes(MLA, _shape(), recompute_up=False) == kept + 49_152 + 262_144 == 696_320
    # A layer under selective recomputation drops those and the core's fp32 LSE (4·b·(a/t)·s = 4,096).
    x = _shape()
    saved = layer_bytes(MLA, x, moe_layer=False, recompute="none") - layer_bytes(MLA, x, moe_layer=False,
                                                                                 recompute="selective")
    assert attention_core_bytes(MLA, x) == 4 * 2 * 4 * 128
    assert saved == 49_152 + 262_144 + 4_096


def test_window_fraction_counts_the_pairs():
    # s = 8, w = 3: query i sees min(i, 3) keys: 1 + 2 + 3·6 = 21 of the causal 36 pairs.
    assert window_fraction(8, 3) == pytest.approx(21 / 36)
    assert window_fraction(8, 8) == window_fraction(8, 0) == 1.0
    # tiny-gemma: 4 layers, window 16, every 2nd layer global; at s = 64 a local layer keeps
    # (16·64 − 16·15/2) / (64·65/2) = 904/2080 of the pairs, a global one all.
    local = (16 * 64 - 16 * 15 / 2) / (64 * 65 / 2)
    assert mean_window_fraction(PRESETS["tiny-gemma"], 64) == pytest.approx((local + 1) / 2)


def test_window_scales_the_attention_term_of_model_flops():
    m = PRESETS["tiny-gemma"]
    full = replace(m, sliding_window=0, global_layer_period=0)
    s = 64
    attention_full = 12 * m.num_layers * m.q_dim * s
    drop = model_flops_per_token(full, s) - model_flops_per_token(m, s)
    assert drop == pytest.approx(attention_full * (1 - mean_window_fraction(m, s)))


def _forward(model: ModelSpec, attention: str, s: int):
    training = TrainingSpec(global_batch_size=1, seq_len=s, attention=attention)
    cluster = make_cluster(load_node("h100-sxm-80gb"), 1)
    layers = LayerCosts(model, training, cluster, Rates(cluster.hardware, "bf16", None, A), None, A,
                        convention=MEGATRON)
    return layers.forward(LayerKey(moe=False, b=1, s_local=s, tp=1, sp=False, cp=1, ep=1))


def test_window_shortens_fused_attention_but_not_eager():
    # A fused kernel skips the tiles outside the window, so the core time falls by the mean
    # fraction; eager attention computes the whole masked s×s matrix, so its time stays.
    m = PRESETS["mistral-7b"]  # window 4096 on every layer
    full = replace(m, sliding_window=0)
    s = 16384
    frac = window_fraction(s, 4096)
    fused, fused_full = _forward(m, "fused", s), _forward(full, "fused", s)
    assert fused.attention_core_s == pytest.approx(frac * fused_full.attention_core_s, rel=1e-12)
    eager, eager_full = _forward(m, "eager", s), _forward(full, "eager", s)
    assert eager.attention_core_s == pytest.approx(eager_full.attention_core_s, rel=1e-12)
    assert fused.flops < fused_full.flops  # model FLOPs count only the pairs in the window


def test_window_leaves_saved_activations_alone():
    # Fused: Q, K, V, the output and the LSE whatever the window; eager: the whole masked score matrix.
    m = PRESETS["mistral-7b"]
    for fused in (True, False):
        x = _shape(fused_attention=fused, s=512, s_kv=512)
        assert layer_bytes(m, x, moe_layer=False, recompute="none") == \
            layer_bytes(replace(m, sliding_window=0), x, moe_layer=False, recompute="none")


def test_ring_attention_stops_where_the_window_ends():
    # cp = 8 over s = 32768: blocks of 4096 tokens. A 4096-token window reaches 1 block back, so a
    # local layer exchanges 1 block instead of 7; Gemma-style (every 2nd global) averages (1 + 7)/2.
    m = PRESETS["mistral-7b"]
    assert ring_steps(m, 8, 4096) == 1
    assert ring_steps(replace(m, global_layer_period=2), 8, 4096) == 4
    assert ring_steps(replace(m, sliding_window=0), 8, 4096) == 7



def test_mla_under_sp_gathers_latents_instead_of_the_attention_input():
    # tp 2 with SP, T = 256 tokens, 2-byte elements: the MLP gathers 2·T·h = 131,072 bytes as
    # before, MLA gathers its latents 2·T·(64 + 32 + 16) = 57,344 bytes; a ring all-gather sends
    # (t − 1)/t of each (Thakur et al. 2005).
    training = TrainingSpec(global_batch_size=1, seq_len=256)
    cluster = make_cluster(load_node("h100-sxm-80gb"), 2)
    layers = LayerCosts(MLA, training, cluster, Rates(cluster.hardware, "bf16", None, A), None, A,
                        convention=MEGATRON)
    f = layers.forward(LayerKey(moe=False, b=1, s_local=256, tp=2, sp=True, cp=1, ep=1))
    assert f.comm_bytes["tp_all_gather"] == pytest.approx((131_072 + 57_344) / 2)
    assert f.comm_bytes["tp_reduce_scatter"] == pytest.approx(2 * 131_072 / 2)
