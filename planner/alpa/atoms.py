"""Per-axis sharding choices ("atoms") of each operator kind, from its traced attributes.

An atom says, for one mesh axis, how each tensor input and the output are placed, whether
the work is split across the axis, and on which dim each parameter is sharded. Strategies on a
2-D mesh are products of atoms (``strategies.py``). Node attributes come from ``trace.py``:
``kind``, ``shape``, ``input_shapes``, ``params``, ``dim_labels``, ``follow`` and ``args``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GEMM_KINDS = frozenset({"linear", "embedding", "matmul", "attention"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Atom:
    name: str
    ins: tuple
    """Per tensor input: "R", "P" or a shard dim."""
    out: object
    split: bool
    """The operator's work is divided across the axis."""
    tag: str
    """Strategy family: replicate | batch | seq | seq_gemm | model."""
    param_dims: dict = field(default_factory=dict)
    """Parameter name -> sharded dim (absent = replicated)."""


def _data_tag(node: dict, dim: int) -> str:
    label = node["dim_labels"][dim] if dim < len(node["dim_labels"]) else "model"
    if label == "batch":
        return "batch"
    if label == "seq":
        return "seq_gemm" if node["kind"] in GEMM_KINDS else "seq"
    return "model"


def _replicate(node: dict) -> Atom:
    return Atom(name="R", ins=("R",) * len(node["input_shapes"]), out="R", split=False, tag="replicate")


def _param_named(node: dict, role: str) -> list[str]:
    return [p["name"] for p in node["params"] if p["role"] == role]


def linear_atoms(node: dict) -> list[Atom]:
    """y = x W^T (+ b): replicate, shard token dims, column-parallel, row-parallel (Megatron)."""
    n = len(node["shape"])
    w, b = _param_named(node, "weight"), _param_named(node, "bias")
    atoms = [_replicate(node)]
    atoms += [Atom(name=f"S{d}", ins=(d,), out=d, split=True, tag=_data_tag(node, d)) for d in range(n - 1)]
    atoms.append(Atom(name="col", ins=("R",), out=n - 1, split=True, tag="model",
                      param_dims={**{p: 0 for p in w}, **{p: 0 for p in b}}))
    atoms.append(Atom(name="row", ins=(n - 1,), out="P", split=True, tag="model", param_dims={p: 1 for p in w}))
    return atoms


def embedding_atoms(node: dict) -> list[Atom]:
    """Table lookup: replicate, shard index dims, split the vocabulary (partial output) or hidden."""
    n = len(node["shape"])
    w = _param_named(node, "weight")
    atoms = [_replicate(node)]
    atoms += [Atom(name=f"S{d}", ins=(d,), out=d, split=True, tag=_data_tag(node, d)) for d in range(n - 1)]
    atoms.append(Atom(name="vocab", ins=("R",), out="P", split=True, tag="model", param_dims={p: 0 for p in w}))
    atoms.append(Atom(name="hidden", ins=("R",), out=n - 1, split=True, tag="model", param_dims={p: 1 for p in w}))
    return atoms


def matmul_atoms(node: dict) -> list[Atom]:
    """a @ b with equal ranks: batch dims, rows of a, columns of b, or the contraction (partial)."""
    sa, sb = node["input_shapes"][:2]
    n = len(node["shape"])
    atoms = [_replicate(node)]
    if len(sa) != len(sb) or len(node["input_shapes"]) != 2:
        return atoms
    atoms += [Atom(name=f"S{d}", ins=(d, d), out=d, split=True, tag=_data_tag(node, d)) for d in range(n - 2)]
    atoms.append(Atom(name="m", ins=(n - 2, "R"), out=n - 2, split=True, tag=_data_tag(node, n - 2)))
    atoms.append(Atom(name="n", ins=("R", n - 1), out=n - 1, split=True, tag="model"))
    atoms.append(Atom(name="k", ins=(n - 1, n - 2), out="P", split=True, tag="model"))
    return atoms


def attention_atoms(node: dict) -> list[Atom]:
    """Fused attention on [b, heads, s, d]: replicate, shard batch, or shard heads."""
    k = len(node["input_shapes"])
    extra = ("R",) * (k - 3)
    return [_replicate(node),
            Atom(name="S0", ins=(0, 0, 0, *extra), out=0, split=True, tag=_data_tag(node, 0)),
            Atom(name="S1", ins=(1, 1, 1, *extra), out=1, split=True, tag="model")]


def follow_atoms(node: dict) -> list[Atom]:
    """Ops that keep a dim-to-dim correspondence (views, elementwise, norms, softmax):
    shard any output dim every input can follow (broadcast inputs stay replicated); pass
    partial sums through ops that are linear in their inputs."""
    follow = node["follow"]
    atoms = [_replicate(node)]
    blocked = set(node["args"].get("blocked_dims", ()))
    for d in range(len(node["shape"])):
        if d in blocked or any(m[d] is None for m in follow):
            continue
        if all(m[d] == -1 for m in follow) and follow:
            continue
        ins = tuple("R" if m[d] == -1 else m[d] for m in follow)
        atoms.append(Atom(name=f"S{d}", ins=ins, out=d, split=True, tag=_data_tag(node, d)))
    if node["args"].get("partial_ok") and follow and all(all(x != -1 for x in m) for m in follow):
        atoms.append(Atom(name="P", ins=("P",) * len(follow), out="P", split=False, tag="model"))
    return atoms


def source_atoms(node: dict) -> list[Atom]:
    """Inputs and constants: each device materialises its own part, any layout is free."""
    atoms = [_replicate(node)]
    atoms += [Atom(name=f"S{d}", ins=(), out=d, split=True, tag=_data_tag(node, d)) for d in range(len(node["shape"]))]
    return atoms


def output_atoms(node: dict) -> list[Atom]:
    """The graph output (the loss reads it): replicated, or split by batch (data parallel)."""
    atoms = [_replicate(node)]
    if node["input_shapes"] and len(node["input_shapes"][0]) > 0:
        atoms.append(Atom(name="S0", ins=(0,) + ("R",) * (len(node["input_shapes"]) - 1), out=0,
                          split=True, tag="batch"))
    return atoms


def other_atoms(node: dict) -> list[Atom]:
    """Unknown ops: replicated, or split by batch when every input and the output lead with it."""
    atoms = [_replicate(node)]
    shapes = node["input_shapes"]
    labels_ok = node["dim_labels"][:1] == ["batch"] and node["args"].get("inputs_batch_leading", False)
    if labels_ok and shapes:
        atoms.append(Atom(name="S0", ins=(0,) * len(shapes), out=0, split=True, tag="batch"))
    return atoms


ATOMS_BY_KIND = {
    "linear": linear_atoms, "embedding": embedding_atoms, "matmul": matmul_atoms,
    "attention": attention_atoms, "follow": follow_atoms, "input": source_atoms,
    "creation": source_atoms, "output": output_atoms, "other": other_atoms,
}
