"""Collective times for the intra-operator ILP: the one place the ILP asks for them.

Delegates to the project's cost model (``costmodels.collectives``: ring / hierarchical
alpha-beta on datasheet links, or a measured profile when one is given).
"""

from __future__ import annotations

from costmodels.collectives import collective_time_s as _model_time_s


def collective_time_s(op: str, size_bytes: float, degree: int, stride: int, cluster, profile=None) -> float:
    """Seconds for one collective of ``size_bytes`` (the full buffer, NCCL-tests convention;
    the per-rank buffer for all-to-all) over ``degree`` ranks ``stride`` apart on ``cluster``."""
    if degree <= 1 or size_bytes <= 0:
        return 0.0
    return _model_time_s(op, size_bytes, degree, stride, cluster, profile=profile)
