"""The mechanisms a cluster's own runs may correct (``autoplan calibrate``), one factor each, bounded
around its prior.

A factor is a multiplier on ``Assumptions`` fields the cost model already applies: the time of one
kind of kernel or collective, the share of compute that data-parallel traffic can hide behind, or
the host time to issue a layer. Its prior is 1 (the model as shipped, or as a measured profile
left it); its bounds are what a device could plausibly do around what the datasheet, the shipped
device fit or the profile says. An overlap cannot hide more than all of the compute, so its
multiplier stays at or below 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from costmodels.assumptions import Assumptions


@dataclass(frozen=True, slots=True, kw_only=True)
class Factor:
    """One mechanism's correction: a multiplier on the ``Assumptions`` fields it scales."""

    name: str
    mechanism: str
    """What the factor scales, in a few words (for reports)."""
    fields: tuple[str, ...]
    """``Assumptions`` fields it multiplies."""
    low: float
    """Least multiplier: a rate at most 1/low of its prior (or a share this much of it)."""
    high: float
    """Largest multiplier."""

    def overrides(self, base: Assumptions, multiplier: float) -> dict[str, float]:
        """The fields' values at ``multiplier`` times ``base``'s."""
        return {f: getattr(base, f) * multiplier for f in self.fields}


FACTORS: tuple[Factor, ...] = (
    Factor(name="gemm", mechanism="GEMM time (1 / the GEMM rate)", fields=("compute_scale",), low=0.5, high=2.0),
    Factor(name="attention", mechanism="attention-core time", fields=("attention_scale",), low=0.5, high=2.0),
    Factor(name="memory_bound", mechanism="memory-bound kernel time (norms, activations, optimizer)",
           fields=("memory_bound_scale",), low=0.5, high=2.0),
    Factor(name="intra_node", mechanism="collectives inside a node (NVLink)", fields=("intra_node_comm_scale",),
           low=0.5, high=2.0),
    Factor(name="inter_node", mechanism="collectives across nodes (the NICs)", fields=("inter_node_comm_scale",),
           low=0.5, high=2.0),
    Factor(name="overlap", mechanism="share of compute data-parallel traffic hides behind",
           fields=("overlap_fraction",), low=0.25, high=1.0),
    Factor(name="host", mechanism="host time to issue an eager layer",
           fields=("layer_overhead_s", "tp_layer_overhead_s"), low=0.5, high=2.0),
)
"""Every mechanism factor, in report order."""


def assumptions_at(base: Assumptions, multipliers: dict[str, float]) -> Assumptions:
    """``base`` with each named factor applied at its multiplier (absent = 1)."""
    by_name = {f.name: f for f in FACTORS}
    overrides: dict[str, float] = {}
    for name, value in multipliers.items():
        overrides.update(by_name[name].overrides(base, value))
    return base.with_calibration(overrides)
