"""Activation memory saved for backward, per layer and per micro-batch, on one rank (bytes).

Op-level derivation of Korthikanti et al., "Reducing Activation Recomputation in Large
Transformer Models" (2022), Sec. 4.1, generalised per tensor so that GQA, gated MLPs, fused
attention and the absence of dropout change the count (with a GPT block, 4h MLP, MHA, dropout and
eager attention it reproduces s·b·h·(34 + 5·a·s/h) exactly; with TP it gives
s·b·h·(10 + 24/t + 5·a·s/(h·t)), with TP+SP s·b·h·(34/t + 5·a·s/(h·t)), and with selective
recomputation s·b·h·34/t).

Symbols: B bytes per activation element (2 for 16-bit, 4 for fp32), masks 1 byte,
s local sequence length (s/cp), b micro-batch, t tensor-parallel degree, r = 1/t with sequence
parallel else 1 (norms, dropout and block inputs are split only with SP).

Under a convention with ``eager_activations`` (FSDP2, ``autoplan launch``'s job, eager PyTorch)
dense layers count what autograd saves there instead (``torch_dense_layer_bytes``, measured
tensor by tensor with saved-tensor hooks on the job's own step): the input of each
column-parallel linear is the all-gathered full sequence (``PrepareModuleInput`` then
``ColwiseParallel`` save it, unlike Megatron's SP, which re-gathers in backward), RMSNorm keeps
its input on a GPU (the fused kernel) and two fp32 copies on the CPU (the composite,
``torch_norm_bytes``), and the loss keeps fp32 logits over the whole vocabulary on every TP
rank. Under ``torch.autocast`` (the job's mixed precision when there is no data parallelism) the
residual stream stays fp32, each linear saves its own 16-bit cast of its input, and the 16-bit
copy of every weight is kept per micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass

from .flops import kv_per_rank
from .model_spec import ModelSpec
from .moe_costs import expert_capacity
from .op_sac import op_sac_layer_bytes
from .params import attention_params, mlp_params

MASK_BYTES = 1
LSE_BYTES = 4
GATED_MLP_TENSORS = 4
"""f-wide tensors a gated MLP keeps per token in eager PyTorch (see ``torch_dense_layer_bytes``)."""
MEGATRON_GATED_MLP_TENSORS = 3
"""f-wide tensors a gated MLP keeps per token under Megatron-Core's fused SwiGLU (``mlp_block_bytes``)."""
LOGITS_BYTES = 4
FP32_BYTES = 4
INDEX_BYTES = 8
"""int64 indices (top-k choices, gather/scatter rows)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ActivationShape:
    """What one rank processes: micro-batch, local sequence, key length, parallel split."""

    b: int
    s: int
    """Local query tokens per sequence (s / cp)."""
    s_kv: int
    """Key/value length attended to per query block (s / cp for fused ring attention, s for eager)."""
    tp: int
    sequence_parallel: bool
    elem_bytes: int
    fused_attention: bool
    eager: bool = False
    """``RuntimeConvention.eager_activations``: count what eager PyTorch saves (else Korthikanti's count)."""
    autocast: bool = False
    """Eager only: mixed precision by ``torch.autocast`` (fp32 residual stream)."""
    expert_tp: int = 0
    """Tensor-parallel degree of the routed experts (Megatron ``--expert-tensor-parallel-size``);
    0 = the attention's ``tp``."""
    gemm_input_bytes: float = 0.0
    """Non-eager only: bytes per element of a low-precision GEMM input kept for backward
    (``precision.saved_gemm_input_bytes``); 0 = ``elem_bytes``."""
    loss_parallel: bool = False
    """Eager only: the loss reads vocabulary-sharded logits (``RuntimeConvention.loss_parallel``)."""
    fused_loss: bool = False
    """Non-eager only: the loss is Transformer Engine's fused cross-entropy, which keeps the 16-bit
    logits as its saved gradient (``RuntimeConvention.fused_cross_entropy``)."""
    gathered_kv: int = 0
    """All-gather context parallelism: K/V tokens per sequence gathered from the other cp ranks and
    kept for backward, (cp - 1)·s/cp (0 for ring attention or cp = 1)."""
    fused_rms_norm: bool = False
    """Eager only: ``nn.RMSNorm`` runs as PyTorch's fused kernel ``aten::_fused_rms_norm``, which
    the CUDA (and ROCm) builds register; on the CPU it decomposes into the composite
    (``torch_norm_bytes``)."""

    @property
    def r(self) -> float:
        return 1.0 / self.tp if self.sequence_parallel else 1.0

    @property
    def gi(self) -> float:
        """Bytes per kept GEMM-input element (``gemm_input_bytes``, else ``elem_bytes``)."""
        return self.gemm_input_bytes or self.elem_bytes

    @property
    def etp(self) -> int:
        return self.expert_tp or self.tp


def attention_core_bytes(model: ModelSpec, x: ActivationShape) -> float:
    """Scores, softmax and dropout tensors: B·b·(a/t)·s·s_kv (+ mask and dropout output), or the
    fp32 log-sum-exp of a fused kernel. This is what selective recomputation drops."""
    heads = model.num_attention_heads / x.tp
    if x.fused_attention:
        return LSE_BYTES * x.b * heads * x.s
    scores = x.b * heads * x.s * x.s_kv
    if model.dropout:
        return scores * (2 * x.elem_bytes + MASK_BYTES)
    return scores * x.elem_bytes


def attention_block_bytes(model: ModelSpec, x: ActivationShape) -> float:
    """Attention half without its core: norm input, qkv input, Q, K, V, out-proj input, dropout mask.
    With a low-precision recipe under Transformer Engine the qkv projection keeps its quantised
    input (``ActivationShape.gi`` bytes) and the out-projection its quantised copy of the core's
    output beside the 16-bit output the fused core keeps for its own backward (B + gi)."""
    B, sbh = x.elem_bytes, x.s * x.b * model.hidden_size
    q, kv = model.q_dim / x.tp, kv_per_rank(model, x.tp)
    norm_input = B * sbh * x.r
    qkv_input = x.gi * sbh * x.r
    q_k_v = B * x.s * x.b * (q + 2 * kv)
    out_input = (B + (x.gi if x.gi != B else 0.0)) * x.s * x.b * q
    mask = MASK_BYTES * sbh * x.r if model.dropout else 0.0
    return norm_input + qkv_input + q_k_v + out_input + mask


def mla_block_bytes(model: ModelSpec, x: ActivationShape, *, recompute_up: bool) -> float:
    """MLA half without its core (DeepSeek-V2 Sec. 2.1), per tensor: norm input and the
    down-projections' input (h); the latents as their RMSNorms receive them (d_c' + d_c) and the
    shared rotary key (d_h^R); the normalised latents the up-projections read (d_c' + d_c); the
    core's Q, K, V, a/t·(2·(d_h + d_h^R) + d_v); the output projection's input a/t·d_v.

    ``recompute_up`` (DeepSeek-V3 Sec. 3.2.3, "recomputation of RMSNorm and MLA up-projection";
    Megatron ``--recompute-modules mla_up_proj``): the latent norms and up-projections rerun in
    backward, so the normalised latents and Q, K, V are not kept. Down-projections are replicated
    over tp (Megatron-Core), so the latents are not split."""
    m = model.mla
    assert m is not None
    B, sb = x.elem_bytes, x.s * x.b
    heads = model.num_attention_heads / x.tp
    norm_input = B * sb * model.hidden_size * x.r
    down_input = B * sb * model.hidden_size * x.r
    latents = B * sb * (m.q_lora_rank + m.kv_lora_rank)
    rope_key = B * sb * m.qk_rope_head_dim
    out_input = B * sb * heads * m.v_head_dim
    mask = MASK_BYTES * sb * model.hidden_size * x.r if model.dropout else 0.0
    kept = norm_input + down_input + latents + rope_key + out_input + mask
    if recompute_up:
        return kept
    q_k_v = B * sb * heads * (2 * m.qk_head_dim + m.v_head_dim)
    return kept + latents + q_k_v


def mlp_block_bytes(model: ModelSpec, x: ActivationShape, ffn_hidden: int, tokens_factor: float = 1.0,
                    split: int = 0) -> float:
    """MLP half (Megatron-Core): input (and its norm), then f/t elements per token of the
    activation's input (plain: fc1's GeLU input; gated: fc1's 2·f/t output, the gate and up halves
    Megatron's fused SwiGLU saves, recomputing the SiLU in backward:
    ``megatron/core/fusions/fused_bias_swiglu.py``, ``SwiGLUFunction`` saves only its input) and
    the f/t-wide input of fc2: 2·f/t plain, 3·f/t gated (eager PyTorch keeps 4, see
    ``torch_dense_layer_bytes``). Under Transformer Engine a low-precision recipe keeps fc1's and
    fc2's inputs quantised (``ActivationShape.gi`` bytes). ``split`` is the tensor-parallel degree
    of this MLP (0 = tp; routed experts use expert tp)."""
    B, sbh = x.elem_bytes, x.s * x.b * model.hidden_size
    f = ffn_hidden / (split or x.tp)
    activation_input = (MEGATRON_GATED_MLP_TENSORS - 1 if model.gated_mlp else 1) * f
    inner = (B * activation_input + x.gi * f) * x.s * x.b * tokens_factor
    norm_input = B * sbh * x.r
    mlp_input = x.gi * sbh * x.r
    mask = MASK_BYTES * sbh * x.r if model.dropout else 0.0
    return norm_input + mlp_input + inner + mask


def moe_block_bytes(model: ModelSpec, x: ActivationShape) -> float:
    """MoE half: router logits (fp32), dispatched token copies (top-k × the busiest rank's token
    factor, ``MoESpec.busiest_token_factor``), expert MLPs split over expert tp, shared experts.
    Tokens routed to a rank's experts equal its own tokens × k on average; the busiest rank, which
    sets the peak, holds ``busiest_token_factor`` times that. Of the routed copies, the permuted
    tokens are the experts' first GEMM input (kept quantised, ``ActivationShape.gi`` bytes, under a
    Transformer Engine low-precision recipe) and the experts' outputs are kept 16-bit for the
    combine's gradient with respect to the routing probabilities (Megatron-Core
    ``moe_utils.permute`` / ``unpermute``)."""
    moe = model.moe
    assert moe is not None
    tokens = x.s * x.b * x.r
    router = LOGITS_BYTES * tokens * moe.num_experts
    routed = moe.top_k * moe.busiest_token_factor
    dispatched = (x.gi + x.elem_bytes) * tokens * routed * model.hidden_size  # experts' input and output
    experts = mlp_block_bytes(model, x, moe.expert_ffn_hidden_size, tokens_factor=routed * x.r, split=x.etp)
    shared = 0.0
    if moe.num_shared_experts:
        shared = mlp_block_bytes(model, x, moe.shared_ffn_hidden_size)
        shared -= (x.elem_bytes + x.gi) * x.s * x.b * model.hidden_size * x.r  # input and norm counted once
    return router + dispatched + experts + shared


def residual_bytes(x: ActivationShape) -> int:
    """Bytes per element of the residual stream: fp32 under autocast, else the compute dtype."""
    return FP32_BYTES if x.autocast else x.elem_bytes


def received_input_bytes(model: ModelSpec, x: ActivationShape) -> float:
    """One micro-batch's stage input as a pipeline rank receives it: the residual stream,
    split on the sequence with SP (r·s·b·h elements)."""
    return residual_bytes(x) * x.s * x.b * model.hidden_size * x.r


def torch_received_input_saved_bytes(model: ModelSpec, x: ActivationShape, recompute: str) -> float:
    """Of one micro-batch's stored activations on a receiving stage, the bytes that are the receive
    buffer itself (torch runtime): the checkpoint input of a recomputed first layer, or the
    tensor its norm saves when that is the input as received (LayerNorm, or RMSNorm on an fp32
    stream). ``torch.distributed.pipelining`` allocates and keeps those buffers (one per
    micro-batch, ``PipelineStage.args_recv_info``), so they are counted as buffers, not here."""
    if recompute == "full" or model.norm == "layernorm" or residual_bytes(x) == FP32_BYTES:
        return received_input_bytes(model, x)
    return 0.0


def torch_norm_bytes(model: ModelSpec, x: ActivationShape) -> float:
    """One norm of the residual stream in eager PyTorch, per micro-batch.

    RMSNorm (``nn.RMSNorm`` -> ``F.rms_norm`` -> ``aten::_fused_rms_norm``,
    aten/src/ATen/native/layer_norm.cpp ``rms_norm_symint``): on a GPU the fused kernel's autograd
    node ``FusedRmsNormBackward0`` saves its input as it comes (the residual stream, B_res =
    ``residual_bytes``) and the fp32 reciprocal RMS, one per token (plus the weight, a parameter):
    B_res·s·b·h·r + 4·s·b·r. The job's norms take the stream with weights of its dtype (fp32 both
    under autocast, 16-bit both under FSDP2's mixed precision), so none falls back to the composite
    for a dtype mismatch. On the CPU ``_fused_rms_norm`` is CompositeImplicitAutograd: its
    composite saves the fp32 upcast input and the fp32 normalised tensor, 2·4·s·b·h·r (its
    s·b-sized rstd left out). The 2026-11-26 H100 records (``benchmarks/data/gpu``) show the
    fused count: with it the saved-tensor terms are within 1% of the job's probe on all 19
    layouts; with the composite's they were 0.5-10% over (7.6% median; least under full
    recomputation, which keeps one norm).

    LayerNorm saves its input (its fp32 mean and rstd are s·b-sized)."""
    sb, h = x.s * x.b * x.r, model.hidden_size
    if model.norm != "rmsnorm":
        return residual_bytes(x) * sb * h
    if x.fused_rms_norm:
        return residual_bytes(x) * sb * h + FP32_BYTES * sb
    return 2 * FP32_BYTES * sb * h


def torch_dense_layer_bytes(model: ModelSpec, x: ActivationShape, *, core: bool) -> float:
    """One dense layer of the torch runtime, one micro-batch, tensor by tensor (what
    ``saved_tensors_hooks`` see in the job's step): two norms; the full-sequence input of q/k/v and
    of the MLP's first projections (once each, or once per linear under autocast, which casts
    per call); Q, K, V after rotary and rotary's fp32 cos/sin; the attention core (``core``);
    the out-projection input; the MLP's 4·f/t (gated) or 2·f/t tensors; under autocast the
    16-bit copy of every weight of the layer (B·(attention + MLP params)/t)."""
    B, sbh = x.elem_bytes, x.s * x.b * model.hidden_size
    q, kv, f = model.q_dim / x.tp, kv_per_rank(model, x.tp), model.ffn_hidden_size / x.tp
    qkv_copies = 3 if x.autocast else 1
    mlp_copies = (2 if model.gated_mlp else 1) if x.autocast else 1
    inputs = B * sbh * (qkv_copies + mlp_copies)
    q_k_v = B * x.s * x.b * (q + 2 * kv)
    rotary = 2 * FP32_BYTES * x.s * model.d_head if model.positions == "rotary" else 0.0
    out_input = B * x.s * x.b * q
    inner = B * x.s * x.b * (GATED_MLP_TENSORS if model.gated_mlp else 2) * f
    masks = 2 * MASK_BYTES * sbh * x.r if model.dropout else 0.0
    weights = B * (attention_params(model) + mlp_params(model, model.ffn_hidden_size)) / x.tp if x.autocast else 0.0
    attention_core = attention_core_bytes(model, x) if core else 0.0
    return (2 * torch_norm_bytes(model, x) + inputs + q_k_v + rotary + attention_core + out_input + inner
            + masks + weights)


def layer_bytes(model: ModelSpec, x: ActivationShape, *, moe_layer: bool, recompute: str) -> float:
    """Bytes one layer keeps for backward for one micro-batch under ``recompute``.

    none: everything; selective: all but the attention core (and with MLA its up-projections, as
    DeepSeek-V3 trains); op-sac: torchtitan's op-level checkpoint of a dense block
    (``op_sac.op_sac_layer_bytes``; the layers of MoE and MLA models keep everything, an upper
    bound: their grouped expert and latent matmuls are not the plain ``aten.mm`` calls the policy
    counts, which shifts the count's parity);
    full: the layer input only (s·b·h·r elements, the checkpoint). MLA layers use Korthikanti's count under both runtimes; eager (the torch runtime) counts what
    autograd saves for dense and MoE layers. A sliding window changes nothing here:
    a fused kernel keeps Q, K, V, its output and the log-sum-exp whatever the window, and eager
    attention materialises the whole masked s×s score matrix.
    """
    if recompute == "full":
        return residual_bytes(x) * x.s * x.b * model.hidden_size * x.r
    if recompute == "op-sac" and model.moe is None and model.mla is None:
        return op_sac_layer_bytes(model, b=x.b, s=x.s, tp=x.tp, sequence_parallel=x.sequence_parallel,
                                  elem_bytes=x.elem_bytes, input_bytes=residual_bytes(x)) + gathered_kv_bytes(model, x)
    if x.eager and model.mla is None:
        layer = torch_moe_layer_bytes if moe_layer else torch_dense_layer_bytes
        return layer(model, x, core=recompute != "selective") + gathered_kv_bytes(model, x)  # op-sac: all kept
    mlp = moe_block_bytes(model, x) if moe_layer else mlp_block_bytes(model, x, model.ffn_hidden_size)
    core = 0.0 if recompute == "selective" else attention_core_bytes(model, x)  # op-sac on MoE/MLA: all kept
    if model.mla is not None:
        return mla_block_bytes(model, x, recompute_up=recompute == "selective") + core + mlp + gathered_kv_bytes(model, x)
    return attention_block_bytes(model, x) + core + mlp + gathered_kv_bytes(model, x)


def gathered_kv_bytes(model: ModelSpec, x: ActivationShape) -> float:
    """All-gather context parallelism (Llama 3, Dubey et al. 2024, Sec. 3.3.2): the attention keeps
    K and V of the whole sequence for backward, of which the local s/cp are counted with Q, K, V
    already; the extra is 2·B·b·((cp-1)·s/cp)·kv/t, plus the s/cp × s causal mask by global
    position (1 byte per element, shared by the batch and the heads)."""
    if x.gathered_kv == 0:
        return 0.0
    kv = 2 * x.elem_bytes * x.b * x.gathered_kv * kv_per_rank(model, x.tp)
    mask = MASK_BYTES * x.s * (x.s + x.gathered_kv)
    return kv + mask


def torch_moe_layer_bytes(model: ModelSpec, x: ActivationShape, *, core: bool) -> float:
    """One MoE layer of the torch runtime (``planner/launch/torchjob/experts.py``), tensor by tensor: the
    attention half as in a dense layer, the router reading the MLP's input; the router's fp32
    probabilities and the k renormalised weights (fp32), the int64 top-k choices, slot indices
    and the token of each slot; the slot buffer of E·b·C token copies the experts read (C = ceil(cf·k·s/E) slots
    per sequence, GShard Sec. 2.2; whole on every tp rank), the experts' 4·f/t (gated) or 2·f/t
    tensors per slot (experts split by FFN width over tp); the k outputs gathered back per token and their weights."""
    moe = model.moe
    assert moe is not None
    B, tokens, k, e = x.elem_bytes, x.s * x.b, moe.top_k, moe.num_experts
    dense_mlp = B * tokens * (GATED_MLP_TENSORS if model.gated_mlp else 2) * model.ffn_hidden_size / x.tp
    slots = e * x.b * expert_capacity(x.s, e, k, moe.capacity_factor)
    routing = FP32_BYTES * tokens * (e + k) + 2 * INDEX_BYTES * tokens * k + INDEX_BYTES * slots
    f = moe.expert_ffn_hidden_size / x.tp
    experts = B * slots * (model.hidden_size + (GATED_MLP_TENSORS if model.gated_mlp else 2) * f)
    combine = B * tokens * k * (model.hidden_size + 1)
    shared = 0.0
    if moe.num_shared_experts:
        f_shared = moe.shared_ffn_hidden_size / x.tp
        shared = B * tokens * (GATED_MLP_TENSORS if model.gated_mlp else 2) * f_shared
    layer = torch_dense_layer_bytes(model, x, core=core) - dense_mlp
    return layer + routing + experts + combine + shared + _torch_moe_autocast_bytes(model, x, slots)


def _torch_moe_autocast_bytes(model: ModelSpec, x: ActivationShape, slots: int) -> float:
    """Under ``torch.autocast`` (only without data parallelism, so no ep): what an MoE layer's casts
    keep beyond a dense layer's: each expert matmul reading the slots saves its own 16-bit copy
    (2 gated, 1 plain; the dense count has one), the router one copy of the input (the dense count
    has one per MLP input projection), and the 16-bit copies of the router and expert weights in
    place of the dense MLP's."""
    if not x.autocast:
        return 0.0
    moe = model.moe
    assert moe is not None
    B, sbh, t = x.elem_bytes, x.s * x.b * model.hidden_size, x.tp
    reads = 2 if model.gated_mlp else 1
    slot_copies = B * slots * model.hidden_size * (reads - 1)
    input_copies = -B * sbh * (reads - 1)
    weights = B * (moe.num_experts * mlp_params(model, moe.expert_ffn_hidden_size) / t
                   + moe.num_experts * model.hidden_size - mlp_params(model, model.ffn_hidden_size) / t)
    return slot_copies + input_copies + weights


def first_stage_extra_bytes(model: ModelSpec, x: ActivationShape) -> float:
    """Embedding dropout mask on the first stage (Korthikanti et al. Sec. 4.2), zero without dropout."""
    return MASK_BYTES * x.s * x.b * model.hidden_size * x.r if model.dropout else 0.0


def last_stage_extra_bytes(model: ModelSpec, x: ActivationShape) -> float:
    """Final norm input, output-projection input and fp32 logits 4·s·b·V/t on the last stage.

    Eager (FSDP2's job): the final norm, the gathered full-sequence head input, fp32 logits over the
    whole vocabulary (the head's output is gathered before the loss; V/t with
    ``ActivationShape.loss_parallel``) and under autocast the head weight's 16-bit copy."""
    sbh = x.s * x.b * model.hidden_size
    if x.eager:
        head_weight = x.elem_bytes * model.vocab_size * model.hidden_size / x.tp if x.autocast else 0.0
        return torch_norm_bytes(model, x) + x.elem_bytes * sbh + last_stage_logits_bytes(model, x) + head_weight
    return 2 * x.elem_bytes * sbh * x.r + last_stage_logits_bytes(model, x)


def last_stage_logits_bytes(model: ModelSpec, x: ActivationShape) -> float:
    """Of ``last_stage_extra_bytes``, the logits the loss keeps for backward: fp32, 4·s·b·V/t (eager:
    4·``eager_logits``); under Transformer Engine's fused cross-entropy (``ActivationShape.fused_loss``)
    the 16-bit logits themselves, B·s·b·V/t, into which its forward writes their gradient
    (``transformer_engine/pytorch/triton/cross_entropy.py``, ``cross_entropy_forward``)."""
    if x.eager:
        return LOGITS_BYTES * eager_logits(model, x)
    logit_bytes = x.elem_bytes if x.fused_loss else LOGITS_BYTES
    return logit_bytes * x.s * x.b * model.vocab_size / x.tp


def eager_logits(model: ModelSpec, x: ActivationShape) -> float:
    """Logits one rank's eager loss reads for one micro-batch: s·b·V, or s·b·V/t when the loss is
    vocabulary-parallel (``ActivationShape.loss_parallel``)."""
    return x.s * x.b * model.vocab_size / (x.tp if x.loss_parallel else 1)


def eager_loss_working_bytes(model: ModelSpec, x: ActivationShape) -> float:
    """Eager PyTorch's cross-entropy backward beyond the fp32 log-softmax output it keeps
    (``last_stage_extra_bytes``), at its largest: k·4 bytes per logit (``eager_logits``), k fp32
    tensors of the logits' size live at once beside the kept output (``loss_backward_tensors``).
    0 for Megatron's fused vocabulary-parallel loss, whose backward overwrites the kept softmax
    in place."""
    return loss_backward_tensors(x) * LOGITS_BYTES * eager_logits(model, x) if x.eager else 0.0


def loss_backward_tensors(x: ActivationShape) -> int:
    """fp32 logits-sized tensors an eager cross-entropy backward holds at once beside the kept
    log-softmax output (a count, per micro-batch).

    Plain (``F.cross_entropy`` is ``log_softmax`` then ``nll_loss``, torch/nn/functional.py):
    ``nll_loss``'s backward allocates a zero gradient and ``_log_softmax_backward_data`` a second
    tensor for its result: 2.
    Vocabulary-parallel (``ActivationShape.loss_parallel``, only under tp > 1 as torchtitan's
    ``ParallelDims.loss_parallel_enabled``): DTensor's handler fuses both backwards
    (torch/distributed/tensor/parallel/loss.py, ``_nll_loss_and_log_softmax_backward``), whose
    ``grad_input = torch.zeros_like(x)`` stays referenced while it returns
    ``(grad_input + torch.exp(x)) * grad_output``: the zeros, ``exp(x)`` and their sum are live at
    the add, the zeros, the sum and the product at the multiply: 3."""
    return 3 if x.loss_parallel and x.tp > 1 else 2


def loss_working_bytes(model: ModelSpec, x: ActivationShape) -> float:
    """What the loss allocates beyond the fp32 logits it keeps (``last_stage_logits_bytes``), at
    its largest. Eager: ``eager_loss_working_bytes``. Megatron's vocabulary-parallel loss: the
    output layer's 16-bit logits (2 bytes per logit, alive until the cast) and their fp32 copy
    (``logits.float()`` before ``vocab_parallel_cross_entropy``, 4 bytes), beside the kept fp32
    ``logits - max`` it exponentiates in place (NVIDIA/Megatron-LM
    ``megatron/core/tensor_parallel/cross_entropy.py``, ``_VocabParallelCrossEntropy.forward``;
    the caller's ``.float()`` in ``megatron/core/models/common/language_module/language_module.py``
    ``compute_language_model_loss``): (2 + 4)·s·b·V/t."""
    if x.eager:
        return eager_loss_working_bytes(model, x)
    if x.fused_loss:
        return fused_loss_working_bytes(x)
    return (x.elem_bytes + LOGITS_BYTES) * x.s * x.b * model.vocab_size / x.tp


def fused_loss_working_bytes(x: ActivationShape) -> float:
    """What Transformer Engine's fused cross-entropy allocates beside the 16-bit logits it keeps, per
    row (token) of the logits: the fp32 unreduced loss, this rank's fp32 (max, sum, target logit)
    triple and, under tp, the triples all-gathered from the t ranks (NVIDIA/TransformerEngine
    ``transformer_engine/pytorch/triton/cross_entropy.py``, ``cross_entropy_forward``: ``loss_1d``,
    ``m_d_X_y``, ``m_d_X_y_gathered``): 4·s·b·(1 + 3 + 3·t) with t > 1, else 4·s·b·(1 + 3)."""
    rows = x.s * x.b
    loss = LOGITS_BYTES * rows
    triple = 3 * LOGITS_BYTES * rows
    gathered = triple * x.tp if x.tp > 1 else 0.0
    return loss + triple + gathered


def largest_block_bytes(model: ModelSpec, x: ActivationShape, *, last: bool) -> float:
    """The largest single tensor a rank allocates and frees every micro-batch: one logits tensor
    the loss keeps on the last stage (``last_stage_logits_bytes``), else a layer's
    MLP intermediate (B·s·b·f/t; the gated MLP's two halves are allocated apart)."""
    mlp = x.elem_bytes * x.s * x.b * model.ffn_hidden_size / x.tp
    if not last:
        return mlp
    return max(mlp, last_stage_logits_bytes(model, x))


def mtp_bytes(model: ModelSpec, x: ActivationShape, *, recompute: str) -> float:
    """What the MTP modules keep on the last stage (DeepSeek-V3 Sec. 2.2): per module its block
    (as ``layer_bytes``), the two norm inputs and the 2h-wide projection input (4·B·s·b·h·r), and the
    shared head's input and fp32 logits (as ``last_stage_extra_bytes``)."""
    if not model.num_mtp_layers:
        return 0.0
    moe_layer = model.is_moe_layer(model.num_layers - 1)
    block = layer_bytes(model, x, moe_layer=moe_layer, recompute=recompute)
    inputs = 4 * x.elem_bytes * x.s * x.b * model.hidden_size * x.r
    return model.num_mtp_layers * (block + inputs + last_stage_extra_bytes(model, x))
