"""``RuntimeConvention``: how the implementation that runs a plan holds and syncs its model, as
the cost model needs it (bytes per state element, which data-parallel collectives run per
micro-batch or per step at each ZeRO stage, the buffers it keeps, the activations it saves).

The cost model asks a convention and never branches on a runtime name. ``MEGATRON`` (the
default) and the conventions derived from it are defined here; ``costmodels.runtimes`` adds the
FSDP2 convention of ``autoplan launch``'s job and maps every runtime name to its convention.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True, kw_only=True)
class ZeroStageRule:
    """How one runtime runs one ZeRO stage (Rajbhandari et al., SC'20, Sec. 5)."""

    sharded_stage: int
    """The ZeRO paper stage whose sharding the held states follow: 1 shards optimizer states,
    2 also gradients, 3 also parameters; 0 shards nothing."""
    reshard_after_forward: bool
    """Gathered parameters are freed after forward and gathered again for backward."""
    keeps_gathered_until_reduce: bool = False
    """Gathered parameters are freed after backward only on the micro-batch that reduces
    gradients (FSDP2 ``set_reshard_after_backward``), so they stay gathered in between."""
    reduce_every_microbatch: bool
    """Gradients are reduced after every micro-batch (else once, after the last one)."""
    gathers_per_microbatch: int
    """Parameter all-gathers per micro-batch without pipelining; 0 = one per step."""
    bucketed: bool
    """Data-parallel collectives are issued in gradient buckets of ``dp_bucket_bytes`` (else one
    piece per FSDP unit: each block, plus the root)."""
    bucket_buffers: bool
    """The gradient buffers are two communication buckets (Megatron's DDP), not the gradients of
    the parameters themselves."""
    pipelined_reduces_once: bool = False
    """With pp > 1 this stage reduces once per step although it reduces every micro-batch without
    pipelining (ZeRO-2: DeepSpeed's pipeline engine allows only ZeRO-1; MegaScale, Jiang et al.
    NSDI'24, Sec. 3.1, reduce-scatters once, in the last micro-batch's backward)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeConvention:
    """One runtime's way of holding model states, syncing data parallelism and saving
    activations; each field is a behaviour the cost model counts."""

    runtime: str
    """``TrainingSpec.runtime`` this convention costs (megatron or torch)."""
    fp32_model_states: bool
    """Parameters and gradients are held in fp32 whatever the compute precision (the parameter
    is the optimizer's master copy): 4Ψ + 4Ψ + KΨ with K = 8 (AdamW) or 4 (SGD). Else the ZeRO
    paper's mixed precision: 2Ψ + 2Ψ + KΨ with K = 12 or 8."""
    zero_stages: tuple[ZeroStageRule, ZeroStageRule, ZeroStageRule, ZeroStageRule]
    """The rule of ZeRO stages 0-3."""
    pipeline_defers_gradient_sync: bool
    """With pp > 1 the pipeline schedule turns gradient sync and the reshard after backward off
    for every micro-batch and reduces once at the end of the step."""
    pipeline_overlaps_dp_sync: bool = True
    """With pp > 1 the once-per-step gradient reduction and parameter gather overlap the last
    micro-batch's backward and the next forward (Megatron's ``--overlap-grad-reduce
    --overlap-param-gather``, FSDP2's prefetching); False: they run after the pipeline drains, exposed
    whole (the capability table's ``dp_overlap`` feature, ``pipelined``)."""
    hsdp_all_reduce_each_reduce_scatter: bool
    """HSDP's all-reduce across replicas follows every reduce-scatter (else once per step)."""
    eager_activations: bool
    """Activations are what eager PyTorch autograd saves (``activations.torch_dense_layer_bytes``),
    else Korthikanti et al.'s count."""
    autocast_without_data_parallel: bool
    """Mixed precision is ``torch.autocast`` when there is no data parallelism (fp32 residual
    stream, per-call input casts, 16-bit weight copies)."""
    receive_buffer_per_microbatch: bool
    """The pipeline keeps one receive buffer per micro-batch and receiving chunk (plus one send);
    else one send and one receive buffer."""
    dtensor_tensor_parallel: bool
    """Tensor-parallel layers are DTensor modules, paying ``tp_layer_overhead_s`` of host time."""
    torchao_low_precision: bool = False
    """Low-precision recipes run as torchao's (``Float8Linear``, MX): weights are recast every
    micro-batch and no quantised copy persists, and FSDP2 all-gathers in fp8 only where
    ``enable_fsdp_float8_all_gather`` applies (tensorwise). Else as Transformer Engine's under
    Megatron: quantised weights cached for the step, ``--fp8-param-gather`` gathers them quantised."""
    grad_reduce_in_fp32: bool = True
    """bf16/fp8 training accumulates and reduces gradients in an fp32 ``main_grad`` buffer (Megatron
    DDP's ``grad_reduce_in_fp32``, its default for bf16); False: the buffer has the parameters'
    16-bit dtype (Megatron-LM ``--grad-reduce-in-bf16``), 2 bytes per parameter instead of 4."""
    grads_freed_each_step: bool = False
    """Gradients are allocated by a step's backward and freed after its optimizer step
    (``optimizer.zero_grad(set_to_none=True)``, PyTorch's default since 2.0), so a step of one
    micro-batch never holds them beside its saved activations: backward frees a layer's
    activations as it allocates that layer's gradients (``rank_memory.grads_live_at_peak``). Else
    the gradients live in a buffer allocated once, before the first step (Megatron DDP's contiguous
    ``main_grad`` buffer, ``megatron/core/distributed/param_and_grad_buffer.py``; DeepSpeed's
    fp32 gradient accumulation), and are held at every peak."""
    clip_squares_gradients: bool = False
    """Gradient clipping squares each local gradient into a new fp32 tensor of its size before
    summing it (autoplan's job, ``planner/launch/torchjob/clip.py``), so the clip holds every
    gradient and one such copy of the largest (``backward_peak.clip_square_bytes``). Else the norm
    is a reduction with no full-size temporary (``torch.nn.utils.get_total_norm``, Megatron's
    multi-tensor L2 norm)."""
    keeps_16bit_grads: bool = False
    """The 16-bit gradients each backward writes stay allocated beside the fp32 accumulation
    buffer (2 more bytes per parameter in bf16/fp8 training)."""
    loss_parallel: bool = False
    """Eager activations only: under tp the cross-entropy runs on the vocabulary-sharded logits
    (torchtitan's default, ``torch.distributed.tensor.parallel.loss_parallel`` with the output
    projection's ``Shard(-1)`` layout, ``parallelize_llama.apply_tp``), so each rank holds b·s·V/t
    logits; else the head's output is gathered and every tp rank holds the whole vocabulary.
    (Megatron's vocabulary-parallel cross entropy is in Korthikanti's count already.)"""
    fused_elementwise: bool = True
    """Norms, activations and rotary embeddings run as fused kernels, one read and one write each
    (Megatron-LM's and Transformer Engine's fused kernels). False: eager PyTorch operators, unless
    the job is compiled (``TrainingSpec.compiled``), each a kernel of its own
    (``eager_elementwise``)."""
    gather_copy_kernels: bool = False
    """Sharded data parallelism copies through flat communication buffers on the device: every
    parameter all-gather is followed by a copy-out of the gathered parameters into their unsharded
    tensors, every gradient reduce-scatter is preceded by a copy-in of the unsharded gradients,
    cast to the reduce dtype (FSDP2: ``foreach_all_gather_copy_out``,
    ``foreach_reduce_scatter_copy_in`` in ``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``),
    memory-bound (``rank_time.sharded_copy_bytes``). Megatron's distributed optimizer gathers into
    and reduces from the parameters' and gradients' own contiguous buffers, with no copy."""
    attention_kernel_capability: float = 0.0
    """CUDA compute capability the runtime's fused attention kernel is written for; 0 = a kernel
    written for each part (Transformer Engine picks cuDNN's fused attention per architecture,
    ``NVTE_FUSED_ATTN``). A part of a newer architecture runs it at ``legacy_attention_share``
    (``kernel_efficiency.attention_kernel_share``)."""
    offload_holds_all_states: bool = False
    """Optimizer offload keeps the parameter and gradient shards in host memory too, not only the
    optimizer states (FSDP2 ``CPUOffloadPolicy``: each all-gather copies the parameter shard to the
    device, each reduce-scatter copies the gradient shard back). Else ZeRO-Offload's split
    (Ren et al. 2021): optimizer states on the host, parameters and gradients on the device."""

    fused_cross_entropy: bool = False
    """Non-eager activations only: the loss is Transformer Engine's fused cross-entropy on the 16-bit
    logits, whose forward writes the logits' gradient in place into them and saves them for
    backward (Megatron-Core ``compute_language_model_loss`` with ``cross_entropy_loss_fusion`` and
    ``cross_entropy_fusion_impl='te'`` calls ``te_parallel_cross_entropy``; NVIDIA/TransformerEngine
    ``transformer_engine/pytorch/triton/cross_entropy.py``, ``cross_entropy_forward`` returns its
    ``_input``, release_v2.9 to v2.17): 2 bytes per logit kept and no fp32 copy
    (``activations.last_stage_logits_bytes``). Else Megatron's unfused vocabulary-parallel loss on
    an fp32 copy of the logits (``activations.loss_working_bytes``)."""

    moe_gathers_sequence: bool = False
    """Under tensor parallelism the MoE layer routes the whole (tp-gathered) sequence on every tp
    rank, all-to-alls it over ep groups strided by tp · cp, and sums the f/tp expert slices with an
    all-reduce (the generated job, ``planner/launch/torchjob/experts.py``). Else Megatron-Core's
    ``alltoall`` dispatcher: each rank routes its own 1/tp sequence shard over an ep group strided
    by the expert tp degree, and the expert-tp group all-gathers the received tokens
    (``moe_costs.expert_exchange``)."""

    moe_fixed_slots: bool = False
    """Every expert runs all C capacity slots of each routing group (fixed shapes, S slots per
    sequence when dropless: the generated job's ``experts.moe_forward``), so routed work scales
    with E·C/S copies per token (``moe_costs.routed_copies``); else with the k kept assignments."""
    kernel_per_expert: bool = False
    """A MoE layer runs each local expert's GEMM as its own kernel, each costing at least
    ``Assumptions.expert_gemm_min_s`` (Megatron-Core's ``TEGroupedMLP`` on Transformer Engine's
    multi-stream ``GroupedLinear``). Else one batched kernel serves all local experts (the
    generated job's ``GroupedExperts``: batched matmuls over stacked weights)."""

    def zero(self, zero_stage: int) -> ZeroStageRule:
        return self.zero_stages[zero_stage]

    def dp_sync(self, zero_stage: int, pp: int) -> tuple[int, bool]:
        """(parameter all-gathers per micro-batch, 0 = one per step; whether gradients are
        reduced after every micro-batch). When the pipeline defers gradient sync, every stage
        reduces once; parameters freed after forward are gathered twice per micro-batch, the
        others once per step."""
        rule = self.zero(zero_stage)
        if pp > 1 and self.pipeline_defers_gradient_sync:
            return (2 if rule.reshard_after_forward else 0), False
        if pp > 1 and rule.pipelined_reduces_once:
            return rule.gathers_per_microbatch, False
        return rule.gathers_per_microbatch, rule.reduce_every_microbatch

    def grads_held(self, num_microbatches: int) -> bool:
        """Whether a step's gradients exist before its last backward starts: in a buffer allocated
        once (``grads_freed_each_step`` False), or accumulated over more than one micro-batch."""
        return num_microbatches > 1 or not self.grads_freed_each_step


MEGATRON = RuntimeConvention(
    runtime="megatron",
    fp32_model_states=False,
    zero_stages=(
        ZeroStageRule(sharded_stage=0, reshard_after_forward=False, reduce_every_microbatch=False,
                      gathers_per_microbatch=0, bucketed=True, bucket_buffers=True),
        ZeroStageRule(sharded_stage=1, reshard_after_forward=False, reduce_every_microbatch=False,
                      gathers_per_microbatch=0, bucketed=True, bucket_buffers=True),
        # ZeRO-2 holds only its 1/N_d gradient shard, so with several micro-batches it must
        # reduce-scatter after each one's backward (DeepSpeed stage 2 reduces every bucket as it
        # fills; Rajbhandari et al. SC'20, Sec. 5.2); pipelined, once per step.
        ZeroStageRule(sharded_stage=2, reshard_after_forward=False, reduce_every_microbatch=True,
                      gathers_per_microbatch=0, bucketed=True, bucket_buffers=True, pipelined_reduces_once=True),
        ZeroStageRule(sharded_stage=3, reshard_after_forward=True, reduce_every_microbatch=True,
                      gathers_per_microbatch=2, bucketed=False, bucket_buffers=False),
    ),
    pipeline_defers_gradient_sync=False,
    hsdp_all_reduce_each_reduce_scatter=False,
    eager_activations=False,
    autocast_without_data_parallel=False,
    receive_buffer_per_microbatch=False,
    dtensor_tensor_parallel=False,
    kernel_per_expert=True,
)
"""Megatron-LM's distributed optimizer / DeepSpeed ZeRO (Rajbhandari et al., SC'20, Sec. 5 and
7): ZeRO 0-1 reduce (and gather) once per step in buckets, ZeRO-2 reduce-scatters each
micro-batch's gradients (once per step when pipelined); ZeRO-3 gathers in forward and
backward and reduce-scatters every micro-batch, one layer at a time. Activations as Korthikanti
et al. 2022 count them (fused kernels, Megatron sequence parallelism)."""


DEEPSPEED = replace(MEGATRON, runtime="deepspeed", keeps_16bit_grads=True,
                    pipeline_overlaps_dp_sync=False, attention_kernel_capability=8.0)
"""Megatron-DeepSpeed: Megatron's layers under DeepSpeed's pipeline engine (which runs the model as
a ``PipelineModule`` even at pp 1) with its ``BF16_Optimizer``. As ``MEGATRON``, except that after
each backward the engine copies the bf16 gradients into the fp32 accumulation with
``update_hp_grads(clear_lp_grads=False)`` (``deepspeed/runtime/pipe/engine.py``,
``_exec_backward_pass``), so the bf16 gradients stay allocated: 2 + 6 bytes per parameter plus
the optimizer states. Its fused attention is the ``flash_attn`` package's FlashAttention-2
(``--use-flash-attn-v2``, ``megatron/model/transformer.py`` ``FlashSelfAttention``), written for
sm80 (``attention_kernel_capability`` 8.0). With pp > 1 its data-parallel reduction is exposed: ``TrainSchedule``
(``deepspeed/runtime/pipe/schedule.py``) issues ``ReduceGrads`` after the last backward, as the
capability table's ``dp_overlap`` says (``pipelined=False``; a test checks the two agree)."""


MEGATRON_BRIDGE = replace(MEGATRON, runtime="megatron-bridge", grad_reduce_in_fp32=False, fused_cross_entropy=True)
"""Megatron-Core as NVIDIA's NeMo / Megatron-Bridge performance recipes configure it (the published
NeMo performance tables): as ``MEGATRON``, except that the recipes turn fp32 gradient reduction off
(``cfg.ddp.grad_reduce_in_fp32 = False`` and ``cfg.mixed_precision.grad_reduce_in_fp32 = False`` in
Megatron-Bridge ``scripts/performance/configs/{llama,deepseek,qwen}/*_llm_pretrain.py``; NeMo 2's
performance scripts set ``recipe.trainer.plugins.grad_reduce_in_fp32 = False``), so the
distributed optimizer's gradient buffer holds bf16: 2 + 2 + 12/d bytes per parameter; and the loss is
Transformer Engine's fused cross-entropy (``fused_cross_entropy``): ``GPTModelProvider``'s
``cross_entropy_loss_fusion`` defaults True (Megatron-Bridge ``src/megatron/bridge/models/gpt_provider.py``)
and every performance run sets ``cross_entropy_fusion_impl = "te"`` (``set_common_perf_overrides`` in
``scripts/performance/utils/helpers.py`` at v0.2.0, ``overrides.py`` at v0.3.0 and v0.4.0,
``_benchmark_common`` in ``src/megatron/bridge/perf_recipes/_common.py`` since)."""
