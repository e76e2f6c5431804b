"""Alpa's intra-operator ILP (Zheng et al., OSDI'22, eq. 1) against its brute-force twin."""

from __future__ import annotations

import math
import random

import pytest

from planner.alpa.build import build_problem
from planner.alpa.graph import find_blocks
from planner.alpa.ilp import solve_ilp
from planner.alpa.mesh import generic_mesh
from planner.alpa.problem import Demand, Problem, TensorUse, brute_force, evaluate


def random_problem(rng: random.Random, num_nodes: int) -> Problem:
    """A random DAG: strategies with costs and memory, tensors read by one or several consumers
    with demand keys, some forbidden (infinite) conversions, and a random memory cap."""
    sizes = [rng.randint(1, 3) for _ in range(num_nodes)]
    uses = []
    for u in range(num_nodes - 1):
        consumers = [v for v in range(u + 1, min(num_nodes, u + 5)) if rng.random() < 0.5] or [u + 1]
        num_keys = rng.randint(1, 3)
        costs = tuple(tuple(rng.choice([0.0, rng.random(), rng.random(), math.inf]) for _ in range(sizes[u]))
                      for _ in range(num_keys))
        demands = tuple(Demand(consumer=v, key_of_strategy=tuple(rng.randint(-1, num_keys - 1) for _ in range(sizes[v])))
                        for v in consumers for _ in range(rng.randint(1, 2)))
        uses.append(TensorUse(producer=u, weight=rng.choice([1.0, 2.0, 7.0]), key_costs_s=costs,
                              key_labels=tuple(f"k{k}" for k in range(num_keys)), demands=demands))
    return Problem(node_names=tuple(f"n{i}" for i in range(num_nodes)),
                   strategy_names=tuple(tuple(f"s{j}" for j in range(k)) for k in sizes),
                   node_cost_s=tuple(tuple(rng.choice([0.0, rng.random()]) for _ in range(k)) for k in sizes),
                   node_memory_bytes=tuple(tuple(rng.random() for _ in range(k)) for k in sizes),
                   node_weight=tuple(rng.choice([1.0, 3.0]) for _ in range(num_nodes)), uses=tuple(uses),
                   memory_cap_bytes=rng.uniform(0.5, 2.5 * num_nodes))


@pytest.mark.parametrize("solver", ["highs", "cbc"])
def test_ilp_equals_brute_force_on_random_graphs(solver):
    rng = random.Random(11 if solver == "highs" else 12)
    feasible = 0
    for _ in range(60 if solver == "highs" else 25):
        problem = random_problem(rng, rng.randint(2, 7))
        ref = brute_force(problem)
        sol = solve_ilp(problem, solver=solver)
        if ref is None:
            assert sol.status == "infeasible"
            continue
        feasible += 1
        assert sol.status == "optimal" and sol.gap == 0.0
        assert sol.cost_s == pytest.approx(ref[0], rel=1e-6, abs=1e-9)
        assert sol.memory_bytes <= problem.memory_cap_bytes
    assert feasible > 10


def test_shared_tensor_is_converted_once_per_layout():
    """Two consumers asking for the same layout pay one conversion (one all-gather for q, k, v)."""
    use = TensorUse(producer=0, weight=1.0, key_costs_s=((5.0,),), key_labels=("fwd:R",),
                    demands=(Demand(consumer=1, key_of_strategy=(0,)), Demand(consumer=2, key_of_strategy=(0,))))
    problem = Problem(node_names=("x", "q", "k"), strategy_names=(("s",), ("s",), ("s",)),
                      node_cost_s=((0.0,), (1.0,), (1.0,)), node_memory_bytes=((0.0,), (0.0,), (0.0,)),
                      node_weight=(1.0, 1.0, 1.0), uses=(use,))
    assert evaluate(problem, (0, 0, 0))[0] == pytest.approx(7.0)
    assert solve_ilp(problem).cost_s == pytest.approx(7.0)


def test_memory_cap_changes_the_choice():
    """Replicated is faster but does not fit; the ILP must take the sharded strategy."""
    base = dict(node_names=("op",), strategy_names=(("replicated", "sharded"),), node_cost_s=((1.0, 2.0),),
                node_memory_bytes=((10.0, 3.0),), node_weight=(1.0,), uses=())
    assert solve_ilp(Problem(**base, memory_cap_bytes=20.0)).choice == (0,)
    assert solve_ilp(Problem(**base, memory_cap_bytes=5.0)).choice == (1,)
    assert solve_ilp(Problem(**base, memory_cap_bytes=1.0)).status == "infeasible"


@pytest.fixture(scope="module")
def tower_graph():
    import test_alpa_fixtures as fx

    from planner.alpa.trace import token_inputs, trace_module

    return trace_module(fx.Tower(depth=3, hidden=16, ffn=32, vocab=32), token_inputs((4, 8)))


def _ctx():
    from planner.alpa.shard import cost_context

    return cost_context("h100-sxm-80gb", 4, "bf16")


def test_ilp_equals_brute_force_on_a_traced_graph():
    """A traced Mlp on a 1-D mesh of 2: small enough to enumerate every assignment."""
    import test_alpa_fixtures as fx

    from planner.alpa.trace import token_inputs, trace_module

    graph = trace_module(fx.Mlp(hidden=8, ffn=16, vocab=8), token_inputs((2, 3)))
    built = build_problem(graph, generic_mesh(2), _ctx())
    combos = math.prod(len(c) for c in built.problem.node_cost_s)
    assert 100 < combos < 50_000
    ref = brute_force(built.problem)
    assert solve_ilp(built.problem).cost_s == pytest.approx(ref[0], rel=1e-6)


def test_block_reuse_is_exact_for_uniform_plans(tower_graph):
    """The reduced ILP (one block for all) equals the full graph's cost of the expanded plan,
    and is no better than the full ILP (which may vary strategies between blocks)."""
    blocks = find_blocks(tower_graph)
    assert blocks is not None and blocks.count == 3
    mesh, ctx = generic_mesh(2, 2), _ctx()
    reduced = build_problem(tower_graph, mesh, ctx, blocks=blocks)
    full = build_problem(tower_graph, mesh, ctx)
    assert reduced.problem.num_nodes < full.problem.num_nodes
    red = solve_ilp(reduced.problem)
    expanded = tuple(red.choice[reduced.representative[n]] for n in full.nodes)
    assert evaluate(full.problem, expanded)[0] == pytest.approx(red.cost_s, rel=1e-9)
    assert evaluate(full.problem, expanded)[1] == pytest.approx(red.memory_bytes, rel=1e-9)
    line = generic_mesh(2)
    free = solve_ilp(build_problem(tower_graph, line, ctx).problem).cost_s
    assert free <= solve_ilp(build_problem(tower_graph, line, ctx, blocks=blocks).problem).cost_s * (1 + 1e-6)


def test_time_limit_status_and_gap_are_consistent():
    """Under a tight time limit the solver may stop early: whatever it returns, the status, the
    gap and the re-evaluated cost agree (CBC's LpStatus says Optimal even then; we read sol_status)."""
    rng = random.Random(4)
    problem = random_problem(rng, 250)
    problem = Problem(**{**{f: getattr(problem, f) for f in Problem.__dataclass_fields__}, "memory_cap_bytes": math.inf,
                         "uses": tuple(TensorUse(producer=u.producer, weight=u.weight, key_labels=u.key_labels,
                                                 demands=u.demands,
                                                 key_costs_s=tuple(tuple(1.0 if c == math.inf else c for c in row)
                                                                   for row in u.key_costs_s))
                                       for u in problem.uses)})
    for solver in ("highs", "cbc"):
        quick = solve_ilp(problem, solver=solver, time_limit_s=0.01)
        assert quick.status in ("optimal", "feasible", "no_solution")
        if quick.status == "no_solution":
            assert quick.choice == () and quick.gap is None
        else:
            assert quick.cost_s == pytest.approx(evaluate(problem, quick.choice)[0])
            assert (quick.gap == 0.0) == (quick.status == "optimal") or quick.gap is None
        full = solve_ilp(problem, solver=solver)
        assert full.status == "optimal" and full.gap == 0.0
        assert full.num_variables > problem.num_nodes and full.num_constraints > problem.num_nodes
        if quick.status != "no_solution":
            assert full.cost_s <= quick.cost_s * (1 + 1e-9)
