"""The runtime registry: every ``TrainingSpec.runtime`` name and its ``RuntimeConvention``.

``FSDP2`` is autoplan's own launched job; its code (``planner/launch/torchjob/parallel.py`` and
``trainer.py``) reads the same table to decide what it applies, so the cost model and the job
change together: ``parallel.py`` picks ``replicate`` or ``fully_shard`` and
``reshard_after_forward`` from it, ``trainer.py`` when gradients reduce and parameters reshard.

ZeRO mapping onto FSDP2 (written down in docs/launch.md):
  0 -> ``replicate`` (FSDP2's DDP): all-reduce of gradients after the last micro-batch, nothing
       sharded;
  1 -> ``fully_shard(reshard_after_forward=False)``; gradients reduce-scattered, and parameters
       resharded, only after the last micro-batch (unsharded gradients accumulate) - the
       closest native equivalent. Parameters, gradients and optimizer states are all sharded;
  2 -> ``fully_shard(reshard_after_forward=False)``, gradients reduce-scattered every
       micro-batch; FSDP2 reshards after each backward, so parameters are gathered once per
       micro-batch;
  3 -> ``fully_shard(reshard_after_forward=True)``: gathered for forward and again for backward.
Attention: ``F.scaled_dot_product_attention``. PyTorch puts cuDNN's fused attention first on sm90
and sm100 (``priority_order`` in ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``, when
``check_prefer_cudnn_attention``: cuDNN 9.15+ on those parts) and FlashAttention-2 first elsewhere,
written for sm80: a kernel written for each part, so ``attention_kernel_capability`` is 0. The
2026-11-28 H100 and H200 records (torch 2.11) show it: SDPA's default ran at cuDNN's speed, its
flash backend at half of it (``benchmarks/device_kernels.py``).
Optimizer offload: ``CPUOffloadPolicy`` on every FSDP unit (``parallel.offload_policy``), which
keeps the sharded parameters, their gradients and the optimizer states on the host.
Gradients: ``trainer.train_step`` zeroes them with ``set_to_none=True`` after every optimizer
step, and torchtitan v0.2's trainer calls ``optimizer.zero_grad()`` (``torchtitan/train.py``;
``torch.optim``'s default is ``set_to_none=True``), so neither holds gradients before a step's
first backward (``grads_freed_each_step``).
Model states: ``MixedPrecisionPolicy`` keeps the sharded parameters in their fp32 dtype (the
optimizer's master copy) and reduces gradients in fp32. Under pipelining
``torch.distributed.pipelining`` turns gradient sync and the reshard after backward off for
every micro-batch and reduces once at the end of the step (``PipelineStage.backward_maybe_with_nosync``,
``perform_reduce_grad``).
"""

from __future__ import annotations

from dataclasses import replace

from costmodels.convention import DEEPSPEED, MEGATRON, MEGATRON_BRIDGE, RuntimeConvention, ZeroStageRule

FSDP2 = RuntimeConvention(
    runtime="torch",
    fp32_model_states=True,
    zero_stages=(
        ZeroStageRule(sharded_stage=0, reshard_after_forward=False, reduce_every_microbatch=False,
                      gathers_per_microbatch=0, bucketed=True, bucket_buffers=False),
        ZeroStageRule(sharded_stage=3, reshard_after_forward=False, keeps_gathered_until_reduce=True,
                      reduce_every_microbatch=False, gathers_per_microbatch=0, bucketed=False,
                      bucket_buffers=False),
        ZeroStageRule(sharded_stage=3, reshard_after_forward=False, reduce_every_microbatch=True,
                      gathers_per_microbatch=1, bucketed=False, bucket_buffers=False),
        ZeroStageRule(sharded_stage=3, reshard_after_forward=True, reduce_every_microbatch=True,
                      gathers_per_microbatch=2, bucketed=False, bucket_buffers=False),
    ),
    pipeline_defers_gradient_sync=True,
    hsdp_all_reduce_each_reduce_scatter=True,
    eager_activations=True,
    autocast_without_data_parallel=True,
    receive_buffer_per_microbatch=True,
    dtensor_tensor_parallel=True,
    torchao_low_precision=True,
    offload_holds_all_states=True,
    grads_freed_each_step=True,
    clip_squares_gradients=True,
    gather_copy_kernels=True,
    fused_elementwise=False,
    moe_gathers_sequence=True,
    moe_fixed_slots=True,
)

TORCHTITAN = replace(FSDP2, runtime="torchtitan", loss_parallel=True, moe_fixed_slots=False,
                     attention_kernel_capability=8.0, clip_squares_gradients=False)
"""torchtitan's trainer (the published torchtitan runs; costed, not launched): FSDP2 and PyTorch TP
as ``FSDP2``, except that under tp the loss is vocabulary-parallel by default
(``parallelize_llama.apply_tp``: the output projection keeps ``Shard(-1)`` and the loss runs in
``loss_parallel()`` unless ``disable_loss_parallel``), so each rank holds b·s·V/t logits; and its
experts run the routed tokens only (``torch._grouped_mm`` over per-expert token groups), not
fixed capacity slots. Its attention is costed as its published runs ran it (PyTorch nightlies of
December 2024, whose SDPA put FlashAttention-2 first on every part: an sm80 kernel,
``attention_kernel_capability`` 8.0); current PyTorch runs cuDNN's on Hopper, which the torch
runtime costs (``docs/limits.md``). Its clipping takes the norm with ``torch.nn.utils.get_total_norm``
(``torchtitan/distributed/utils.py`` ``clip_grad_norm_``), which allocates no copy of a gradient."""

CONVENTIONS: dict[str, RuntimeConvention] = {
    c.runtime: c for c in (MEGATRON, MEGATRON_BRIDGE, DEEPSPEED, FSDP2, TORCHTITAN)}
"""The convention of each ``TrainingSpec.runtime`` name."""
