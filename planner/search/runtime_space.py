"""The search space of a runtime: its capability table (``costmodels.capabilities``) narrowed by the user.

``search_options`` turns a table plus a ``Narrowing`` into the ``SearchOptions`` the solvers walk,
so ``plan`` searches exactly the layouts the runtime runs; ``check_narrowing`` refuses, where it
enters, a value the runtime cannot run, naming the option (``--tp`` on the CLI, ``tp=`` in the API).
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Callable

from autoplan_base.errors import AutoplanError, field
from costmodels.capabilities import NARROWING_INTS, NARROWING_NAMES, Narrowing, RuntimeCapabilities
from costmodels.moe_dispatch import available_dispatchers
from hardware_specs.placement import placement_choices
from hardware_specs.schema import ClusterSpec

from .space import SearchOptions, overlap_searched


class NarrowingError(AutoplanError):
    """A narrowing option the runtime cannot run, or a malformed one."""


def flag_name(field: str) -> str:
    """The CLI option of a ``Narrowing`` field: ``--tp``, ``--micro-batch-sizes``."""
    return "--" + field.replace("_", "-")


def parameter_name(field: str) -> str:
    """The API keyword of a ``Narrowing`` field: ``tp=``."""
    return field + "="


_DEGREE_OF = {"tp": "tp", "pp": "pp", "cp": "cp", "ep": "ep", "virtual_stages": "virtual_stages"}


def narrowing_from(values: dict[str, Any], name: Callable[[str], str] = parameter_name) -> Narrowing:
    """A ``Narrowing`` from keyword values (None = not narrowed), each checked for its type."""
    out: dict[str, Any] = {}
    for key in NARROWING_INTS + NARROWING_NAMES:
        value = values.get(key)
        if value is None:
            continue
        kind = int if key in NARROWING_INTS else str
        if isinstance(value, (str, int)) or not all(isinstance(v, kind) and not isinstance(v, bool) for v in value):
            raise NarrowingError(f"{name(key)} expected a list of {'integers' if kind is int else 'names'}, "
                                 f"got {value!r}")
        if not value:
            raise NarrowingError(f"{name(key)} is empty; leave it out to search every value")
        if kind is int and min(value) < (0 if key == "zero_stages" else 1):
            raise NarrowingError(f"{name(key)} values must be positive, got {list(value)}")
        out[key] = tuple(sorted(set(value))) if kind is int else tuple(dict.fromkeys(value))
    offload = values.get("allow_offload", True)
    if not isinstance(offload, bool):
        raise NarrowingError(f"{name('allow_offload')} must be true or false, got {offload!r}")
    return Narrowing(**out, allow_offload=offload)


def check_narrowing(table: RuntimeCapabilities, narrowing: Narrowing,
                    name: Callable[[str], str] = parameter_name) -> None:
    """Refuse any value the runtime's table does not run, naming the option and what it supports."""
    who = f"{table.runtime} {table.latest}"
    for key, degree in _DEGREE_OF.items():
        values = getattr(narrowing, key)
        if any(v > 1 for v in values) and not table.has(degree):
            raise NarrowingError(f"{name(key)} {_show(values)}: {who} does not run {degree} > 1 "
                                 f"(it composes {', '.join(table.names('degrees'))}); use 1 or leave it out")
    for key, supported in (("schedules", table.names("schedules")), ("recompute_modes", table.names("recompute")),
                           ("zero_stages", table.zero_stages), ("moe_dispatchers", dispatcher_names(table))):
        bad = [v for v in getattr(narrowing, key) if v not in supported]
        if bad:
            raise NarrowingError(f"{name(key)} {_show(bad)}: {who} runs {_show(supported)}")


def dispatcher_names(table: RuntimeCapabilities) -> tuple[str, ...]:
    """The MoE dispatchers ``table`` runs: its listed ones, or its own all-to-all alone."""
    return table.names("dispatchers") or ("alltoall",)


def check_narrowing_cluster(narrowing: Narrowing, cluster: ClusterSpec) -> None:
    """Refuse a rack placement the cluster cannot take (``ClusterSpec.placed``: whole nodes, at most
    one NVLink domain) or a dispatcher its hardware cannot run (``moe_dispatch.available_dispatchers``),
    naming the option as the caller spells it (``autoplan_base.errors.field``)."""
    for value in narrowing.gpus_per_nvlink_domain:
        try:
            cluster.placed(value, label=field("gpus_per_nvlink_domain", value))
        except AutoplanError as err:
            raise NarrowingError(str(err)) from None
    runs = available_dispatchers(cluster.node)
    bad = [d for d in narrowing.moe_dispatchers if d not in runs]
    if bad:
        raise NarrowingError(f"{field('moe_dispatchers', _show(bad))}: {cluster.hardware.name} with NVLink domains of "
                             f"{cluster.node.nvlink_domain_gpus} GPUs runs {_show(runs)} (DeepEP reaches 8 NVLink "
                             "peers; both flex backends need CUDA compute capability 8.0 or newer)")


def check_narrowing_gpus(narrowing: Narrowing, gpus: int, name: Callable[[str], str] = parameter_name) -> None:
    """Refuse a narrowing no layout on ``gpus`` GPUs can take: a degree option (tp, pp, cp, ep) none
    of whose values divides the GPU count, or tp, pp and cp options no combination of whose values
    multiplies to a divisor of it (dp x tp x pp x cp is the GPU count)."""
    for key in ("tp", "pp", "cp", "ep"):
        values = getattr(narrowing, key)
        if values and not any(gpus % v == 0 for v in values):
            raise NarrowingError(f"{name(key)} {_show(values)}: no value divides the {gpus} GPUs; "
                                 f"use {_divisors(gpus)}")
    narrowed = [key for key in ("tp", "pp", "cp") if getattr(narrowing, key)]
    if len(narrowed) < 2:
        return
    products = {math.prod(combo) for combo in itertools.product(*(getattr(narrowing, k) for k in narrowed))}
    if not any(gpus % p == 0 for p in products):
        options = " with ".join(f"{name(k)} {_show(getattr(narrowing, k))}" for k in narrowed)
        raise NarrowingError(f"{options}: no combination multiplies to a divisor of the {gpus} GPUs "
                             f"(products {_show(sorted(products))}); change one of them or the GPU count")


def _divisors(gpus: int) -> str:
    divisors = [d for d in range(1, gpus + 1) if gpus % d == 0]
    return f"one of {_show(divisors)}" if len(divisors) <= 12 else f"a divisor of {gpus}"


def _show(values: tuple | list) -> str:
    return ",".join(str(v) for v in values)


def search_options(table: RuntimeCapabilities, narrowing: Narrowing, device_type: str,
                   cluster: ClusterSpec | None = None, **base: Any) -> SearchOptions:
    """The ``SearchOptions`` of ``table`` narrowed by ``narrowing`` (checked with ``check_narrowing``),
    on a device of ``device_type``; on ``cluster`` (where given) also its rack placements
    (``placement_choices``) and the MoE dispatchers its hardware runs; ``base``: the options no table
    decides (cross-node tp, split)."""
    def degrees(key: str) -> tuple[int, ...]:
        asked = getattr(narrowing, key)
        return asked or (() if table.has(_DEGREE_OF[key]) else (1,))

    return SearchOptions(
        zero_stages=narrowing.zero_stages or table.zero_stages,
        pipelined_zero_stages=table.pipelined_zero_stages,
        schedules=narrowing.schedules or table.names("schedules"),
        recompute_modes=narrowing.recompute_modes or table.names("recompute"),
        allow_hsdp=table.hsdp,
        tp_comm_overlap=table.has("tp_comm_overlap") and overlap_searched(device_type),
        allow_offload=table.has("optimizer_offload") and narrowing.allow_offload,
        cp_chunks_per_rank=table.cp_chunks_per_rank,
        job_rules=table.runtime, runtime_version=table.latest,
        tp_degrees=degrees("tp"), pp_degrees=degrees("pp"), cp_degrees=degrees("cp"), ep_degrees=degrees("ep"),
        virtual_stages=degrees("virtual_stages"), micro_batch_sizes=narrowing.micro_batch_sizes,
        gpus_per_nvlink_domain=_placements(narrowing, cluster), moe_dispatchers=_dispatchers(table, narrowing, cluster),
        ep_comm_overlap=table.has("ep_comm_overlap") and overlap_searched(device_type),
        **base)


def _placements(narrowing: Narrowing, cluster: ClusterSpec | None) -> tuple[int, ...]:
    """The rack placements searched: those asked for, else ``placement_choices`` of the cluster."""
    if narrowing.gpus_per_nvlink_domain or cluster is None:
        return narrowing.gpus_per_nvlink_domain or (0,)
    return placement_choices(cluster.node.nvlink_domain_gpus, cluster.gpus_per_node, cluster.num_gpus)


def _dispatchers(table: RuntimeCapabilities, narrowing: Narrowing, cluster: ClusterSpec | None) -> tuple[str, ...]:
    """The MoE dispatchers searched: the table's (as narrowed) that the cluster's hardware runs. DeepEP
    and HybridEP cost alike (``moe_dispatch``): unless both are asked for, HybridEP is searched only
    where DeepEP does not run (rack-scale NVLink domains), so the search never costs a twin that
    could only tie."""
    runs = available_dispatchers(cluster.node) if cluster is not None else ("alltoall",)
    out = tuple(d for d in narrowing.moe_dispatchers or dispatcher_names(table) if d in runs) or ("alltoall",)
    if "deepep" in out and "hybridep" in out and not narrowing.moe_dispatchers:
        out = tuple(d for d in out if d != "hybridep")
    return out


def plan_search_options(inputs: Any, device_type: str, cluster: ClusterSpec | None = None) -> SearchOptions:
    """The ``SearchOptions`` a plan file's ``inputs`` (``PlanInputs``) were searched with: its runtime's
    table as of ``inputs.runtime_version`` (older files: the latest), its narrowing, its split options,
    on ``cluster`` (its rack placements and dispatchers)."""
    from costmodels.capabilities import capabilities

    runtime = "torch" if inputs.launchable else inputs.training.runtime
    table = capabilities(runtime, inputs.runtime_version, label="inputs.runtime_version ")
    narrowing = Narrowing.from_dict(inputs.narrowing or {})
    return search_options(table, narrowing, device_type, cluster, allow_cross_node_tp=bool(inputs.allow_cross_node_tp),
                          layers_per_chunk=tuple(inputs.layers_per_chunk or ()),
                          first_stage_layers=inputs.first_stage_layers, last_stage_layers=inputs.last_stage_layers)


def plan_narrowing_kwargs(inputs: Any) -> dict[str, Any]:
    """The ``planner.plan`` keywords that reproduce a plan file's runtime version and narrowing."""
    out: dict[str, Any] = dict(inputs.narrowing or {})
    if inputs.runtime_version is not None:
        out["runtime_version"] = inputs.runtime_version
    return out
