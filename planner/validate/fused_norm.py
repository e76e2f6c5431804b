"""RMSNorm in the dry run as a GPU runs it: the fused kernel's saved tensors, on the CPU.

``nn.RMSNorm`` calls ``F.rms_norm``, which dispatches to ``aten::_fused_rms_norm``
(aten/src/ATen/native/layer_norm.cpp, ``rms_norm_symint``). A CUDA or ROCm build runs it as one
kernel whose autograd node, ``FusedRmsNormBackward0``, keeps the input, the weight and the fp32
reciprocal RMS (torch/csrc/autograd/generated/Functions.h). On the CPU the op is
CompositeImplicitAutograd and decomposes: autograd then keeps the fp32 upcast input and the fp32
normalised tensor as well. The dry run runs on the CPU a job planned for a GPU, so while
``gpu_rms_norm`` is active every ``F.rms_norm`` whose weight has the input's dtype (the kernel
falls back to the composite otherwise) keeps what the GPU's node keeps; values, and so the
gradients, are the composite's (``costmodels.activations.torch_norm_bytes`` counts both).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn.functional as F


def _pass(t: torch.Tensor) -> torch.Tensor:
    return t


class _FusedRmsNorm(torch.autograd.Function):
    """Saves (input, weight, rstd) as ``FusedRmsNormBackward0`` does; backward recomputes the
    composite's gradient from the input, outside the memory probe's saved-tensor hooks (they
    would otherwise count the recomputation's own temporaries as the job's activations)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor | None, shape: list[int], eps: float | None):
        out, rstd = torch.ops.aten._fused_rms_norm(x, shape, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        ctx.shape, ctx.eps = shape, eps
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight, _ = ctx.saved_tensors
        with torch.autograd.graph.saved_tensors_hooks(_pass, _pass), torch.enable_grad():
            inputs = [x.detach().requires_grad_()]
            if weight is not None:
                inputs.append(weight.detach().requires_grad_())
            out = _COMPOSITE(inputs[0], ctx.shape, inputs[1] if weight is not None else None, ctx.eps)
            grads = torch.autograd.grad(out, inputs, grad)
        return grads[0], (grads[1] if weight is not None else None), None, None


_COMPOSITE = F.rms_norm
"""PyTorch's own ``F.rms_norm`` (the composite on the CPU)."""


def _fused(x: torch.Tensor, normalized_shape, weight: torch.Tensor | None = None, eps: float | None = None):
    if weight is not None and weight.dtype != x.dtype:
        return _COMPOSITE(x, normalized_shape, weight, eps)
    return _FusedRmsNorm.apply(x, weight, list(normalized_shape), eps)


@contextmanager
def gpu_rms_norm(active: bool) -> Iterator[None]:
    """While inside (and ``active``), ``F.rms_norm`` keeps what the GPU's fused kernel keeps."""
    if not active:
        yield
        return
    F.rms_norm = _fused
    try:
        yield
    finally:
        F.rms_norm = _COMPOSITE
