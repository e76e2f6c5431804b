"""Read an ILP solution back as a PyTorch tensor-parallel plan and collective counts.

Plan values name PyTorch's parallel styles, with non-default layouts after semicolons:
``colwise`` (ColwiseParallel), ``rowwise`` (RowwiseParallel), ``sequence_parallel``
(SequenceParallel), ``replicate`` (left whole), e.g. ``rowwise;output=shard(1)`` or
``colwise;input=shard(1);output=replicate``; ``prepare_input;input=shard(1)`` gathers a
module's input on entry (PrepareModuleInput to Replicate). A layout change the ILP puts at a module's
output (partial sums, or a split output) is that module's ``output=``; one it puts at a
linear or embedding input is that module's ``input=``. Any other layout change cannot be
written as a module-level plan and is listed under ``unexpressible``.
"""

from __future__ import annotations

from collections import Counter

import networkx as nx

from .build import Built, is_styled
from .graph import Blocks
from .mesh import Mesh, conversions, grad_wanted

PARAM_KINDS = ("linear", "embedding")


def _layout(p) -> str:
    return "replicate" if p == "R" else "partial" if p == "P" else f"shard({p})"


def _style(atom: str, kind: str) -> str | None:
    if kind == "linear":
        return {"col": "colwise", "row": "rowwise"}.get(atom)
    if kind == "embedding":
        return {"vocab": "rowwise", "hidden": "colwise"}.get(atom)
    return None


def _defaults(style: str, kind: str, ndim: int) -> tuple:
    """PyTorch's default (input, output) layouts of a style (embedding inputs are indices)."""
    if style == "colwise":
        return "R", ndim - 1
    return ("R" if kind == "embedding" else ndim - 1), "R"


class _Reader:
    def __init__(self, graph: nx.DiGraph, built: Built, choice, mesh: Mesh, axis: int):
        self.graph, self.built, self.choice, self.mesh, self.axis = graph, built, choice, mesh, axis

    def strategy(self, n):
        i = self.built.representative[n]
        return self.built.strategies[i][self.choice[i]]

    def atom(self, n) -> str:
        return self.strategy(n).name.split("|")[self.axis]

    def out(self, n):
        return self.strategy(n).out[self.axis]

    def demands(self, n) -> set:
        wants = set()
        for v in self.graph.successors(n):
            for i, src in enumerate(self.graph.nodes[v]["inputs"]):
                if src == n:
                    wants.add(self.strategy(v).ins[i][self.axis])
        return wants


def _module_entry(r: _Reader, n: str, issues: list) -> str | None:
    d = r.graph.nodes[n]
    if d["kind"] not in PARAM_KINDS:
        if d["params"] and d["kind"] == "follow":
            return "sequence_parallel" if isinstance(r.out(n), int) else "replicate"
        return None
    style = _style(r.atom(n), d["kind"])
    if style is None:
        return "replicate"
    default_in, default_out = _defaults(style, d["kind"], len(d["shape"]))
    parts = [style]
    src = d["inputs"][0] if d["inputs"] else None
    if src is not None and r.out(src) != default_in and not is_styled(r.graph.nodes[src], r.strategy(src), r.mesh):
        parts.append(f"input={_layout(r.out(src))}")  # a styled producer converts on its output instead
    wants = r.demands(n)
    if len(wants) > 1:
        issues.append(f"{d['module']}: consumers want several layouts {sorted(map(str, wants))}")
    want = sorted(wants, key=str)[0] if wants else r.out(n)
    if want == "P":
        issues.append(f"{d['module']}: partial output is never reduced")
    elif want != default_out:
        parts.append(f"output={_layout(want)}")
    return ";".join(parts)


def _boundary_ok(r: _Reader, u: str, v: str, want) -> bool:
    """Whether the change of ``u``'s output to ``want`` for consumer ``v`` sits at a module edge."""
    if r.out(u) == want:
        return True
    mesh = r.mesh
    return is_styled(r.graph.nodes[u], r.strategy(u), mesh) or is_styled(r.graph.nodes[v], r.strategy(v), mesh)


def tp_plan(graph: nx.DiGraph, built: Built, choice, mesh: Mesh, axis_name: str = "tp") -> tuple[dict, list[str]]:
    """({module fqn: style}, [layout changes no module-level plan can express])."""
    names = [a.name for a in mesh.axes]
    axis = names.index(axis_name) if axis_name in names else len(names) - 1
    r = _Reader(graph, built, choice, mesh, axis)
    plan, issues = {}, []
    for n, d in graph.nodes(data=True):
        if not d.get("module") or not d["params"]:
            continue
        entry = _module_entry(r, n, issues)
        if entry is not None:
            plan[d["module"]] = entry
    for u in graph.nodes:
        for v in graph.successors(u):
            for i, src in enumerate(graph.nodes[v]["inputs"]):
                if src == u and not _boundary_ok(r, u, v, r.strategy(v).ins[i][axis]):
                    issues.append(f"{u} -> {v}: {_layout(r.out(u))} to {_layout(r.strategy(v).ins[i][axis])} "
                                  f"inside a module")
    for u in graph.nodes:
        _hoist_gather(r, u, plan)
    return dict(sorted(plan.items())), sorted(set(issues))


def _hoist_gather(r: _Reader, u: str, plan: dict) -> None:
    """Gather a sharded input once where it enters the enclosing module (PrepareModuleInput),
    as torchtitan does for attention and MLP under sequence parallelism, instead of in each of
    q, k, v: code in that module which reads shapes off its input then sees full sizes."""
    graph = r.graph
    uses = [(v, i) for v in graph.successors(u) for i, src in enumerate(graph.nodes[v]["inputs"]) if src == u]
    gathered = [v for v, i in uses if is_styled(graph.nodes[v], r.strategy(v), r.mesh)
                and r.strategy(v).ins[i][r.axis] == "R"]
    if not isinstance(r.out(u), int) or len(gathered) < 2:
        return
    producer_stack = set(graph.nodes[u]["module_stack"])
    outers = {next((m for m in graph.nodes[v]["module_stack"] if m not in producer_stack), None) for v in gathered}
    if len(outers) != 1 or None in outers:
        return
    outer = outers.pop()
    inside = {n for n, d in graph.nodes(data=True) if outer in d["module_stack"]}
    external = {src for n in inside for src in graph.nodes[n]["inputs"] if src not in inside}
    if external != {u} or any(v in inside and r.strategy(v).ins[i][r.axis] != "R" for v, i in uses):
        return
    plan[outer] = f"prepare_input;input={_layout(r.out(u))}"
    for v in gathered:
        fqn = graph.nodes[v]["module"]
        plan[fqn] = ";".join(part for part in plan[fqn].split(";") if not part.startswith("input="))


def count_collectives(graph: nx.DiGraph, built: Built, choice, mesh: Mesh, blocks: Blocks | None) -> dict:
    """Collectives of one block (or the whole graph without blocks), forward and backward.

    Keys are ``axis:collective``. Each demanded layout change of a tensor made in a block is
    counted once per tensor (as the ILP prices it); ``axis:all_reduce(grad)`` counts gradient all-reduces of parameters
    replicated on an axis that splits their op."""
    in_block = set(blocks.nodes[0]) if blocks else set(built.nodes)
    counts = {"forward": Counter(), "backward": Counter()}
    for use, placements in zip(built.problem.uses, built.key_placements):
        if built.nodes[use.producer] not in in_block:
            continue  # a tensor from before the blocks is converted once, not per block
        keys = {d.key_of_strategy[choice[d.consumer]] for d in use.demands
                if built.nodes[d.consumer] in in_block} - {-1}
        out = built.strategies[use.producer][choice[use.producer]].out
        for k in sorted(keys):
            direction, want = placements[k]
            src, dst = (out, want) if direction == "fwd" else (want, grad_wanted(out))
            for axis_name, op, _ in conversions(src, dst, 1.0, mesh):
                counts["forward" if direction == "fwd" else "backward"][f"{axis_name}:{op}"] += 1
    for i, n in enumerate(built.nodes):
        if n not in in_block:
            continue
        st = built.strategies[i][choice[i]]
        for p in graph.nodes[n]["params"]:
            for a, (atom, dims) in enumerate(zip(st.name.split("|"), st.param_dims)):
                if atom not in ("R", "P") and p["name"] not in dims and mesh.axes[a].degree > 1:
                    counts["backward"][f"{mesh.axes[a].name}:all_reduce(grad)"] += 1
    return {k: dict(sorted(v.items())) for k, v in counts.items()}
