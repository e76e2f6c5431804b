"""When nothing fits: what the model states need, and the smallest GPU count that fits.

Every lever on one GPU count (ZeRO stage, offload, recomputation, micro-batch) was already
searched, so the only suggestions that can make the request fit are more GPUs (found by running
the search at larger counts) or less memory per sequence (a shorter ``--seq-len``)."""

from __future__ import annotations

from dataclasses import replace

from costmodels.breakdown import CostBreakdown
from costmodels.estimate import CostModel
from costmodels.params import total_params
from hardware_specs import make_cluster
from hardware_specs.units import GIB

from planner.plan.report import NoFit

from .solve import solve
from .space import SearchOptions

MAX_SCALE_UP = 64
"""Largest multiple of the requested GPU count the search tries when nothing fits."""


def model_state_gib(cost_model: CostModel) -> float:
    """Parameters, gradients and optimizer states of the whole model in GiB (ZeRO paper's
    (2 + 2 + K)·Ψ for mixed-precision Adam; LoRA: the frozen weights' parameters only)."""
    sb = cost_model.states
    per_param = sb.param if cost_model.training.lora_rank else sb.param + sb.grad + sb.optimizer
    return total_params(cost_model.model) * per_param / GIB


def smallest_fitting_gpus(cost_model: CostModel, options: SearchOptions,
                          node_gpus: int) -> tuple[int, CostBreakdown] | None:
    """The smallest count found at which some layout fits, with its best plan; None when none does.
    The requested count times 2, 4, ... ``MAX_SCALE_UP`` (whole nodes of ``node_gpus`` past one
    node) first; then, between the last doubling that does not fit and the first that does, whole
    nodes by bisection (fitting need not grow monotonically with the count, so the bisection finds
    a fitting count, not always the least). ``node_gpus``: GPUs per node of the hardware (or the
    request's ``gpus_per_node``), not the request's cluster, whose node holds only the requested
    GPUs when they are fewer than a node."""
    per_node = node_gpus
    low, gpus = cost_model.cluster.num_gpus, cost_model.cluster.num_gpus * 2
    while gpus <= cost_model.cluster.num_gpus * MAX_SCALE_UP:
        plan = _best_at(cost_model, options, gpus, per_node) if gpus <= per_node or gpus % per_node == 0 else None
        if plan is not None:
            return _bisect_nodes(cost_model, options, per_node, low, gpus, plan)
        low, gpus = gpus, gpus * 2
    return None


def _bisect_nodes(cost_model: CostModel, options: SearchOptions, per_node: int, low: int, high: int,
                  plan: CostBreakdown) -> tuple[int, CostBreakdown]:
    """Whole-node counts between ``low`` (no fit) and ``high`` (fits with ``plan``), bisected."""
    while True:
        nodes = [n for n in range(low // per_node + 1, -(-high // per_node)) if n * per_node > low]
        if low < per_node or not nodes:
            return high, plan
        middle = nodes[len(nodes) // 2] * per_node
        found = _best_at(cost_model, options, middle, per_node)
        if found is None:
            low = middle
        else:
            high, plan = middle, found


def _best_at(cost_model: CostModel, options: SearchOptions, gpus: int, per_node: int) -> CostBreakdown | None:
    """The best plan of ``cost_model``'s job on ``gpus`` GPUs, ``per_node`` a node; None when nothing fits."""
    cluster = make_cluster(cost_model.cluster.node, gpus, per_node if gpus >= per_node else gpus)
    job = replace(cost_model.job, cluster=cluster)
    result = solve(CostModel(job), gpus, job.cluster.nvlink_domain_gpus, options, top_k=1)
    return result.ranked[0] if result.ranked else None


def no_fit(miss: CostBreakdown, cost_model: CostModel, options: SearchOptions, node_gpus: int) -> NoFit:
    """What binds the closest miss, and the smallest GPU count that fits (checked by the search;
    ``smallest_fitting_gpus``)."""
    states = model_state_gib(cost_model)
    gpus = cost_model.cluster.num_gpus
    reason = (f"model states need {states:,.1f} GiB in all ({states / gpus:,.1f} GiB per GPU even fully sharded "
              f"over {gpus} GPUs); the fit rule allows {miss.memory_capacity_bytes / GIB:.1f} GiB per GPU")
    found = smallest_fitting_gpus(cost_model, options, node_gpus)
    return NoFit(reason=reason, model_state_gib=states, smallest_fitting_gpus=found[0] if found else None,
                 fitting_layout=found[1].layout if found else None)


def suggestions(fit: NoFit, requested_gpus: int) -> tuple[str, ...]:
    """``fit`` as the lines the CLI prints and the plan file's closest misses carry."""
    from planner.plan.render import layout_summary

    if fit.smallest_fitting_gpus is not None:
        more = f"--gpus {fit.smallest_fitting_gpus} fits ({layout_summary(fit.fitting_layout)})"
    else:
        more = f"no GPU count up to {requested_gpus * MAX_SCALE_UP} fits: use a shorter --seq-len or larger devices"
    return (fit.reason, more)
