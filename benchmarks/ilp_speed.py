"""ILP size and solve time of Alpa's intra-operator pass on a traced 32-layer Llama-style model.

Run: .venv/bin/python benchmarks/ilp_speed.py [--model llama2-7b] [--tp 8] [--dp 8] [--batch 8] [--seq 2048]

Prints, per configuration: trace time, problem size (ops, strategies, ILP variables and
constraints), PuLP build + solve time and the solver's own time, status and gap; with
per-block reuse (one block solved for all 32) and without it (every op its own variables),
on the planner's dp x tp mesh (dp shards the batch, tp anything) and on Alpa's unrestricted
2-D mesh. Also the inter-operator stage DP on 80 layers. Figures vary with machine load.
"""

from __future__ import annotations

import argparse
import time


def _trace(model: str, batch: int, seq: int):
    import torch

    from costmodels.presets import load_model
    from planner.alpa.trace import token_inputs, trace_module
    from planner.launch.torchjob.model import build_model

    spec = load_model(model)
    start = time.perf_counter()
    graph = trace_module(build_model(spec, device="meta", dtype=torch.bfloat16), token_inputs((batch, seq)))
    return spec, graph, time.perf_counter() - start


def _row(label: str, graph, mesh, ctx, blocks, solver: str, time_limit_s: float) -> None:
    from planner.alpa.build import build_problem
    from planner.alpa.ilp import solve_ilp

    start = time.perf_counter()
    built = build_problem(graph, mesh, ctx, blocks=blocks)
    build_s = time.perf_counter() - start
    sol = solve_ilp(built.problem, solver=solver, time_limit_s=time_limit_s)
    strategies = sum(len(s) for s in built.strategies)
    gap = "n/a" if sol.gap is None else f"{sol.gap:.1e}"
    print(f"{label:<34} {solver:<5} ops {built.problem.num_nodes:>5}  strategies {strategies:>6}  "
          f"vars {sol.num_variables:>7}  cons {sol.num_constraints:>7}  costs {build_s:6.2f} s  "
          f"pulp+solve {sol.seconds:7.2f} s  solver {sol.solve_seconds:7.2f} s  {sol.status} gap {gap}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama2-7b")
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--dp", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--time-limit", type=float, default=120.0)
    args = parser.parse_args()

    from planner.alpa.graph import find_blocks
    from planner.alpa.mesh import dp_tp_mesh, generic_mesh
    from planner.alpa.shard import cost_context

    spec, graph, trace_s = _trace(args.model, args.batch, args.seq)
    blocks = find_blocks(graph)
    print(f"{args.model}: {spec.num_layers} layers traced on meta in {trace_s:.2f} s: {graph.number_of_nodes()} ops, "
          f"{blocks.count} repeated blocks of {len(blocks.nodes[0])} ops; mesh dp {args.dp} x tp {args.tp}, "
          f"batch {args.batch} x seq {args.seq}")
    ctx = cost_context("h100-sxm-80gb", args.dp * args.tp, "bf16")
    planner_mesh, alpa_mesh = dp_tp_mesh(args.dp, args.tp), generic_mesh(args.dp, args.tp)
    for solver in ("highs", "cbc"):
        _row("dp x tp mesh, per-block reuse", graph, planner_mesh, ctx, blocks, solver, args.time_limit)
    _row("dp x tp mesh, no reuse", graph, planner_mesh, ctx, None, "highs", args.time_limit)
    _row("unrestricted 2-D mesh, per-block reuse", graph, alpa_mesh, ctx, blocks, "highs", args.time_limit)
    _stage_dp()


def _stage_dp() -> None:
    from planner.search.stage_dp import slice_stages

    costs = [1.0 + 0.01 * (i % 7) for i in range(80)]
    for stages in (4, 8, 16):
        start = time.perf_counter()
        counts = slice_stages(costs, [1.0] * 80, stages, 64, 1e18, first_extra_s=2.0, last_extra_s=3.0)
        print(f"stage DP: 80 layers -> {stages} stages in {time.perf_counter() - start:.3f} s: {counts}")


if __name__ == "__main__":
    main()
