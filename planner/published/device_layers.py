"""The cost model's per-layer compute against the layers one device ran (``device_records``).

For each measured shape, a one-GPU model of ``n`` such layers (the rank's local widths as a whole
model, micro-batch 1, no recomputation) is costed with 4 and with 8 layers; the difference over 4 is
one layer's forward + backward compute, with nothing of the embedding, head or optimizer in it.
Two runtimes, held to two measurements:
- ``megatron`` (Transformer Engine's fused layer) against the fastest way the device ran the layer,
  the bare kernels or the layer under ``torch.compile``: a framework's layer is never faster, so
  the model should not be either (``MEGATRON_FLOOR_SHARE``);
- ``torch`` (autoplan's eager job) against the measured eager layer (``TORCH_EAGER_BAND``).
The model costs a sustained step (``HardwareSpec.tensor_rate_share``); the records are bursts, so the
model sits somewhat above them by design.
"""

from __future__ import annotations

from dataclasses import dataclass

from costmodels.model_spec import ModelSpec

from .device_records import DeviceRecord, LayerCase

MEGATRON_FLOOR_SHARE = 0.97
"""The megatron runtime's layer is at least this share of the fastest measured way to run it."""
TORCH_EAGER_BAND = 0.15
"""The torch runtime's layer is within this fraction of the measured eager layer."""
LAYER_COUNTS = (4, 8)
VOCABULARY = 4096
"""A small vocabulary: the head's cost cancels in the difference anyway."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerComparison:
    """One measured shape: the model's per-layer forward + backward compute by runtime, and the
    device's measured ways of running that layer (seconds)."""

    device: str
    case: LayerCase
    megatron_s: float
    torch_s: float

    @property
    def megatron_share_of_fastest(self) -> float:
        return self.megatron_s / self.case.fastest_layer_s

    @property
    def torch_share_of_eager(self) -> float:
        return self.torch_s / self.case.eager_layer_s


def layer_model(case: LayerCase, num_layers: int) -> ModelSpec:
    """A one-GPU Llama model of ``num_layers`` layers as wide as the case's rank-local layer."""
    x = case.shape
    return ModelSpec(name=f"{case.name}-x{num_layers}", num_layers=num_layers, hidden_size=x.hidden,
                     ffn_hidden_size=x.ffn, num_attention_heads=x.q_heads, num_kv_heads=x.kv_heads,
                     head_dim=x.head_dim, vocab_size=VOCABULARY, gated_mlp=True, activation="silu",
                     norm="rmsnorm", positions="rotary")


def per_layer_compute_s(case: LayerCase, preset: str, runtime: str) -> float:
    """One layer's forward + backward compute under ``runtime`` on ``preset``: (compute of 8 layers -
    compute of 4) / 4."""
    import planner

    layout = planner.Layout(dp=1, tp=1, pp=1, micro_batch_size=case.micro_batch, num_microbatches=1)
    few, many = (planner.evaluate(model=layer_model(case, n), hardware=preset, gpus=1, global_batch=case.micro_batch,
                                  seq_len=case.seq_len, layout=layout, runtime=runtime).compute_s
                 for n in LAYER_COUNTS)
    return (many - few) / (LAYER_COUNTS[1] - LAYER_COUNTS[0])


def compare_layers(record: DeviceRecord) -> list[LayerComparison]:
    """Every case of ``record`` under the megatron and torch runtimes."""
    return [LayerComparison(device=record.device, case=case,
                            megatron_s=per_layer_compute_s(case, record.preset, "megatron"),
                            torch_s=per_layer_compute_s(case, record.preset, "torch"))
            for case in record.cases]
