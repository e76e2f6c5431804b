"""Where an eager runtime's step peaks after its forward, and what it holds there (bytes per rank).

Under eager PyTorch autograd (``RuntimeConvention.eager_activations``: the torch and torchtitan
runtimes) a step's memory after the forward passes through phases, and any of them can be its peak:

* the loss backward (``activations.loss_working_bytes``): every saved activation and the loss's
  working set; the count the model has always made (``rank_memory.stage_activation_bytes``);
* the backward of the first layer it reaches: the saved activations less the logits the loss kept,
  the layer's recompute working set, the tensors its backward allocates (``layer_transient_bytes``)
  and the gradients made so far (the output layer's and this layer's);
* the backward of the last layer it reaches: one layer's saved activations, recompute and transient,
  and every gradient but the input embedding's;
* the optimizer step: every gradient (the fused AdamW allocates nothing of their size);
* the gradient clipping, where the job squares each gradient into a new tensor
  (``RuntimeConvention.clip_squares_gradients``): every gradient and one fp32 copy of the largest.

Which one is the peak depends on the shape. Small layers with long sequences peak in the loss
backward; large layers at tensor parallelism 1, where one layer's gradients (h·f·4 bytes per matrix)
rival or pass its saved activations, peak inside backward or at the clip: what large layers hold
that small ones do not. With gradients held through the backward (several micro-batches, or a
runtime that keeps them) every gradient is live in every phase, and the layer's transient comes on
top of its saved activations.

The phases run one after another, so the memory between the first layer's backward and the last
layer's is a straight line from one to the other (each layer frees its saved activations and
allocates its gradients) and its largest value is at one of the two ends.
"""

from __future__ import annotations

from dataclasses import dataclass

from .activations import FP32_BYTES, ActivationShape
from .model_spec import ModelSpec

GATED_MLP_BACKWARD_TENSORS = 3
"""f-wide gradients a gated MLP's backward holds at once: the gradient of the down projection's
input, then (``MulBackward0`` of ``act(gate) * up``) the gradients of both factors while the first
is still referenced (planner/launch/torchjob/model.py ``FeedForward``); a plain MLP holds 2."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BackwardTerms:
    """What one rank's backward holds beyond its forward's saved activations (bytes)."""

    layer_transient_bytes: float
    """The most a layer's backward allocates at once beyond what it saved and its gradients
    (``layer_transient_bytes``), for one micro-batch."""
    layer_saved_bytes: float
    """What the rank's largest layer keeps for one micro-batch (``rank_memory.layers_saved_bytes``)."""
    recompute_bytes: float
    """The recompute working set of one layer (``rank_memory.recompute_working_bytes``; 0 without)."""
    layer_grads_bytes: float
    """Gradient bytes of the rank's largest layer."""
    head_grads_bytes: float
    """Gradient bytes made before any layer's backward: the output layer and final norm (last
    pipeline rank; the tied table's copy there); 0 on other ranks."""
    embedding_grads_bytes: float
    """Gradient bytes made after the last layer's backward: the input embedding (first rank, untied
    or on its own stage); 0 on other ranks."""
    loss_kept_bytes: float
    """What the loss keeps for backward and frees before the layers' backward (the last rank's
    logits, ``activations.last_stage_logits_bytes``); 0 on other ranks."""
    clip_bytes: float
    """The clip's temporary: an fp32 copy of the rank's largest local gradient (``clip_square_bytes``),
    0 where the runtime's clipping allocates none."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PeakPhase:
    """The phase that sets a rank's peak and what it holds there (bytes)."""

    name: str
    """loss, first layer backward, last layer backward, optimizer step or clip."""
    activations_bytes: float
    """Activations and working tensors live in that phase."""
    grads_bytes: float
    """Gradients live in that phase."""

    @property
    def total_bytes(self) -> float:
        return self.activations_bytes + self.grads_bytes


def layer_transient_bytes(model: ModelSpec, x: ActivationShape, *, weight_cast: bool, accumulating: bool) -> float:
    """Bytes a dense layer's eager backward allocates at once beyond its saved tensors and its own
    gradients, at its largest, for one micro-batch:

    * the MLP's f/t-wide activation gradients, B·s·b·k·f/t (k = ``GATED_MLP_BACKWARD_TENSORS`` gated,
      2 plain), where its backward holds the most;
    * under ``torch.autocast`` (``weight_cast``) the 16-bit gradient of a weight before the cast's
      backward (``ToCopyBackward0``) turns it into the fp32 gradient, B·f·h/t for the largest matrix,
      beside the one f-wide gradient the same node (``MmBackward0`` of the down projection) returns;
      and when gradients accumulate (``accumulating``) the fp32 result too, until ``AccumulateGrad``
      adds it in place: 4·f·h/t more.

    The two never coincide: autograd's ready queue runs the cast's backward (made later in forward,
    so a higher sequence number) before the MLP's elementwise backward allocates its gradients.
    Under FSDP2 with data parallelism the unsharded 16-bit weight gradients are counted with the
    buffers (``rank_memory._data_parallel_buffer_bytes``), so ``weight_cast`` is False there."""
    B, tokens, t = x.elem_bytes, x.s * x.b, x.tp
    f = model.ffn_hidden_size / t
    activation_grads = (GATED_MLP_BACKWARD_TENSORS if model.gated_mlp else 2) * B * tokens * f
    if not weight_cast:
        return activation_grads
    matrix = max(model.ffn_hidden_size, model.q_dim) * model.hidden_size / t
    cast = B * matrix + (FP32_BYTES * matrix if accumulating else 0.0)
    return max(activation_grads, B * tokens * f + cast)


def clip_square_bytes(largest_local_elements: float) -> float:
    """The torch job's clipping (planner/launch/torchjob/clip.py ``_local_square_sum``:
    ``grad.float().pow(2).sum()``) squares each local gradient into a new fp32 tensor before summing
    it, one gradient at a time: 4 bytes per element of the largest (its gradients are fp32, so
    ``.float()`` returns the tensor itself). ``torch.nn.utils.get_total_norm`` (torchtitan) and
    Megatron's multi-tensor L2 norm reduce without a full-size copy."""
    return FP32_BYTES * largest_local_elements


def layer_backward_bytes(terms: BackwardTerms) -> float:
    """The most one layer's backward adds to what was live before it, its own gradients included:
    it consumes what it saved and recomputes (a + r) while it allocates its gradients (g), one
    tensor at a time, so it holds the larger of the two at its worst, with its transient on top:
    max(a + r, g) + τ."""
    t = terms
    return max(t.layer_saved_bytes + t.recompute_bytes, t.layer_grads_bytes) + t.layer_transient_bytes


def peak_phase(*, activations_bytes: float, working_bytes: float, grads_bytes: float, held: bool,
               terms: BackwardTerms) -> PeakPhase:
    """The phase with the most memory (the first in the module docstring's order on a tie).

    ``activations_bytes``: the rank's activations at the schedule's peak, of which
    ``working_bytes`` is the working set (recompute, loss); ``grads_bytes``: its gradients in all;
    ``held``: gradients are live through the whole backward (several micro-batches, or a runtime
    that keeps them), else they appear as backward makes them and the loss phase holds none.
    Symbols: S saved activations, L the logits the loss kept, a one layer's saved bytes, r its
    recompute, τ its transient, g its gradients, H the head's, E the input embedding's, G all
    gradients; λ = max(a + r, g) + τ (``layer_backward_bytes``):

    * loss: S + working, with G (held) or none;
    * first layer: S − L + r + τ with G (held); else S − L − a + λ with H (gradients made so far
      past this layer's, which λ counts);
    * last layer (not held): λ with G − E − g;
    * optimizer step (not held): G alone;
    * clip: the clip's copy, with G."""
    saved = activations_bytes - working_bytes
    t = terms
    phases = [PeakPhase(name="loss", activations_bytes=activations_bytes, grads_bytes=grads_bytes if held else 0.0)]
    if held:
        first = PeakPhase(name="first layer backward", grads_bytes=grads_bytes,
                          activations_bytes=saved - t.loss_kept_bytes + t.recompute_bytes + t.layer_transient_bytes)
        phases.append(first)
    else:
        layer = layer_backward_bytes(t)
        phases.append(PeakPhase(name="first layer backward", grads_bytes=min(grads_bytes, t.head_grads_bytes),
                                activations_bytes=saved - t.loss_kept_bytes - t.layer_saved_bytes + layer))
        before = max(0.0, grads_bytes - t.embedding_grads_bytes - t.layer_grads_bytes)
        phases.append(PeakPhase(name="last layer backward", activations_bytes=layer, grads_bytes=before))
        phases.append(PeakPhase(name="optimizer step", activations_bytes=0.0, grads_bytes=grads_bytes))
    if t.clip_bytes:
        phases.append(PeakPhase(name="clip", activations_bytes=t.clip_bytes, grads_bytes=grads_bytes))
    return max(phases, key=lambda p: p.total_bytes)
