"""Sharding strategies of one operator on a mesh: products of per-axis atoms, with costs.

Per strategy (Alpa, section 4.2): compute time c (roofline of FLOPs and bytes over the
devices that split the work; forward + backward = 3 x forward, since backward costs about twice
the forward, Narayanan et al. SC'21, appendix on floating-point operations), intra-operator
communication d (gradient all-reduce of parameters replicated on an axis that splits the work:
data parallelism's gradient sync), and memory (parameter states per device plus the stored
output).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from .atoms import ATOMS_BY_KIND, Atom
from .comm import collective_time_s
from .mesh import Mesh, Placement

FWD_BWD_FACTOR = 3.0
"""Forward + backward work relative to forward (backward ~ 2 x forward; Narayanan et al. SC'21)."""
ADAM_STATE_BYTES_PER_PARAM = 16.0
"""Mixed-precision Adam: 2 (params) + 2 (grads) + 12 (fp32 master, momentum, variance) bytes
per parameter (ZeRO, Rajbhandari et al. SC'20, section 3.1)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CostContext:
    """Device and cluster numbers the strategy costs use."""

    cluster: object
    """A ``hardware_specs.ClusterSpec``."""
    peak_flops_per_s: float
    memory_bandwidth_bytes_per_s: float
    state_bytes_per_param: float = ADAM_STATE_BYTES_PER_PARAM


@dataclass(frozen=True, slots=True, kw_only=True)
class Strategy:
    name: str
    ins: tuple[Placement, ...]
    out: Placement
    grads: tuple[Placement, ...]
    """Layout of each input's gradient produced in backward."""
    compute_s: float
    comm_s: float
    memory_bytes: float
    param_dims: tuple[dict, ...]
    """Per mesh axis: parameter name -> sharded dim."""


def bucketed_all_reduce_s(size_bytes: float, degree: int, stride: int, cluster) -> float:
    """Gradient all-reduce of one parameter when gradients are bucketed (PyTorch DDP, Li et al.,
    VLDB'20, section 3.2.2: 25 MB buckets): the bandwidth term only, the per-message latency is
    shared by the bucket. Computed as time(S) - time(1 byte) of the collective model."""
    full = collective_time_s("all_reduce", size_bytes, degree, stride, cluster)
    return max(0.0, full - collective_time_s("all_reduce", 1.0, degree, stride, cluster))


def _divides(shape, placement_per_axis: list, mesh: Mesh) -> bool:
    """Every sharded dim is divisible by the product of the degrees sharding it."""
    factor = {}
    for p, axis in zip(placement_per_axis, mesh.axes):
        if isinstance(p, int):
            if p >= len(shape):
                return False
            factor[p] = factor.get(p, 1) * axis.degree
    return all(shape[d] % f == 0 for d, f in factor.items())


def _grad(in_p, split: bool):
    """Gradient layout of an input on one axis: replicated inputs of split work get partial sums."""
    if in_p == "P":
        return "R"
    return "P" if (in_p == "R" and split) else in_p


def _valid(node: dict, combo: tuple[Atom, ...], mesh: Mesh) -> bool:
    for i, shape in enumerate(node["input_shapes"]):
        if not _divides(shape, [a.ins[i] for a in combo], mesh):
            return False
    if not _divides(node["shape"], [a.out for a in combo], mesh):
        return False
    for p in node["params"]:
        if not _divides(p["shape"], [a.param_dims.get(p["name"], "R") for a in combo], mesh):
            return False
    return True


def _param_factor(name: str, combo, mesh: Mesh, skip: int | None = None) -> int:
    f = 1
    for a, (atom, axis) in enumerate(zip(combo, mesh.axes)):
        if a != skip and name in atom.param_dims:
            f *= axis.degree
    return f


def _costs(node: dict, combo: tuple[Atom, ...], mesh: Mesh, ctx: CostContext) -> tuple[float, float, float]:
    split = 1
    for atom, axis in zip(combo, mesh.axes):
        split *= axis.degree if atom.split else 1
    work_s = max(node["flops"] / ctx.peak_flops_per_s,
                 (node["bytes_read"] + node["bytes_written"]) / ctx.memory_bandwidth_bytes_per_s)
    compute_s = 0.0 if node.get("is_view") else FWD_BWD_FACTOR * work_s / split
    comm_s, memory = 0.0, 0.0
    for p in node["params"]:
        numel = 1
        for s in p["shape"]:
            numel *= s
        memory += numel * ctx.state_bytes_per_param / _param_factor(p["name"], combo, mesh)
        for a, (atom, axis) in enumerate(zip(combo, mesh.axes)):
            if atom.split and p["name"] not in atom.param_dims:
                grad_bytes = numel * p["itemsize"] / _param_factor(p["name"], combo, mesh, skip=a)
                comm_s += bucketed_all_reduce_s(grad_bytes, axis.degree, axis.stride, ctx.cluster)
    if not node.get("is_view") and node["kind"] != "output":
        out_shard = 1
        for atom, axis in zip(combo, mesh.axes):
            out_shard *= axis.degree if isinstance(atom.out, int) else 1
        memory += node["bytes_written"] / out_shard
    return compute_s, comm_s, memory


def node_strategies(node: dict, mesh: Mesh, ctx: CostContext) -> list[Strategy]:
    """All valid strategies of ``node`` on ``mesh``, in a deterministic order."""
    atoms = ATOMS_BY_KIND[node["kind"]](node)
    source = node["kind"] in ("input", "creation")
    per_axis = [[a for a in atoms if a.tag == "replicate" or (a.tag in axis.tags and not (source and axis.module_level))]
                for axis in mesh.axes]
    out = []
    for combo in itertools.product(*per_axis):
        if not _valid(node, combo, mesh):
            continue
        compute_s, comm_s, memory = _costs(node, combo, mesh, ctx)
        ins = tuple(tuple(a.ins[i] for a in combo) for i in range(len(node["input_shapes"])))
        grads = tuple(tuple(_grad(a.ins[i], a.split) for a in combo) for i in range(len(node["input_shapes"])))
        out.append(Strategy(name="|".join(a.name for a in combo), ins=ins, out=tuple(a.out for a in combo),
                            grads=grads, compute_s=compute_s, comm_s=comm_s, memory_bytes=memory,
                            param_dims=tuple(a.param_dims for a in combo)))
    return out
