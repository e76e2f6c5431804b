"""Operator graphs (networkx): repeated-block detection, layers, JSON (pure Python, no torch).

Repeated blocks are found, not named: every module in the ops' ``module_stack`` is a
candidate; siblings (same parent) whose op sequences are identical (op, shapes, dtypes,
relative module paths, wiring) form a run of repeated blocks; the run covering the most ops
wins. For a transformer this finds ``layers.0`` ... ``layers.{L-1}`` whatever they are called.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import networkx as nx

GRAPH_SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Blocks:
    """A run of identical blocks: ``members[i]`` is the module fqn, ``nodes[i]`` its ops in order."""

    members: tuple[str, ...]
    nodes: tuple[tuple[str, ...], ...]

    @property
    def count(self) -> int:
        return len(self.members)

    def representative(self) -> dict[str, str]:
        """Op name -> the op at the same position in the first block (identity outside blocks)."""
        rep = {}
        for member_nodes in self.nodes:
            for n, first in zip(member_nodes, self.nodes[0]):
                rep[n] = first
        return rep


def _module_nodes(graph: nx.DiGraph) -> dict[str, list[str]]:
    by_module: dict[str, list[str]] = {}
    for n, data in graph.nodes(data=True):
        for fqn in data.get("module_stack", []):
            by_module.setdefault(fqn, []).append(n)
    return by_module


def _signature(graph: nx.DiGraph, fqn: str, nodes: list[str]) -> tuple:
    position = {n: i for i, n in enumerate(nodes)}
    external: dict[str, int] = {}
    sig = []
    for n in nodes:
        d = graph.nodes[n]
        rel = [m[len(fqn):] for m in d["module_stack"] if m.startswith(fqn)]
        wires = tuple(("in", position[i]) if i in position else ("ext", external.setdefault(i, len(external)))
                      for i in d["inputs"])
        sig.append((d["op"], tuple(d["shape"]), d["dtype"], tuple(rel), wires,
                    tuple((p["name"][len(fqn):], tuple(p["shape"])) for p in d["params"])))
    return tuple(sig)


def find_blocks(graph: nx.DiGraph) -> Blocks | None:
    """The longest run of consecutive identical sibling modules, or None."""
    by_module = _module_nodes(graph)
    groups: dict[tuple[str, tuple], list[str]] = {}
    for fqn, nodes in by_module.items():
        parent = fqn.rsplit(".", 1)[0] if "." in fqn else ""
        groups.setdefault((parent, _signature(graph, fqn, nodes)), []).append(fqn)
    best = None
    for (_, _), members in groups.items():
        if len(members) < 2:
            continue
        covered = len(members) * len(by_module[members[0]])
        if best is None or covered > best[0]:
            best = (covered, members)
    if best is None:
        return None
    order = {n: i for i, n in enumerate(graph.nodes)}
    members = sorted(best[1], key=lambda m: order[by_module[m][0]])
    return Blocks(members=tuple(members), nodes=tuple(tuple(by_module[m]) for m in members))


def layer_of(graph: nx.DiGraph, blocks: Blocks | None) -> dict[str, str]:
    """Each op's layer: ``pre``, the block's module fqn, or ``post`` (after the last block)."""
    out, seen_block = {}, False
    where = {n: m for m, ns in zip(blocks.members, blocks.nodes) for n in ns} if blocks else {}
    for n in graph.nodes:
        if n in where:
            out[n], seen_block = where[n], True
        else:
            out[n] = "post" if seen_block else "pre"
    return out


def to_json(graph: nx.DiGraph, blocks: Blocks | None = None) -> str:
    """Deterministic JSON: nodes in topological (trace) order with their attributes."""
    layers = layer_of(graph, blocks)
    nodes = [{"name": n, "layer": layers[n], **{k: v for k, v in sorted(d.items())}}
             for n, d in graph.nodes(data=True)]
    doc = {"schema_version": GRAPH_SCHEMA_VERSION, "nodes": nodes,
           "blocks": {"members": list(blocks.members), "ops_per_block": len(blocks.nodes[0])} if blocks else None,
           "totals": totals(graph)}
    return json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n"


def from_json(text: str) -> nx.DiGraph:
    doc = json.loads(text)
    graph = nx.DiGraph()
    for node in doc["nodes"]:
        attrs = {k: v for k, v in node.items() if k not in ("name", "layer")}
        graph.add_node(node["name"], **attrs)
    for node in doc["nodes"]:
        for i in node["inputs"]:
            graph.add_edge(i, node["name"])
    return graph


def totals(graph: nx.DiGraph) -> dict:
    """Forward FLOPs, parameter count and op count of the whole graph."""
    seen, params = set(), 0
    for _, d in graph.nodes(data=True):
        for p in d["params"]:
            if p["name"] not in seen:
                seen.add(p["name"])
                n = 1
                for s in p["shape"]:
                    n *= s
                params += n
    return {"forward_flops": sum(d["flops"] for _, d in graph.nodes(data=True)), "num_params": params,
            "num_ops": graph.number_of_nodes()}
