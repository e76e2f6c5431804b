"""The intra-operator sharding problem as numbers, and its exact cost function.

Alpa (Zheng et al., OSDI'22, section 4.2, eq. 1): each operator v picks one strategy
(one-hot s_v); the cost is  sum_v s_v^T (c_v + d_v)  +  sum_(v,u) s_v^T R_vu s_u,  with c the
compute, d the communication inside the operator and R the resharding between operators.

We attach resharding to *tensors* rather than edges: a tensor produced by u and read by
several consumers is converted once per distinct layout the consumers ask for (forward) and
its gradients are converted once per distinct gradient layout (backward). This counts one
all-gather for q, k and v reading the same normed activations, as Megatron does, instead of
three. Per tensor ``use``: a demand key k is "the consumers need layout k"; its cost depends on
the producer's strategy: C_use[k][s_u]. The cost of an assignment is

    sum_v w_v c_v[s_v]  +  sum_use w_use sum_{k demanded} C_use[k][s_producer]

with w the repeat counts of reused blocks (1 without reuse). ``evaluate`` is the one
definition both the ILP (``ilp.py``) and the brute-force twin (``brute_force``) optimise.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Demand:
    """What one consumer asks of a tensor, per consumer strategy."""

    consumer: int
    """Index of the consuming node."""
    key_of_strategy: tuple[int, ...]
    """For each strategy of the consumer: the demanded key (index into ``key_costs_s``), or -1."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorUse:
    """One produced tensor (or a merged group of identical ones) and its consumers."""

    producer: int
    weight: float
    """How many identical copies of this use the full graph holds."""
    key_costs_s: tuple[tuple[float, ...], ...]
    """[key][producer strategy]: seconds to convert the tensor (or its gradient) for that key;
    ``math.inf`` forbids the pair."""
    key_labels: tuple[str, ...]
    """Human-readable key names, e.g. ``fwd:R,S1`` (for reports)."""
    demands: tuple[Demand, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Problem:
    """Nodes with strategies, tensor uses, and a memory cap (everything in seconds / bytes)."""

    node_names: tuple[str, ...]
    strategy_names: tuple[tuple[str, ...], ...]
    node_cost_s: tuple[tuple[float, ...], ...]
    """[node][strategy]: compute plus intra-operator communication time, seconds."""
    node_memory_bytes: tuple[tuple[float, ...], ...]
    node_weight: tuple[float, ...]
    uses: tuple[TensorUse, ...]
    memory_cap_bytes: float = math.inf

    @property
    def num_nodes(self) -> int:
        return len(self.node_names)


def demanded_keys(use: TensorUse, choice: tuple[int, ...]) -> set[int]:
    """The keys a use's consumers ask for under ``choice`` (one strategy index per node)."""
    keys = set()
    for d in use.demands:
        k = d.key_of_strategy[choice[d.consumer]]
        if k >= 0:
            keys.add(k)
    return keys


def evaluate(problem: Problem, choice: tuple[int, ...]) -> tuple[float, float]:
    """(cost seconds, memory bytes) of one strategy per node: the objective of eq. 1."""
    cost = sum(w * c[s] for w, c, s in zip(problem.node_weight, problem.node_cost_s, choice))
    memory = sum(w * m[s] for w, m, s in zip(problem.node_weight, problem.node_memory_bytes, choice))
    for use in problem.uses:
        s_u = choice[use.producer]
        cost += use.weight * sum(use.key_costs_s[k][s_u] for k in demanded_keys(use, choice))
    return cost, memory


def brute_force(problem: Problem) -> tuple[float, tuple[int, ...]] | None:
    """Twin of the ILP: try every assignment; (best cost, one best choice) or None if none fits."""
    best = None
    for choice in itertools.product(*(range(len(c)) for c in problem.node_cost_s)):
        cost, memory = evaluate(problem, choice)
        if memory > problem.memory_cap_bytes or cost == math.inf:
            continue
        if best is None or cost < best[0]:
            best = (cost, choice)
    return best
