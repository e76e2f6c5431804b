"""Alpa's intra-operator ILP (Zheng et al., OSDI'22, section 4.2, eq. 1) in PuLP.

Variables and constraints, labelled as in the paper:

- s_v[i] in {0, 1}, sum_i s_v[i] = 1                      one strategy per operator (one-hot s_v)
- a tensor read by one consumer v (most edges): Alpa's linearisation of s_u^T R_uv s_v,
  e_ij >= 0, sum_j e_ij = s_u[i], sum_i e_ij = s_v[j], cost sum_ij R_uv[i][j] e_ij
- a tensor read by several consumers (layout changes priced once per tensor, see
  ``problem.py``): h_k in [0, 1], h_k >= sum_{j: key(v, j) = k} s_v[j] for each consumer v,
  e_k >= sum_i C_k[i] s_u[i] - M_k (1 - h_k), e_k >= 0, M_k = max_i C_k[i]
- forbidden pairs (cost inf): e_ij <= 0, or s_u[i] + h_k <= 1
- sum_v w_v s_v^T m_v <= memory cap                         per-device memory (section 4.2)
- minimise sum_v w_v s_v^T (c_v + d_v) + the e terms above, weighted by repeat counts w

At an integer s the minimisation drives h_k to the largest demand (0 or 1) and e_k to
C_k[s_u] h_k (the edge form is exact at integer s), so the optimum equals ``problem.evaluate``'s minimum (tests check against the
brute-force twin). HiGHS (through highspy) is the default solver; PuLP's bundled CBC is the
fallback. CBC's ``LpStatus`` says "Optimal" even when it stops at the time limit, so we read
``sol_status`` and report the relative gap.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass
from typing import Literal

from .problem import Problem, TensorUse, evaluate
from .quiet import quiet_fds

SolverName = Literal["highs", "cbc"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Solution:
    """The chosen strategies and how the solver got there."""

    choice: tuple[int, ...]
    """Strategy index per node."""
    cost_s: float
    """Objective re-evaluated exactly (``problem.evaluate``), seconds."""
    memory_bytes: float
    status: str
    """``optimal`` | ``feasible`` (time limit hit, best incumbent returned) | ``infeasible`` |
    ``no_solution`` (time limit hit before any incumbent)."""
    gap: float | None
    """Relative MIP gap reported by the solver (0 when proven optimal; None if unknown)."""
    solver: str
    seconds: float
    """Wall time of building the model in PuLP and solving it."""
    solve_seconds: float
    """Wall time inside the solver call alone."""
    num_variables: int
    num_constraints: int


COST_SCALE = 1e6
"""The ILP works in microseconds: second-scale coefficients near 1e-9 upset solver tolerances."""


def _edge_costs(use: TensorUse, num_u: int, num_v: int) -> list[list[float]]:
    """R_vu of Alpa's eq. 1 for a tensor read by one consumer: [producer strategy][consumer strategy]."""
    table = [[0.0] * num_v for _ in range(num_u)]
    for j in range(num_v):
        keys = {d.key_of_strategy[j] for d in use.demands} - {-1}
        for i in range(num_u):
            table[i][j] = COST_SCALE * sum(use.key_costs_s[k][i] for k in keys)
    return table


def _add_edge_terms(lp, n: int, use: TensorUse, s) -> list:
    """One consumer: Alpa's linearisation, e_ij >= 0 with sum_j e_ij = s_u[i], sum_i e_ij = s_v[j]."""
    import pulp

    su, sv = s[use.producer], s[use.demands[0].consumer]
    table = _edge_costs(use, len(su), len(sv))
    if not any(c for row in table for c in row):
        return []
    e = [[lp.add_variable(f"e_{n}_{i}_{j}", 0, 0 if table[i][j] == math.inf else None)
          for j in range(len(sv))] for i in range(len(su))]
    for i in range(len(su)):
        lp += pulp.lpSum(e[i]) == su[i], f"edge_row_{n}_{i}"
    for j in range(len(sv)):
        lp += pulp.lpSum(e[i][j] for i in range(len(su))) == sv[j], f"edge_col_{n}_{j}"
    return [use.weight * table[i][j] * e[i][j] for i in range(len(su)) for j in range(len(sv))
            if table[i][j] and table[i][j] != math.inf]


def _add_demand_terms(lp, n: int, use: TensorUse, s) -> list:
    """Several consumers: h_k >= demand of each consumer, e_k >= C_k s_u - M_k (1 - h_k)."""
    import pulp

    terms = []
    for k, costs_s in enumerate(use.key_costs_s):
        costs = [0.0 if c == math.inf else COST_SCALE * c for c in costs_s]
        big_m = max(costs)
        forbidden = [i for i, c in enumerate(costs_s) if c == math.inf]
        if big_m <= 0 and not forbidden:
            continue
        h = lp.add_variable(f"h_{n}_{k}", 0, 1)
        for d_index, d in enumerate(use.demands):
            picks = [s[d.consumer][j] for j, key in enumerate(d.key_of_strategy) if key == k]
            if picks:
                lp += h >= pulp.lpSum(picks), f"demand_{n}_{k}_{d_index}"
        for i in forbidden:
            lp += s[use.producer][i] + h <= 1, f"forbid_{n}_{k}_{i}"
        if big_m <= 0:
            continue
        e = lp.add_variable(f"e_{n}_{k}", 0)
        lp += (e >= pulp.lpSum(c * x for c, x in zip(costs, s[use.producer]) if c) - big_m * (1 - h),
               f"reshard_{n}_{k}")
        terms.append(use.weight * e)
    return terms


def _build(problem: Problem):
    import pulp

    lp = pulp.LpProblem("alpa_intra_op", pulp.LpMinimize)
    s = [[lp.add_variable(f"s_{v}_{i}", 0, 1, cat="Binary") for i in range(len(c))]
         for v, c in enumerate(problem.node_cost_s)]
    objective = []
    for v, costs in enumerate(problem.node_cost_s):
        lp += pulp.lpSum(s[v]) == 1, f"onehot_{v}"
        objective += [problem.node_weight[v] * COST_SCALE * c * x for c, x in zip(costs, s[v]) if c]
    for n, use in enumerate(problem.uses):
        if len({d.consumer for d in use.demands}) == 1:
            objective += _add_edge_terms(lp, n, use, s)
        else:
            objective += _add_demand_terms(lp, n, use, s)
    if problem.memory_cap_bytes != float("inf"):
        lp += pulp.lpSum(problem.node_weight[v] * m * x for v, mem in enumerate(problem.node_memory_bytes)
                         for m, x in zip(mem, s[v]) if m) <= problem.memory_cap_bytes, "memory"
    lp += pulp.lpSum(objective)
    return lp, s


def _make_solver(name: SolverName, time_limit_s: float, gap_rel: float):
    import pulp

    if name == "highs":
        return pulp.HiGHS(msg=False, timeLimit=time_limit_s, gapRel=gap_rel, threads=1)
    if name == "cbc":
        with warnings.catch_warnings():  # PuLP 3.3 deprecates the bundled CBC; it is our fallback
            warnings.simplefilter("ignore", DeprecationWarning)
            return pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s, gapRel=gap_rel, threads=1)
    raise ValueError(f"solver must be highs or cbc, got {name!r}")


def _gap(lp, solver_name: str, sol_status: int) -> float | None:
    if sol_status == 1:
        return 0.0
    model = getattr(lp, "solverModel", None)
    if solver_name == "highs" and model is not None:
        return float(model.getInfo().mip_gap)
    return None


def solve_ilp(problem: Problem, *, solver: SolverName = "highs", time_limit_s: float = 60.0,
              gap_rel: float = 1e-6) -> Solution:
    """Solve eq. 1 for ``problem``; on time-out return the best incumbent with its gap."""
    import pulp

    start = time.perf_counter()
    lp, s = _build(problem)
    built = time.perf_counter()
    with quiet_fds():  # HiGHS prints a banner to fd 1 before its options apply
        try:
            lp.solve(_make_solver(solver, time_limit_s, gap_rel))
        except pulp.PulpSolverError:
            if solver != "highs":
                raise
            solver = "cbc"
            lp.solve(_make_solver(solver, time_limit_s, gap_rel))
    seconds = time.perf_counter() - start
    timing = {"seconds": seconds, "solve_seconds": time.perf_counter() - built}
    sol_status = lp.sol_status
    if sol_status not in (1, 2):
        # -1: proven infeasible; 0: the time limit came before any incumbent.
        return Solution(choice=(), cost_s=math.inf, memory_bytes=math.inf,
                        status="infeasible" if sol_status == -1 else "no_solution", gap=None, solver=solver,
                        **timing, num_variables=lp.numVariables(), num_constraints=lp.numConstraints())
    choice = tuple(max(range(len(xs)), key=lambda i: xs[i].value() or 0.0) for xs in s)
    cost, memory = evaluate(problem, choice)
    return Solution(choice=choice, cost_s=cost, memory_bytes=memory,
                    status="optimal" if sol_status == 1 else "feasible", gap=_gap(lp, solver, sol_status),
                    solver=solver, **timing, num_variables=lp.numVariables(),
                    num_constraints=lp.numConstraints())
