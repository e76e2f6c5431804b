"""The process groups a layout's collectives run on, and where they land on NVLink domains.

Ranks are numbered tp innermost, then cp, dp and pp (Megatron-LM's order, ``costmodels.layout``),
so a group of one axis is ``degree`` ranks ``stride`` apart, the stride the product of the axes
inside it. The cost model's collectives (``layer_costs``, ``rank_time``) run on these groups, and
a group's link is decided by how many of its ranks share an NVLink domain
(``ClusterSpec.group_placement``). ``group_shapes`` lists them for the search, which offers a
second rack placement of a mesh only where it moves one (``placement_signature``); ``describe``
names them for the plan (``Placement``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hardware_specs.placement import domain_sizes
from hardware_specs.schema import ClusterSpec, packed_group_placement, worst_group_placement

from .moe_dispatch import ep_group_stride


def group_shapes(*, dp: int, tp: int, pp: int, cp: int, ep: int, etp: int, hsdp_shard: int = 0) -> tuple[
        tuple[int, int], ...]:
    """(degree, stride) of every group a collective of the cost model may use under this mesh: tp
    (and the expert-tp ones, ``etp`` wide), cp, the data-parallel dp · cp group and with HSDP its
    shard and replica groups, the ep group under either convention's stride (``moe_dispatch.
    ep_group_stride``), and a pipeline send (2 ranks tp · cp · dp apart)."""
    group = dp * cp
    shapes = {(tp, 1), (etp, 1), (cp, tp), (group, tp), (2, tp * cp * dp), (pp, tp * cp * dp)}
    for gathered in (False, True):
        shapes.add((ep, ep_group_stride(tp=tp, cp=cp, etp=etp, gathers_sequence=gathered)))
    if hsdp_shard and group % hsdp_shard == 0:
        shapes |= {(hsdp_shard, tp), (group // hsdp_shard, tp * hsdp_shard)}
    return tuple(sorted((d, s) for d, s in shapes if d > 1))


def placement_signature(shapes: tuple[tuple[int, int], ...], domain_gpus: int, num_gpus: int) -> tuple:
    """How each group of ``shapes`` sits on domains of ``domain_gpus`` filled in rank order (the
    rule of multi-node domains, ``worst_group_placement``): two placements with equal signatures
    give every collective the same links, so the same costs."""
    return tuple(worst_group_placement(d, s, domain_gpus, num_gpus) for d, s in shapes)


def spans_domains(degree: int, stride: int, domain_gpus: int, num_gpus: int) -> bool:
    """Whether a group may span more than one domain under either placement rule of
    ``ClusterSpec.group_placement`` (packed node-sized domains, or rank-order filling)."""
    if degree <= 1:
        return False
    packed = packed_group_placement(degree, stride, domain_gpus)[1] if num_gpus % domain_gpus == 0 else 1
    return packed > 1 or worst_group_placement(degree, stride, domain_gpus, num_gpus)[1] > 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Where a layout's ranks sit on the NVLink domains of a rack-scale cluster."""

    gpus_per_nvlink_domain: int
    """GPUs of each NVLink domain the ranks fill before the next (the whole domain where the layout
    leaves ``Layout.gpus_per_nvlink_domain`` at 0)."""
    nvlink_domain_gpus: int
    """GPUs of one NVLink domain of the node type (72 on GB200/GB300 NVL72)."""
    domains: tuple[int, ...]
    """GPUs the job uses of each domain it touches, in rank order."""
    groups: tuple[tuple[str, int, int], ...]
    """Per parallel axis of degree > 1: (axis, degree, domains its widest group spans); 1 = on NVLink."""

    def to_dict(self) -> dict[str, Any]:
        """The ``predicted.placement`` object of a plan."""
        return {"gpus_per_nvlink_domain": self.gpus_per_nvlink_domain, "nvlink_domain_gpus": self.nvlink_domain_gpus,
                "domains": list(self.domains),
                "groups": {axis: {"degree": degree, "domains": spanned} for axis, degree, spanned in self.groups}}


def describe(cluster: ClusterSpec, *, dp: int, tp: int, pp: int, cp: int, ep: int, etp: int,
             gathers_sequence: bool) -> Placement:
    """The ``Placement`` of a mesh on ``cluster`` (already placed, ``ClusterSpec.placed``): the tp,
    cp, ep, data-parallel (dp · cp) and pipeline groups with the domains each spans."""
    per_domain = cluster.nvlink_domain_gpus
    axes = (("tp", tp, 1), ("cp", cp, tp),
            ("ep", ep, ep_group_stride(tp=tp, cp=cp, etp=etp, gathers_sequence=gathers_sequence)),
            ("dp", dp * cp, tp), ("pp", pp, tp * cp * dp))
    groups = tuple((axis, degree, cluster.group_placement(degree, stride)[1]) for axis, degree, stride in axes
                   if degree > 1)
    return Placement(gpus_per_nvlink_domain=per_domain, nvlink_domain_gpus=cluster.node.nvlink_domain_gpus,
                     domains=domain_sizes(cluster.num_gpus, per_domain), groups=groups)
