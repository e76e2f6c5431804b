"""Turn an operator graph into the numeric ILP ``Problem`` (optionally one block for all).

Per-block reuse: ops of block i > 0 are represented by the op at the same position in
block 0, so every block gets the same strategies and the ILP size does not grow with depth.
Identical tensor uses (same representative producer and consumers) are merged and their
weights summed; node weights count the repeats. The reduced objective is then exactly the
full graph's objective restricted to "every block the same" (a test checks this).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import networkx as nx

from .dims import tensor_bytes
from .graph import Blocks
from .mesh import Mesh, conversion_time_s, grad_wanted, placement_label
from .problem import Demand, Problem, TensorUse
from .strategies import CostContext, Strategy, node_strategies


@dataclass(frozen=True, slots=True, kw_only=True)
class Built:
    """The problem and what is needed to read its solution back onto the graph."""

    problem: Problem
    nodes: tuple[str, ...]
    """Graph op of each problem node (the block-0 op for reused blocks)."""
    strategies: tuple[tuple[Strategy, ...], ...]
    representative: dict
    """Graph op -> problem node index."""
    key_placements: tuple[tuple[tuple[str, tuple], ...], ...]
    """Per use, per demand key: ("fwd" | "bwd", the placement the consumers ask for)."""


PARAM_OP_KINDS = ("linear", "embedding")


def is_module_edge(data: dict) -> bool:
    """A linear or embedding op that is its own submodule (a PyTorch style can attach to it)."""
    return data["kind"] in PARAM_OP_KINDS and bool(data.get("module")) and any(
        p["name"].rsplit(".", 1)[0] == data["module"] for p in data["params"])


def is_styled(data: dict, strategy, mesh: Mesh) -> bool:
    """A module op whose strategy splits it on every module-level axis: it gets a PyTorch style,
    which can change the layout of its input (``input_layouts``) and output (``output_layouts``)."""
    atoms = strategy.name.split("|")
    return is_module_edge(data) and all(atom != "R" for atom, axis in zip(atoms, mesh.axes) if axis.module_level)


def _key_cost_s(src, dst, size, mesh, ctx, at_module_edge: bool) -> float:
    """Seconds to change ``src`` into ``dst``; infinite (forbidden) when a module-level axis
    would need the change away from a linear or embedding module, where no PyTorch parallel
    style can put it (ops between modules run on local tensors)."""
    if not at_module_edge and any(a.module_level and src[k] != dst[k] for k, a in enumerate(mesh.axes)):
        return math.inf
    return conversion_time_s(src, dst, size, mesh, ctx.cluster)


def _use(graph, u, consumers, index, strategies, mesh, ctx, weight):
    """Forward and backward demand keys of tensor ``u`` read by ``consumers`` [(op, input idx)]."""
    data = graph.nodes[u]
    size = tensor_bytes(data["shape"], data["dtype"])
    pu = index[u]
    producer_styled = [is_styled(data, p, mesh) for p in strategies[pu]]
    labels, costs, keymap, placements = [], [], {}, []
    demands = []
    for v, i in consumers:
        pv = index[v]
        for direction in ("fwd", "bwd") if data["requires_grad"] else ("fwd",):
            keys = []
            for st in strategies[pv]:
                want = st.ins[i] if direction == "fwd" else st.grads[i]
                styled = is_styled(graph.nodes[v], st, mesh)
                label = f"{direction}:{placement_label(want)}" + ("" if styled else ":unstyled")
                if label not in keymap:
                    keymap[label] = len(labels)
                    labels.append(label)
                    placements.append((direction, want))
                    costs.append(tuple(
                        _key_cost_s(p.out, want, size, mesh, ctx, styled or ps) if direction == "fwd"
                        else _key_cost_s(want, grad_wanted(p.out), size, mesh, ctx, styled or ps)
                        for p, ps in zip(strategies[pu], producer_styled)))
                keys.append(keymap[label])
            demands.append(Demand(consumer=pv, key_of_strategy=tuple(keys)))
    if not demands:
        return None
    return TensorUse(producer=pu, weight=weight, key_costs_s=tuple(costs), key_labels=tuple(labels),
                     demands=tuple(demands)), tuple(placements)


def _merged_uses(graph: nx.DiGraph, rep: dict) -> dict[tuple, int]:
    """(representative producer, frozenset of representative (consumer, input)) -> count."""
    merged: dict[tuple, int] = {}
    for u in graph.nodes:
        consumers = set()
        for v in graph.successors(u):
            for i, src in enumerate(graph.nodes[v]["inputs"]):
                if src == u:
                    consumers.add((rep.get(v, v), i))
        if consumers:
            key = (rep.get(u, u), frozenset(consumers))
            merged[key] = merged.get(key, 0) + 1
    return merged


def build_problem(graph: nx.DiGraph, mesh: Mesh, ctx: CostContext, *, blocks: Blocks | None = None,
                  memory_cap_bytes: float = float("inf")) -> Built:
    """The ILP of ``graph`` on ``mesh``; with ``blocks`` every block shares block 0's strategies."""
    rep = blocks.representative() if blocks else {}
    nodes = [n for n in graph.nodes if rep.get(n, n) == n]
    index = {n: i for i, n in enumerate(nodes)}
    weight = {n: 0 for n in nodes}
    for n in graph.nodes:
        weight[rep.get(n, n)] += 1
    strategies = []
    for n in nodes:
        sts = node_strategies(graph.nodes[n], mesh, ctx)
        if not sts:
            raise ValueError(f"op {n} ({graph.nodes[n]['op']}) has no valid strategy on this mesh")
        strategies.append(tuple(sts))
    uses, key_placements = [], []
    for (u, consumers), count in sorted(_merged_uses(graph, rep).items(), key=lambda kv: (index[kv[0][0]], sorted(kv[0][1]))):
        use = _use(graph, u, sorted(consumers, key=lambda c: (index[c[0]], c[1])), index, strategies, mesh, ctx, count)
        if use is not None:
            uses.append(use[0])
            key_placements.append(use[1])
    problem = Problem(node_names=tuple(nodes), strategy_names=tuple(tuple(s.name for s in sts) for sts in strategies),
                      node_cost_s=tuple(tuple(s.compute_s + s.comm_s for s in sts) for sts in strategies),
                      node_memory_bytes=tuple(tuple(s.memory_bytes for s in sts) for sts in strategies),
                      node_weight=tuple(float(weight[n]) for n in nodes), uses=tuple(uses),
                      memory_cap_bytes=memory_cap_bytes)
    return Built(problem=problem, nodes=tuple(nodes), strategies=tuple(strategies),
                 representative={n: index[rep.get(n, n)] for n in graph.nodes},
                 key_placements=tuple(key_placements))
