"""One logged run of a cluster: the job it trained, its layout, and what it measured."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autoplan_base.errors import AutoplanError
from costmodels.layout import Layout


class CalibrationError(AutoplanError):
    """A log, table or directory the calibration cannot read, or runs it cannot fit; the message
    names the file (and line) and what would fix it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LoggedRun:
    """A run as its logs tell it."""

    request: dict[str, Any]
    """``planner.api.resolve_job`` keywords of the job (model, hardware, gpus, global_batch,
    seq_len, precision, runtime, ...)."""
    layout: Layout
    step_time_s: float | None
    """Median seconds per step after the warm-up; None for a run that died out of memory."""
    peak_memory_bytes: float | None = None
    """The largest memory the run's log reports (max reserved, else max allocated); None if none."""
    out_of_memory: bool = False
    """The run died out of memory."""
    origin: str = ""
    """Where it was read: the file (and line or format)."""
    notes: tuple[str, ...] = field(default=())
    """What the reader assumed where the log was silent."""
    fields: tuple[tuple[str, str], ...] = field(default=())
    """How the source spells the job's inputs, as (keyword, its field) pairs where the two differ
    (a table's ``micro_batch``, a Megatron-LM log's ``world_size``): errors about the run name them so
    (``autoplan_base.errors.file_wording``)."""

    def job_key(self) -> tuple:
        """The job's identity (runs of one job share one cost model)."""
        return tuple(sorted((k, repr(v)) for k, v in self.request.items()))
