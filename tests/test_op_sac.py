"""Op-level selective checkpointing (torchtitan's ``selective_ac_option = "op"``) and the eager
loss's working set, against hand-worked values for Llama 3 8B (h 4096, q 4096, kv 1024, f 14336,
32 heads, V 128256)."""

import pytest

import planner
from costmodels.activations import ActivationShape, eager_loss_working_bytes, layer_bytes
from costmodels.op_sac import op_sac_layer_bytes, op_sac_recompute_flops, recomputed_gemm_share, saved_matmuls
from costmodels.presets import PRESETS

LLAMA = PRESETS["llama3-8b"]
S, B = 8192, 2


def test_saved_matmuls_are_the_odd_ones_in_call_order():
    """q, k, v, o, w1, w3, w2: the 1st, 3rd, 5th and 7th (q, v, w1, w2) are kept."""
    assert [name for name, _, _ in saved_matmuls(LLAMA, 1)] == ["q", "v", "w1", "w2"]


def test_op_sac_layer_bytes_by_hand():
    """tp 1, b 2, s 8192 (16384 tokens), bf16: input 2·16384·4096 = 134,217,728; kept matmul
    outputs 2·16384·(4096 + 1024 + 14336 + 4096) = 771,751,936; SDPA output 2·16384·4096 =
    134,217,728 and fp32 log-sum-exp 4·2·32·8192 = 2,097,152; total 1,042,284,544 bytes."""
    got = op_sac_layer_bytes(LLAMA, b=B, s=S, tp=1, sequence_parallel=False, elem_bytes=2, input_bytes=2)
    assert got == 1_042_284_544


def test_op_sac_layer_bytes_under_tp_and_sp_by_hand():
    """tp 8 with SP, b 1, s 8192: input 2·8192·4096/8 = 8,388,608; matmuls 2·8192·(512 + 128 +
    1792 + 4096) = 106,954,752 (w2's output is a full-width partial sum); SDPA 2·8192·512 =
    8,388,608 + 4·1·4·8192 = 131,072; two reduce-scatter outputs 2·2·8192·512 = 16,777,216;
    total 140,640,256 bytes."""
    got = op_sac_layer_bytes(LLAMA, b=1, s=S, tp=8, sequence_parallel=True, elem_bytes=2, input_bytes=2)
    assert got == 140_640_256


def test_layer_bytes_routes_op_sac_between_full_and_none():
    x = ActivationShape(b=B, s=S, s_kv=S, tp=1, sequence_parallel=False, elem_bytes=2, fused_attention=True,
                        eager=True)
    op = layer_bytes(LLAMA, x, moe_layer=False, recompute="op-sac")
    assert op == 1_042_284_544
    assert layer_bytes(LLAMA, x, moe_layer=False, recompute="full") < op < \
        layer_bytes(LLAMA, x, moe_layer=False, recompute="none")


def test_recomputed_share_and_flops_by_hand():
    """Dropped: k (h·kv), o (q·h), w3 (h·f) = 4096·(1024 + 4096 + 14336) = 79,691,776 weights of
    4096·(4096 + 2048 + 4096 + 43008) = 218,103,808: share 19456/53248; FLOPs 2 per weight per token
    per layer: 2·79,691,776·32 per token."""
    assert recomputed_gemm_share(LLAMA) == pytest.approx(19456 / 53248)
    assert op_sac_recompute_flops(LLAMA, 1) == 2 * 79_691_776 * 32


def test_eager_loss_working_set_by_hand():
    """nll_loss's and log_softmax's backward each allocate fp32 logits: 8 bytes per logit; 16384
    tokens x 128256 = 2,101,346,304 logits whole. A vocabulary-parallel loss reads 1/8 of them, and
    its fused backward (``_nll_loss_and_log_softmax_backward``: zeros, exp and their sum, then the
    sum and the product) holds three fp32 tensors at once: 12 bytes per logit. At tp 1 torchtitan
    runs the plain loss (``loss_parallel_enabled`` needs tp > 1)."""
    x = ActivationShape(b=B, s=S, s_kv=S, tp=8, sequence_parallel=True, elem_bytes=2, fused_attention=True,
                        eager=True)
    logits = B * S * 128256
    assert eager_loss_working_bytes(LLAMA, x) == 8 * logits
    from dataclasses import replace
    assert eager_loss_working_bytes(LLAMA, replace(x, loss_parallel=True)) == 12 * logits / 8
    assert eager_loss_working_bytes(LLAMA, replace(x, loss_parallel=True, tp=1, sequence_parallel=False)) == \
        8 * logits
    assert eager_loss_working_bytes(LLAMA, replace(x, eager=False)) == 0.0  # Megatron's fused loss


def _evaluate(recompute, runtime="torchtitan", tp=1):
    return planner.evaluate(model="llama3-8b", hardware="h100-hbm2e-96gb-500w", gpus=8, global_batch=16 // tp,
                            seq_len=S, runtime=runtime,
                            layout=planner.Layout(dp=8 // tp, tp=tp, zero_stage=3, micro_batch_size=2,
                                                  num_microbatches=1, recompute=recompute,
                                                  sequence_parallel=tp > 1))


def test_op_sac_costs_time_and_saves_memory_between_none_and_full():
    none, op, full = (_evaluate(r) for r in ("none", "op-sac", "full"))
    assert full.peak_memory_bytes < op.peak_memory_bytes < none.peak_memory_bytes
    assert none.recompute_s == 0 < op.recompute_s < full.recompute_s
    # the HFU counts the dropped matmuls: hardware - model FLOPs = the op-SAC recompute FLOPs
    assert op.hardware_flops_per_step - op.model_flops_per_step == pytest.approx(op_sac_recompute_flops(LLAMA, 16 * S))


def test_torchtitan_loss_parallel_holds_a_tp_share_of_the_logits():
    """Same layout at tp 2: the torch job gathers the logits and holds (4 kept + 8 working) bytes per
    logit, torchtitan keeps V/2 per rank and holds (4 kept + 12 working) bytes per logit (its fused
    vocabulary-parallel backward); the difference on the last rank is 12·2 − 16 = 8 bytes x half
    the logits of a micro-batch."""
    torch_job, titan = _evaluate("op-sac", "torch", tp=2), _evaluate("op-sac", "torchtitan", tp=2)
    half = B * S * 128256 / 2
    assert torch_job.peak_stage.activations_bytes - titan.peak_stage.activations_bytes == pytest.approx(8 * half)


def test_fused_cross_entropy_keeps_the_16bit_logits_by_hand():
    """Transformer Engine's fused cross-entropy (Megatron-Bridge's loss) writes the gradient into the
    bf16 logits and keeps them: 2 bytes per logit, against Megatron's unfused loss, which keeps
    fp32 logits (4) and allocates their bf16 and fp32 copies beside them (2 + 4). tp 8, b 2,
    s 8192: 16384 rows x 128256 / 8 = 262,668,288 logits per rank; the fused loss's working set
    is 4 bytes per row for the loss, 3·4 for this rank's triple, 3·4·8 for the gathered ones:
    16384·(4 + 12 + 96) = 1,835,008 bytes."""
    from dataclasses import replace

    from costmodels.activations import largest_block_bytes, last_stage_logits_bytes, loss_working_bytes

    x = ActivationShape(b=B, s=S, s_kv=S, tp=8, sequence_parallel=True, elem_bytes=2, fused_attention=True)
    fused = replace(x, fused_loss=True)
    logits = B * S * 128256 // 8
    assert last_stage_logits_bytes(LLAMA, x) == 4 * logits
    assert loss_working_bytes(LLAMA, x) == 6 * logits
    assert last_stage_logits_bytes(LLAMA, fused) == 2 * logits
    assert loss_working_bytes(LLAMA, fused) == 1_835_008
    assert largest_block_bytes(LLAMA, fused, last=True) == 2 * logits


def test_megatron_bridge_runs_the_fused_loss_and_megatron_does_not():
    """The NeMo performance recipes' loss (``RuntimeConvention.fused_cross_entropy``) reaches the
    activation shape: one tp 1 rank of Llama 3 8B at b 2, s 8192 keeps 2 instead of 4 bytes per
    logit and drops the unfused loss's 6 bytes per logit of working set, so its peak is at least
    (2 + 6)·16384·128256 bytes below Megatron-LM's (less the fused loss's few bytes per row)."""
    def peak(runtime):
        return planner.evaluate(model="llama3-8b", hardware="h100-hbm2e-96gb-500w", gpus=8, global_batch=16,
                                seq_len=S, runtime=runtime,
                                layout=planner.Layout(dp=8, micro_batch_size=2, zero_stage=1,
                                                      num_microbatches=1)).peak_stage

    bridge, megatron = peak("megatron-bridge"), peak("megatron")
    logits = B * S * 128256
    saved = (megatron.activations_bytes - bridge.activations_bytes)
    assert saved == pytest.approx(8 * logits - 16 * B * S, rel=1e-9)
