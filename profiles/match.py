"""Which machine a profile describes, and whether it is the one being planned for. Pure.

One rule, used where a profile meets a cluster (``planner.api.resolve_job``) and, for the
devices of one run, by the harness: a measured rate is only worth using on the device it was
measured on. Applying a 2-process CPU profile to an H100 makes an 8192x28672x8192 bf16 GEMM
cost 18 s instead of about 5 ms, while the breakdown still says "profile".
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Iterable

from autoplan_base.errors import field

from .schema import ProfileError

if TYPE_CHECKING:
    from hardware_specs import ClusterSpec

    from .schema import HardwareProfile

MISMATCH_CHOICES: tuple[str, ...] = ("refuse", "ok")
"""``profile_device_mismatch`` values: refuse a profile of another machine, or use it anyway."""
_MODEL = re.compile(r"\b(MI\d{3}[A-Z]?|[A-Z]{1,2}\d{2,3}[A-Z]?)(?![A-Za-z0-9])")
"""An accelerator model number inside a marketing name: H100, A100, V100, L40S, B200, MI300X."""


class ProfileMismatchError(ProfileError):
    """A profile measured on one machine is applied to another without the explicit override."""


def device_model(name: str) -> str | None:
    """The model number in a device name (``NVIDIA H100 80GB HBM3`` -> ``H100``); None if it has
    none (a CPU, or a generic name)."""
    found = _MODEL.search(name.upper())
    return found.group(1) if found else None


def _count(provenance: dict[str, Any], key: str) -> int | None:
    value = provenance.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def profile_machine(profile: "HardwareProfile") -> str:
    """The profiled machine in a few words: devices, name, type and node shape, each as far as the
    provenance says it (a calibration records the device and its node size, not a device count)."""
    p = profile.provenance
    devices, nodes, per_node = (_count(p, k) for k in ("num_devices", "num_nodes", "devices_per_node"))
    shape = (f", {nodes} node(s) of {per_node}" if nodes and per_node else f", nodes of {per_node}" if per_node
             else f", {nodes} node(s)" if nodes else "")
    return (f"{f'{devices} x ' if devices else ''}{p.get('device_name') or 'an unnamed device'} "
            f"({profile.device_type}{shape})")


def remake_advice(profile: "HardwareProfile", cluster: "ClusterSpec") -> str:
    """How to make a file like ``profile`` for ``cluster``: with the command that made it."""
    if profile.logged_runs_fit() is not None:
        return (f"Calibrate with that machine's own runs ('autoplan calibrate LOGS --hardware "
                f"{cluster.hardware.name} --out FILE')")
    return "Profile that machine ('autoplan profile' on it)"


def cluster_machine(cluster: "ClusterSpec") -> str:
    """The planned machine in the same words."""
    hw = cluster.hardware
    return (f"{cluster.num_gpus} x {hw.display_name} ({hw.device_type}, "
            f"{cluster.num_nodes} node(s) of {cluster.gpus_per_node})")


def profile_mismatches(profile: "HardwareProfile", cluster: "ClusterSpec") -> tuple[str, ...]:
    """Why ``profile`` does not describe ``cluster``'s devices; empty when it does.

    - device type: a ``cuda`` profile serves ``cuda`` and ``rocm`` datasheets (ROCm builds of torch
      report ``cuda``), a ``cpu`` profile only ``cpu``;
    - device model: where both names carry a model number (H100, A100, MI300X), they must agree;
    - devices per node: the cluster's nodes may not hold more devices than the profiled node did
      (its in-node curves were measured with that many devices sharing links and NICs).
    The node count is not compared: every collective curve is keyed by its own (degree, ranks per
    node, nodes), and a placement the profile never measured falls back to the datasheet.
    """
    problems = []
    hw = cluster.hardware
    wanted = ("cuda", "rocm") if profile.device_type == "cuda" else (profile.device_type,)
    if hw.device_type not in wanted:
        problems.append(f"device type {profile.device_type} is not {hw.device_type}")
    measured = device_model(str(profile.provenance.get("device_name", "")))
    planned = device_model(hw.display_name) or device_model(hw.name)
    if measured and planned and measured != planned:
        problems.append(f"device {measured} is not {planned}")
    per_node = profile.provenance.get("devices_per_node")
    if isinstance(per_node, int) and cluster.gpus_per_node > per_node:
        problems.append(f"{cluster.gpus_per_node} devices per node were planned but {per_node} per node "
                        "were profiled")
    return tuple(problems)


def check_profile_matches(profile: "HardwareProfile", cluster: "ClusterSpec", where: str,
                          mismatch: str) -> tuple[str, ...]:
    """The problems of ``profile_mismatches``; raises ``ProfileMismatchError`` (one line naming
    both machines) unless ``mismatch`` is ``ok``. ``where`` names the profile (its path)."""
    if mismatch not in MISMATCH_CHOICES:
        raise ProfileMismatchError(f"{field('profile_device_mismatch')} must be one of {', '.join(MISMATCH_CHOICES)}, "
                                   f"got {mismatch!r}")
    problems = profile_mismatches(profile, cluster)
    if problems and mismatch != "ok":
        raise ProfileMismatchError(
            f"{field('profile', where)} was measured on {profile_machine(profile)}, but the plan is for "
            f"{cluster_machine(cluster)}: {'; '.join(problems)}. {remake_advice(profile, cluster)}, or pass "
            f"{field('profile_device_mismatch', 'ok')} to use it anyway")
    return problems


def identity_key(identity: dict[str, Any]) -> tuple[Any, ...]:
    """What makes two ranks' devices the same kind: name, compute capability, memory."""
    return identity.get("device_name"), tuple(identity.get("capability") or ()), identity.get("memory_bytes")


def mixed_device_problems(identities: Iterable[dict[str, Any]]) -> tuple[str, ...]:
    """One line naming the first rank whose device differs from rank 0's; empty if all agree.
    ``identities``: per rank, {host, device_name, capability, memory_bytes}."""
    ranks = list(identities)
    for rank, identity in enumerate(ranks[1:], start=1):
        if identity_key(identity) != identity_key(ranks[0]):
            return (f"rank {rank} on {identity.get('host')} has {_describe(identity)} but rank 0 on "
                    f"{ranks[0].get('host')} has {_describe(ranks[0])}; profile one kind of device per run, "
                    "or pass --allow-mixed-devices to record the slowest",)
    return ()


def _describe(identity: dict[str, Any]) -> str:
    memory = identity.get("memory_bytes")
    size = f", {memory / 2**30:.0f} GiB" if isinstance(memory, int) else ""
    capability = identity.get("capability")
    cc = f", sm {'.'.join(map(str, capability))}" if capability else ""
    return f"{identity.get('device_name')}{cc}{size}"
