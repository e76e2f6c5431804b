"""``Job``: everything a cost depends on besides the layout."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from autoplan_base.errors import SpecError
from hardware_specs.schema import ClusterSpec

from .assumptions import DEFAULT_ASSUMPTIONS, Assumptions
from .convention import MEGATRON, RuntimeConvention
from .model_spec import ModelSpec
from .training import TrainingSpec

if TYPE_CHECKING:
    from profiles import HardwareProfile

DEFAULT_MEMORY_FRACTION = 0.95


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """One training job on one cluster; ``costmodels.estimate(job, layout)`` costs a layout of it."""

    model: ModelSpec
    training: TrainingSpec
    cluster: ClusterSpec
    profile: "HardwareProfile | None" = None
    """Measured rates; None = datasheet rates only. Its calibration, if any, overrides ``assumptions``."""
    assumptions: Assumptions = DEFAULT_ASSUMPTIONS
    memory_fraction: float = DEFAULT_MEMORY_FRACTION
    """Share of device memory a plan may use, in (0, 1]."""
    convention: RuntimeConvention = MEGATRON
    """How the runtime that runs the plan holds, syncs and saves; must be the convention of
    ``training.runtime`` (``costmodels.runtimes.CONVENTIONS`` has the torch one, FSDP2)."""

    def __post_init__(self) -> None:
        if self.convention.runtime != self.training.runtime:
            raise SpecError(f"Job.convention is the {self.convention.runtime} convention but training.runtime is "
                            f"{self.training.runtime!r}; pass the convention of that runtime "
                            f"(costmodels.runtimes.CONVENTIONS[{self.training.runtime!r}])")
