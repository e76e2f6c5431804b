"""``CostContext``: what the cost functions of one job share (rates, layer costs, state bytes, memos).

The per-term modules (``assignment``, ``rank_memory``, ``rank_time``, ``bounds``, ``assemble``) take
it as ``cm``; ``estimate.CostModel`` is this context with the verbs (``estimate``,
``peak_memory_bytes``) that put those terms together, so the terms never import the verbs.
"""

from __future__ import annotations

from weakref import WeakValueDictionary

from .compute import Rates
from .goodput import checkpoint_state_bytes
from .job import Job
from .layer_costs import LayerCosts
from .memory import ShardedParams, StateBytes, low_precision_weight_share, state_bytes
from .ranks import RankLayers, RankTimes, layer_prefix


class CostContext:
    """One job's rates, state sizes and the memos of its per-term costs (what every cost function
    reads); ``estimate.CostModel`` adds the verbs. Every memo maps inputs to a value that depends
    on nothing else, so no state of one call changes another's result."""

    def __init__(self, job: Job) -> None:
        model, training, cluster, profile = job.model, job.training, job.cluster, job.profile
        assumptions = job.assumptions
        if profile is not None and profile.calibration:
            assumptions = assumptions.with_calibration(profile.calibration)
        self.job = job
        self.model, self.training, self.cluster = model, training, cluster
        self.assumptions = assumptions
        self.rates = Rates(cluster.hardware, training.precision, profile, assumptions,
                           attention_kernel_capability=job.convention.attention_kernel_capability)
        self.layers = LayerCosts(model, training, cluster, self.rates, profile, assumptions,
                                 convention=job.convention)
        self.convention = job.convention
        self.low_precision_share = low_precision_weight_share(model) if self.rates.low_precision else 0.0
        """Share of the weights in low-precision GEMMs (``memory.low_precision_weight_share``)."""
        self.states: StateBytes = state_bytes(training, job.convention, low_precision_share=self.low_precision_share)
        band_upper = assumptions.memory_band_upper_for(training.runtime)
        self.capacity_bytes = job.memory_fraction * cluster.hardware.memory_bytes / (1 + band_upper)
        """The memory cap a layout's point peak must stay under: the usable memory over 1 + the
        memory band's upper edge for the runtime (``Assumptions.memory_band_upper_for``), so that the
        band's upper edge at its quantile stays under the usable memory."""
        self.checkpoint_bytes = checkpoint_state_bytes(model, training, job.convention)
        self.prefix = layer_prefix(model)
        self.core_memo: dict[tuple, RankTimes] = {}
        self.ranks_memo: dict[tuple, list[RankLayers]] = {}
        self.groups_memo: dict[tuple, list[tuple[RankLayers, int]]] = {}
        self.params_memo: dict[tuple, ShardedParams] = {}
        self.activation_memo: dict[tuple, tuple[float, float, float, float]] = {}
        self.shape_memo: dict[tuple, object] = {}
        """``rank_memory.activation_shape`` by the layout fields it reads."""
        self.layer_bytes_memo: dict[tuple, float] = {}
        """``activations.layer_bytes`` by (shape, MoE layer, recomputation): ``rank_memory.saved_layer_bytes``."""
        self.bound_memo: dict[tuple, object] = {}
        self.extremes_memo: dict[tuple, list[tuple[RankLayers, tuple[int, ...]]]] = {}
        self.placed_memo: WeakValueDictionary[int, CostContext] = WeakValueDictionary(
            {cluster.gpus_per_nvlink_domain: self})
        """This job's memo per ``Layout.gpus_per_nvlink_domain`` (``estimate.CostModel.placed``), held
        weakly: each memo holds those it made (``placed_models``), so the memos that share this one form
        no reference cycle, and their values are freed as soon as the last is dropped, not by a pass of
        the cyclic garbage collector over every value (a quarter of a second after a large search)."""
        self.placed_models: list[CostContext] = []
