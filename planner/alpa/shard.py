"""The intra-operator search end to end: graph + mesh + hardware -> tensor-parallel plan.

Pure Python (no torch): takes a traced graph (``trace.py``) and returns a ``ShardReport``.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from hardware_specs import load_node, make_cluster
from hardware_specs.checks import MAX_SOLVER_TIME_S, finite
from autoplan_base.errors import AutoplanError

from .build import Built, build_problem
from .graph import Blocks, find_blocks
from .ilp import Solution, solve_ilp
from .mesh import Mesh, dp_tp_mesh
from .strategies import CostContext
from .tp_plan import count_collectives, tp_plan

GIB = 2**30


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardReport:
    """What ``autoplan shard`` prints."""

    tp_plan: dict
    """Module fqn -> PyTorch parallel style (see ``tp_plan.py`` for the vocabulary)."""
    collectives_per_block: dict | None
    """Forward / backward collectives of one repeated block (None when no block repeats)."""
    cost: dict
    solver: dict
    mesh: dict
    blocks: dict | None
    strategies: dict
    """Problem op -> chosen strategy (per mesh axis, ``|``-separated)."""
    unexpressible: list

    def to_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardResult:
    """The report and the pieces behind it (for tests and benchmarks)."""

    report: ShardReport
    built: Built
    solution: Solution
    blocks: Blocks | None
    mesh: Mesh


def cost_context(hardware: str, num_gpus: int, dtype: str, gpus_per_node: int | None = None) -> CostContext:
    cluster = make_cluster(load_node(hardware), num_gpus, gpus_per_node)
    hw = cluster.hardware
    if not hw.supports(dtype):
        raise AutoplanError(f"--dtype {dtype}: {hw.name} has no {dtype} rate; use one of {sorted(hw.peak_flops_per_s)}")
    return CostContext(cluster=cluster, peak_flops_per_s=hw.peak_flops(dtype),
                       memory_bandwidth_bytes_per_s=hw.memory_bandwidth_bytes_per_s)


def _cost(built: Built, solution: Solution) -> dict:
    p, c = built.problem, solution.choice
    compute = sum(w * sts[i].compute_s for w, sts, i in zip(p.node_weight, built.strategies, c))
    grad_sync = sum(w * sts[i].comm_s for w, sts, i in zip(p.node_weight, built.strategies, c))
    return {"objective_s": solution.cost_s, "compute_s": compute, "gradient_sync_s": grad_sync,
            "resharding_s": solution.cost_s - compute - grad_sync,
            "memory_gib_per_device": solution.memory_bytes / GIB}


def shard_graph(graph: nx.DiGraph, *, tp: int, dp: int = 1, hardware: str = "h100-sxm-80gb",
                dtype: str = "bf16", gpus_per_node: int | None = None, memory_fraction: float = 0.9,
                reuse_blocks: bool = True, solver: str = "highs", time_limit_s: float = 60.0,
                gap_rel: float = 1e-6) -> ShardResult:
    """Solve the intra-operator ILP of ``graph`` on a dp x tp mesh of ``hardware``."""
    if tp < 1 or dp < 1:
        raise AutoplanError(f"--tp and --dp must be at least 1, got tp={tp} dp={dp}")
    if not 0 < memory_fraction <= 1:
        raise AutoplanError(f"--memory-fraction must be in (0, 1], got {memory_fraction}")
    finite("--time-limit", time_limit_s, high=MAX_SOLVER_TIME_S)
    ctx = cost_context(hardware, tp * dp, dtype, gpus_per_node)
    hw = ctx.cluster.hardware
    cap = hw.memory_bytes * memory_fraction - hw.runtime_reserved_bytes
    mesh = dp_tp_mesh(dp, tp)
    blocks = find_blocks(graph) if reuse_blocks else None
    try:
        built = build_problem(graph, mesh, ctx, blocks=blocks, memory_cap_bytes=cap)
    except ValueError as err:
        raise AutoplanError(f"--tp {tp} --dp {dp}: {err}") from None
    solution = solve_ilp(built.problem, solver=solver, time_limit_s=time_limit_s, gap_rel=gap_rel)
    # No wall-clock times here: the report is JSON that must be the same bytes for the same inputs
    # (the table prints ``ShardResult.solution.seconds``).
    solver_info = {"name": solution.solver, "status": solution.status,
                   "variables": solution.num_variables, "constraints": solution.num_constraints,
                   "gap": solution.gap}
    mesh_info = {a.name: a.degree for a in mesh.axes}
    blocks_info = {"members": len(blocks.members), "first": blocks.members[0], "ops_per_block": len(blocks.nodes[0])} \
        if blocks else None
    if solution.status == "no_solution":
        raise AutoplanError(f"--time-limit {time_limit_s:g}: the solver found no plan in time; raise --time-limit")
    if solution.status == "infeasible":
        raise AutoplanError(f"--tp {tp}: no sharding fits {cap / GIB:.1f} GiB per device on {hw.name} with "
                            f"16 bytes of parameter state per parameter replicated over dp; raise --tp, shorten "
                            f"--input-shape, or let 'autoplan plan' add ZeRO and pipeline stages")
    plan, issues = tp_plan(graph, built, solution.choice, mesh)
    report = ShardReport(
        tp_plan=plan, collectives_per_block=count_collectives(graph, built, solution.choice, mesh, blocks)
        if blocks else None, cost=_cost(built, solution), solver=solver_info, mesh=mesh_info, blocks=blocks_info,
        strategies={n: built.strategies[i][solution.choice[i]].name for i, n in enumerate(built.nodes)},
        unexpressible=issues)
    return ShardResult(report=report, built=built, solution=solution, blocks=blocks, mesh=mesh)
