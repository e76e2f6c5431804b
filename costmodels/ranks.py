"""What one pipeline rank holds and spends: its layers, its per-micro-batch times, its
position-independent memory; and prefix sums that make those O(chunks) to compute."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache

from .backward_peak import BackwardTerms
from .model_spec import ModelSpec
from .pipeline import PassTimes
from .params import dense_layer_params, expert_params_per_layer, layer_params


@dataclass(slots=True, kw_only=True)
class RankTimes:
    """Per-micro-batch and per-step times of one pipeline rank (seconds)."""

    compute_s: float = 0.0
    fwd_compute_s: float = 0.0
    bwd_compute_s: float = 0.0
    weight_grad_s: float = 0.0
    """Of ``bwd_compute_s``, the weight-gradient GEMMs (W of the zero-bubble schedules)."""
    fwd_comm_s: float = 0.0
    """Of the exposed TP/CP/EP/PP communication, the forward's."""
    recompute_s: float = 0.0
    tp_s: float = 0.0
    cp_s: float = 0.0
    ep_s: float = 0.0
    dp_mb_s: float = 0.0
    pp_s: float = 0.0
    dp_tail_s: float = 0.0
    optimizer_s: float = 0.0
    offload_s: float = 0.0
    comm_bytes: Counter = field(default_factory=Counter)
    sources: dict[str, str] = field(default_factory=dict)
    """Where each term's rate came from (``compute``, ``attention``, ``<axis>_comm``) for this rank."""

    @property
    def per_microbatch_s(self) -> float:
        return self.compute_s + self.recompute_s + self.tp_s + self.cp_s + self.ep_s + self.dp_mb_s + self.pp_s

    @property
    def tail_s(self) -> float:
        return self.dp_tail_s + self.optimizer_s + self.offload_s

    def passes(self) -> PassTimes:
        """F, B and W of one micro-batch (everything not forward or W counts as B)."""
        forward = self.fwd_compute_s + self.fwd_comm_s
        return PassTimes(forward_s=forward, weight_grad_s=self.weight_grad_s,
                         input_grad_s=self.per_microbatch_s - forward - self.weight_grad_s,
                         hideable_s=self.ep_s + self.pp_s, compute_s=self.compute_s + self.recompute_s,
                         ep_comm_s=self.ep_s)


@dataclass(frozen=True, slots=True, kw_only=True)
class RankLayers:
    """What one pipeline rank holds: its chunks' layer ranges, counts by kind, first/last flags."""

    chunks: tuple[tuple[int, int], ...]
    """[start, end) layer ranges of this rank's model chunks."""
    num_dense: int
    num_moe: int
    first: bool
    last: bool

    @property
    def num_layers(self) -> int:
        return self.num_dense + self.num_moe

    @property
    def signature(self) -> tuple[int, int, bool, bool]:
        """What a rank's costs depend on (all dense layers are alike, and all MoE layers)."""
        return (self.num_dense, self.num_moe, self.first, self.last)


@dataclass(frozen=True, slots=True, kw_only=True)
class RankStatic:
    """Memory of one rank that does not depend on its pipeline position (bytes)."""

    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    buffers_bytes: float
    buffer_parts: tuple[tuple[str, float], ...]
    """``buffers_bytes`` by parallelism (``rank_memory.rank_buffer_parts``)."""
    stored_per_microbatch_bytes: float
    """Activations one micro-batch leaves for backward, first/last-stage extras included."""
    working_bytes: float
    """Recomputation working set, live once."""
    host_bytes: float = 0.0
    """Host RAM of this rank's offloaded optimizer states (``offload.host_state_bytes``), 0 without offload."""
    received_per_microbatch_bytes: float = 0.0
    """Of ``stored_per_microbatch_bytes``, the pipeline receive buffers (torch runtime), which
    the buffers count for every micro-batch; subtracted per micro-batch in flight."""
    largest_block_bytes: float = 0.0
    """The largest tensor allocated and freed every micro-batch (``activations.largest_block_bytes``),
    which the allocator's fragmentation holds once more (``reserved.fragmentation_bytes``)."""
    backward: BackwardTerms | None = None
    """Under eager activations, what the rank's backward holds beyond its saved activations
    (``backward_peak.BackwardTerms``), from which its peak phase is found; None otherwise."""


def state_sum(static: RankStatic) -> float:
    return static.params_bytes + static.grads_bytes + static.optimizer_bytes


@lru_cache(maxsize=64)
def layer_prefix(model: ModelSpec) -> "LayerPrefix":
    """The model's ``LayerPrefix``, built once per model spec (it is read, never changed): the
    search and the fits cost thousands of layouts of one model."""
    return LayerPrefix(model)


class LayerPrefix:
    """Prefix sums over layers so a rank's parameter counts cost O(chunks), not O(layers)."""

    def __init__(self, model: ModelSpec) -> None:
        self._dense, self._expert, self._moe = [0], [0], [0]
        for j in range(model.num_layers):
            moe = model.is_moe_layer(j)
            self._dense.append(self._dense[-1] + dense_layer_params(model, j))
            self._expert.append(self._expert[-1] + (expert_params_per_layer(model) if moe else 0))
            self._moe.append(self._moe[-1] + moe)
        self.largest_layer = max(layer_params(model, j) for j in range(model.num_layers))

    def dense_params(self, start: int, end: int) -> int:
        return self._dense[end] - self._dense[start]

    def expert_params(self, start: int, end: int) -> int:
        return self._expert[end] - self._expert[start]

    def moe_layers(self, start: int, end: int) -> int:
        return self._moe[end] - self._moe[start]
