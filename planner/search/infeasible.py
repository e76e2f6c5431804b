"""When nothing fits: what the model states need, and the smallest GPU count that fits.

Every lever on one GPU count (ZeRO stage, offload, recomputation, micro-batch) was already
searched, so the only suggestions that can make the request fit are more GPUs (found by running
the search at larger counts) or less memory per sequence (a shorter ``--seq-len``)."""

from __future__ import annotations

import math
import time
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


NO_FIT_BUDGET_S = 10.0
"""Seconds the search for a fitting GPU count may take in all; past it, the answer it has (none
found up to the last count tried) is returned. An ordinary no-fit finishes in a few seconds."""


BUDGET_NOTE = f"; the search for a fitting GPU count stopped at its {NO_FIT_BUDGET_S:g} s budget"
"""What a no-fit reason adds when that search ran out of time. The count it reached varies with the
machine, so it is not stated; but which counts were searched in time does too, so such a no-fit
answer (and only such a one) may differ between a fast and a slow machine."""


def parameter_floor_gpus(cost_model: CostModel, usable_bytes: float) -> int:
    """The fewest GPUs that can hold the model's parameters at all: every layout spreads them over its
    GPUs at best evenly, so the GPU that holds most holds at least total / count (closed form; no
    search). ``usable_bytes``: what the fit rule lets one GPU hold."""
    return max(1, math.ceil(total_params(cost_model.model) * cost_model.states.param / usable_bytes))


def smallest_fitting_gpus(cost_model: CostModel, options: SearchOptions, node_gpus: int, usable_bytes: float,
                          budget_s: float = NO_FIT_BUDGET_S) -> tuple[tuple[int, CostBreakdown] | None, int]:
    """(the smallest count found at which some layout fits with the best of its memory-frugal plans
    (``frugal_options``), or None; the largest count tried). The requested count times 2, 4, ... ``MAX_SCALE_UP`` (whole nodes of ``node_gpus``
    past one node), skipping those below ``parameter_floor_gpus``; then, between the last doubling that
    does not fit and the first that does, whole nodes by bisection (fitting need not grow monotonically
    with the count, so the bisection finds a fitting count, not always the least). No new count is
    searched after ``budget_s`` seconds. ``node_gpus``: GPUs per node of the hardware (or the request's
    ``gpus_per_node``), not the request's cluster, whose node holds only the requested GPUs when they
    are fewer than a node."""
    per_node, deadline = node_gpus, time.monotonic() + budget_s
    floor = parameter_floor_gpus(cost_model, usable_bytes)
    frugal = frugal_options(options)
    low, gpus = cost_model.cluster.num_gpus, cost_model.cluster.num_gpus * 2
    while gpus <= cost_model.cluster.num_gpus * MAX_SCALE_UP:
        if time.monotonic() > deadline:
            return None, low
        whole = gpus <= per_node or gpus % per_node == 0
        plan = _best_at(cost_model, frugal, gpus, per_node) if whole and gpus >= floor else None
        if plan is not None:
            return _bisect_nodes(cost_model, frugal, per_node, low, gpus, plan, deadline), gpus
        low, gpus = gpus, gpus * 2
    return None, low


def frugal_options(options: SearchOptions) -> SearchOptions:
    """``options`` cut to the least memory of each choice that only trades memory for time: one
    sequence a micro-batch (or the smallest size requested) and full recomputation (where searched). Whether anything fits at a GPU
    count is decided by these alone (a larger micro-batch or less recomputation never lowers the
    peak), at a fraction of the full search's cost (a full search at the fitting count can take
    minutes: gpt-oss-120b at a global batch of a million sequences). The layout reported is the best
    of these; ``plan --gpus N`` at the count found searches every choice."""
    recompute = ("full",) if "full" in options.recompute_modes else options.recompute_modes
    smallest = (min(options.micro_batch_sizes),) if options.micro_batch_sizes else (1,)  # inside the request
    return replace(options, micro_batch_sizes=smallest, recompute_modes=recompute)


def _bisect_nodes(cost_model: CostModel, options: SearchOptions, per_node: int, low: int, high: int,
                  plan: CostBreakdown, deadline: float) -> tuple[int, CostBreakdown]:
    """Whole-node counts between ``low`` (no fit) and ``high`` (fits with ``plan``), bisected until
    ``deadline`` (``time.monotonic``), after which the smallest fitting count found so far stands."""
    while True:
        nodes = [n for n in range(low // per_node + 1, -(-high // per_node)) if n * per_node > low]
        if low < per_node or not nodes or time.monotonic() > deadline:
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
    result = solve(CostModel(job), gpus, job.cluster.nvlink_domain_gpus, options, top_k=1, num_misses=0)
    return result.ranked[0] if result.ranked else None


def no_fit(miss: CostBreakdown, cost_model: CostModel, options: SearchOptions, node_gpus: int) -> NoFit:
    """What binds the closest miss, and the smallest GPU count that fits (checked by the search;
    ``smallest_fitting_gpus``)."""
    states = model_state_gib(cost_model)
    gpus = cost_model.cluster.num_gpus
    reason = (f"model states need {states:,.1f} GiB in all ({states / gpus:,.1f} GiB per GPU even fully sharded "
              f"over {gpus} GPUs); the fit rule allows {miss.memory_capacity_bytes / GIB:.1f} GiB per GPU")
    found, tried = smallest_fitting_gpus(cost_model, options, node_gpus, miss.memory_capacity_bytes)
    if found is None and tried < gpus * MAX_SCALE_UP:
        reason += BUDGET_NOTE
    elif found is not None and found[1].layout.optimizer_offload:
        reason += f"; {found[0]} GPUs fit only with the optimizer states offloaded to CPU memory"
    return NoFit(reason=reason, model_state_gib=states, smallest_fitting_gpus=found[0] if found else None,
                 fitting_layout=found[1].layout if found else None)


def suggestions(fit: NoFit, requested_gpus: int) -> tuple[str, ...]:
    """``fit`` as the lines the CLI prints and the plan file's closest misses carry."""
    from planner.plan.render import layout_summary

    if fit.smallest_fitting_gpus is not None:
        more = f"--gpus {fit.smallest_fitting_gpus} fits ({layout_summary(fit.fitting_layout)})"
    elif BUDGET_NOTE in fit.reason:
        more = "no fitting GPU count found in the time the search may take: try more --gpus or a shorter --seq-len"
    else:
        more = f"no GPU count up to {requested_gpus * MAX_SCALE_UP} fits: use a shorter --seq-len or larger devices"
    return (fit.reason, more)
