"""Device meshes, tensor placements and the cost of moving between placements.

A placement gives, per mesh axis, ``"R"`` (replicated), ``"P"`` (partial sums pending a
reduction) or an int d (sharded on tensor dim d): PyTorch DTensor's Replicate / Partial /
Shard(d) vocabulary. Converting one axis at a time is priced with the collective it needs.
"""

from __future__ import annotations

from dataclasses import dataclass

from .comm import collective_time_s

AxisPlacement = str | int
Placement = tuple[AxisPlacement, ...]

ALL_TAGS = frozenset({"batch", "seq", "seq_gemm", "model"})
"""Strategy families: shard the batch dim; shard the sequence in non-GEMM ops (sequence
parallel); shard token dims of GEMMs with replicated weights; shard weights, features or heads."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MeshAxis:
    """One axis of the device mesh."""

    name: str
    """``dp``, ``tp`` or any label."""
    degree: int
    """Devices along the axis."""
    stride: int
    """Rank distance between neighbours on this axis (innermost axis: 1)."""
    tags: frozenset[str] = ALL_TAGS
    """Strategy families allowed on this axis (``replicate`` always is)."""
    module_level: bool = False
    """Layouts may change only at linear / embedding modules and sources stay replicated, so
    the solution is a module-level PyTorch plan (``parallelize_module``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Mesh:
    """A 1-D or 2-D logical mesh; the last axis is innermost (stride 1)."""

    axes: tuple[MeshAxis, ...]

    @property
    def num_devices(self) -> int:
        n = 1
        for a in self.axes:
            n *= a.degree
        return n


def generic_mesh(*degrees: int) -> Mesh:
    """A mesh whose axes allow every strategy family (Alpa's setting)."""
    axes, stride = [], 1
    for i, d in reversed(list(enumerate(degrees))):
        axes.append(MeshAxis(name=f"axis{i}", degree=d, stride=stride))
        stride *= d
    return Mesh(axes=tuple(reversed(axes)))


def dp_tp_mesh(dp: int, tp: int) -> Mesh:
    """The planner's dp x tp mesh: dp shards the batch only (it is where DDP/FSDP run); tp
    takes model-parallel strategies and sequence parallelism on non-GEMM ops."""
    axes = []
    if dp > 1:
        axes.append(MeshAxis(name="dp", degree=dp, stride=tp, tags=frozenset({"batch"})))
    axes.append(MeshAxis(name="tp", degree=tp, stride=1, tags=frozenset({"model", "seq"}), module_level=True))
    return Mesh(axes=tuple(axes))


def axis_conversion(src: AxisPlacement, dst: AxisPlacement) -> str | None:
    """The collective that turns ``src`` into ``dst`` on one axis (None = local or nothing)."""
    if src == dst or dst == "P" or (src == "R" and isinstance(dst, int)):
        return None
    if src == "P":
        return "all_reduce" if dst == "R" else "reduce_scatter"
    if dst == "R":
        return "all_gather"
    return "all_to_all"


def conversions(src: Placement, dst: Placement, size_bytes: float, mesh: Mesh) -> list[tuple[str, str, float]]:
    """(axis name, collective, buffer bytes) for each axis that needs one.

    The buffer on axis a is the tensor's bytes divided by the degrees of the other axes on
    which the source is sharded (a first-order model; the exact order of a 2-D conversion is
    not modelled)."""
    out = []
    for a, axis in enumerate(mesh.axes):
        op = axis_conversion(src[a], dst[a])
        if op is None:
            continue
        local = size_bytes
        for b, other in enumerate(mesh.axes):
            if b != a and isinstance(src[b], int):
                local /= other.degree
        if op == "all_to_all":
            local /= axis.degree  # per-rank buffer
        out.append((axis.name, op, local))
    return out


def conversion_time_s(src: Placement, dst: Placement, size_bytes: float, mesh: Mesh, cluster) -> float:
    """Seconds to convert a tensor of ``size_bytes`` from ``src`` to ``dst``."""
    by_name = {a.name: a for a in mesh.axes}
    return sum(collective_time_s(op, b, by_name[name].degree, by_name[name].stride, cluster)
               for name, op, b in conversions(src, dst, size_bytes, mesh))


def grad_wanted(out: Placement) -> Placement:
    """Layout a producer needs its output gradient in: its own, with Partial -> Replicate."""
    return tuple("R" if p == "P" else p for p in out)


def placement_label(p: Placement) -> str:
    return ",".join(str(x) if x in ("R", "P") else f"S{x}" for x in p)
