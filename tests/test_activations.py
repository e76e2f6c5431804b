"""Activation bytes per layer against Korthikanti et al. 2022 (Sec. 4, Table 2) closed forms.

Their setting: GPT block, 4h MLP, MHA, dropout, eager attention, 16-bit activations. Those closed
forms hold exactly for our op-level derivation in that setting.
"""

import pytest

from costmodels.activations import ActivationShape, layer_bytes
from costmodels.model_spec import ModelSpec
from costmodels.presets import PRESETS

GPT = PRESETS["gpt3-175b"]  # h = 12288, a = 96, dropout, plain GELU MLP, MHA
S, B = 2048, 1


def shape(tp=1, sp=False, fused=False):
    return ActivationShape(b=B, s=S, s_kv=S, tp=tp, sequence_parallel=sp, elem_bytes=2, fused_attention=fused)


def korthikanti(tp=1, sp=False, selective=False):
    s, b, h, a, t = S, B, GPT.hidden_size, GPT.num_attention_heads, tp
    scores = 0 if selective else 5 * a * s / (h * t)
    if tp == 1:
        return s * b * h * (34 + scores)
    if sp:
        return s * b * h * (34 / t + scores)
    return s * b * h * (10 + 24 / t + scores)


def test_no_parallelism_is_34_plus_5as_over_h():
    assert layer_bytes(GPT, shape(), moe_layer=False, recompute="none") == pytest.approx(korthikanti())


@pytest.mark.parametrize("t", [2, 4, 8])
def test_tensor_parallel_without_sp(t):
    assert layer_bytes(GPT, shape(tp=t), moe_layer=False, recompute="none") == pytest.approx(korthikanti(tp=t))


@pytest.mark.parametrize("t", [2, 4, 8])
def test_tensor_and_sequence_parallel(t):
    got = layer_bytes(GPT, shape(tp=t, sp=True), moe_layer=False, recompute="none")
    assert got == pytest.approx(korthikanti(tp=t, sp=True))


@pytest.mark.parametrize("t", [2, 8])
def test_selective_recompute_with_tp_sp_is_34_over_t(t):
    got = layer_bytes(GPT, shape(tp=t, sp=True), moe_layer=False, recompute="selective")
    assert got == pytest.approx(korthikanti(tp=t, sp=True, selective=True))


def test_full_recompute_keeps_only_the_layer_input():
    assert layer_bytes(GPT, shape(), moe_layer=False, recompute="full") == 2 * S * B * GPT.hidden_size


def test_fused_attention_drops_the_score_term():
    eager = layer_bytes(GPT, shape(), moe_layer=False, recompute="none")
    fused = layer_bytes(GPT, shape(fused=True), moe_layer=False, recompute="none")
    a = GPT.num_attention_heads
    lse = 4 * B * a * S  # fp32 log-sum-exp the fused kernel keeps
    assert eager - fused == pytest.approx(5 * a * S * S * B - lse)


def test_gqa_and_gated_mlp_change_the_constant_per_tensor():
    # Llama-style, no dropout, fused, per s·b·h at 2 bytes: attention norm input 2, qkv input 2, Q 2,
    # K and V 2·kv/a each, out-proj input 2, MLP norm input 2, MLP input 2, three f/h gated MLP tensors
    # (Megatron's fused SwiGLU keeps fc1's 2f output and recomputes the SiLU; fc2 keeps its f input).
    m = ModelSpec(name="x", num_layers=1, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
                  num_kv_heads=8, vocab_size=100, gated_mlp=True, norm="rmsnorm", positions="rotary")
    x = ActivationShape(b=1, s=S, s_kv=S, tp=1, sequence_parallel=False, elem_bytes=2, fused_attention=True)
    sbh = S * 4096
    expected = sbh * (2 + 2 + 2 + 2 * (8 / 32) * 2 + 2 + 2 + 2 + 2 * 3 * 14336 / 4096) + 4 * 32 * S
    assert layer_bytes(m, x, moe_layer=False, recompute="none") == pytest.approx(expected)


def test_transformer_engine_fp8_keeps_gemm_inputs_quantised():
    # The same Llama-style layer under a TE fp8 recipe (1 byte per kept GEMM input): the qkv input,
    # the MLP input and fc2's f-wide input drop from 2 to 1 byte per element, and the out-projection
    # keeps a 1-byte copy beside the core's 2-byte output: per s·b·h, -1 -1 -f/h +1 = -(1 + 14336/4096).
    m = ModelSpec(name="x", num_layers=1, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
                  num_kv_heads=8, vocab_size=100, gated_mlp=True, norm="rmsnorm", positions="rotary")
    bf16 = ActivationShape(b=1, s=S, s_kv=S, tp=1, sequence_parallel=False, elem_bytes=2, fused_attention=True)
    fp8 = ActivationShape(b=1, s=S, s_kv=S, tp=1, sequence_parallel=False, elem_bytes=2, fused_attention=True,
                          gemm_input_bytes=1.0)
    saved = layer_bytes(m, bf16, moe_layer=False, recompute="none") - layer_bytes(m, fp8, moe_layer=False,
                                                                                  recompute="none")
    assert saved == pytest.approx(S * 4096 * (1 + 14336 / 4096))


@pytest.mark.parametrize("autocast", [False, True])
def test_torch_runtime_dense_layer_by_hand(autocast):
    """llama3-8b's block at s = 1024, tp 8 with SP, bf16, tensor by tensor as eager PyTorch saves it
    (the counts the dry run lists): with FSDP2's mixed precision one gathered bf16 input for q/k/v
    and one for w1/w3; under autocast one cast per linear (3 + 2) and every weight's bf16 copy."""
    model = PRESETS["llama3-8b"]
    s, t, h, f = 1024, 8, model.hidden_size, model.ffn_hidden_size
    x = ActivationShape(b=1, s=s, s_kv=s, tp=t, sequence_parallel=True, elem_bytes=2, fused_attention=True,
                        eager=True, autocast=autocast)
    sbh = s * h
    norms = 2 * (2 * 4 * sbh / t)                       # two RMSNorms, two fp32 copies each, SP-split
    inputs = 2 * sbh * ((3 + 2) if autocast else 2)      # gathered full-sequence bf16 linear inputs
    qkv = 2 * s * (model.q_dim + 2 * model.kv_dim) / t   # after rotary
    rotary = 2 * 4 * s * model.d_head                    # fp32 cos and sin for q and for k
    lse = 4 * (model.num_attention_heads / t) * s
    out = 2 * s * model.q_dim / t
    mlp = 4 * 2 * s * f / t                              # gate, SiLU, up, product
    weights = 2 * (2 * h * model.q_dim + 2 * h * model.kv_dim + 3 * h * f) / t if autocast else 0
    expected = norms + inputs + qkv + rotary + lse + out + mlp + weights
    assert layer_bytes(model, x, moe_layer=False, recompute="none") == pytest.approx(expected)
    assert layer_bytes(model, x, moe_layer=False, recompute="full") == (4 if autocast else 2) * sbh / t



@pytest.mark.parametrize("autocast, residual_bytes", [(True, 4), (False, 2)])
def test_gpu_rms_norm_keeps_its_input_and_rstd(autocast, residual_bytes):
    """On a GPU ``FusedRmsNormBackward0`` saves the input as it comes (the fp32 stream under
    autocast, bf16 under FSDP2's mixed precision) and one fp32 rstd per token: llama3-8b's norm at
    s = 1024, b = 2, tp 8 with SP: B_res·s·b·h/8 + 4·s·b/8; the CPU's composite keeps two fp32
    copies, 8·s·b·h/8. A dense layer holds two norms, so it differs by twice that."""
    from costmodels.activations import torch_dense_layer_bytes, torch_norm_bytes

    model = PRESETS["llama3-8b"]
    s, b, t, h = 1024, 2, 8, model.hidden_size
    kw = dict(b=b, s=s, s_kv=s, tp=t, sequence_parallel=True, elem_bytes=2, fused_attention=True, eager=True,
              autocast=autocast)
    gpu, cpu = ActivationShape(**kw, fused_rms_norm=True), ActivationShape(**kw)
    assert torch_norm_bytes(model, gpu) == residual_bytes * s * b * h / t + 4 * s * b / t
    assert torch_norm_bytes(model, cpu) == 2 * 4 * s * b * h / t
    difference = torch_dense_layer_bytes(model, cpu, core=True) - torch_dense_layer_bytes(model, gpu, core=True)
    assert difference == pytest.approx(2 * ((8 - residual_bytes) * s * b * h / t - 4 * s * b / t))

def test_moe_routed_copies_are_the_experts_input_and_output():
    # E 8, k 2, h 1024, expert f 512, no shared expert, b 1, s 1024, tp 1, dropless balanced routing.
    # The 2·1024 routed token copies are kept twice: the experts' first GEMM input (2 bytes in bf16,
    # 1 under a TE fp8 recipe) and their output for the combine (2 bytes): (2 + 2) or (1 + 2) x
    # 2048 x 1024; the fp8 layer also keeps its router input and the experts' fc2 input at 1 byte.
    from costmodels.activations import moe_block_bytes
    from costmodels.model_spec import MoESpec

    m = ModelSpec(name="moe", num_layers=1, hidden_size=1024, ffn_hidden_size=4096, num_attention_heads=8,
                  num_kv_heads=8, vocab_size=100, gated_mlp=True, norm="rmsnorm", positions="rotary",
                  moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=512))
    bf16 = ActivationShape(b=1, s=1024, s_kv=1024, tp=1, sequence_parallel=False, elem_bytes=2, fused_attention=True)
    fp8 = ActivationShape(b=1, s=1024, s_kv=1024, tp=1, sequence_parallel=False, elem_bytes=2, fused_attention=True,
                          gemm_input_bytes=1.0)
    router = 4 * 1024 * 8
    norm_and_input = (2 + 2) * 1024 * 1024, (2 + 1) * 1024 * 1024
    experts = 2048 * (2 * 2 * 512 + 2 * 512), 2048 * (2 * 2 * 512 + 1 * 512)
    routed = (2 + 2) * 2048 * 1024, (1 + 2) * 2048 * 1024
    for i, x in enumerate((bf16, fp8)):
        assert moe_block_bytes(m, x) == router + norm_and_input[i] + experts[i] + routed[i]
