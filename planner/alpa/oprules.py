"""Per-ATen-op rules: operator kind, FLOPs, bytes and dim correspondences (used by ``trace.py``).

FLOP counts (forward): linear 2·m·n·k (one multiply-add = 2 FLOPs); matmul the same per
batch; scaled dot-product attention 4·b·h·s_q·s_k·d (Q·K^T and P·V, as in PaLM's 12·L·H·Q·T
per token for forward + backward; the causal mask is not discounted); elementwise and
normalisation ops one FLOP per output element (they are bound by memory traffic anyway).
"""

from __future__ import annotations

import torch

from . import dims
from .dims import numel, tensor_bytes

SPLIT_OPS = {"split", "split_with_sizes", "chunk", "unbind", "tensor_split"}
VIEW_OPS = {"getitem", "view", "_unsafe_view", "reshape", "expand", "transpose", "permute", "t", "unsqueeze", "squeeze",
            "alias", "detach", "select", "slice", "unflatten", "flatten", "lift_fresh_copy", "view_as"}
COPY_OPS = {"_to_copy", "to", "clone", "contiguous", "type_as", "dropout", "native_dropout", "float",
            "repeat_interleave", "stack", "cat"}
PARTIAL_OK = VIEW_OPS | {"_to_copy", "to", "clone", "contiguous", "type_as", "add", "sub", "neg", "cat", "stack",
                         "float"}
NORM_OPS = {"layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm"}
SOFTMAX_OPS = {"softmax", "_softmax", "log_softmax", "_log_softmax"}
MATMUL_OPS = {"matmul", "bmm", "mm"}
ATTENTION_OPS = {"scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
                 "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention_for_cpu"}
CREATION_OPS = {"arange", "zeros", "ones", "full", "empty", "zeros_like", "ones_like", "full_like", "rand",
                "randn", "scalar_tensor", "new_zeros", "new_ones", "new_full", "new_empty"}


def op_name(fx_node) -> str:
    if fx_node.op != "call_function":
        return fx_node.op
    target = fx_node.target
    name = getattr(target, "__name__", str(target))
    return name.split(".")[0]


def _shape(v) -> list[int]:
    return [int(s) for s in v.shape]


def _is_pointwise(fx_node) -> bool:
    return torch.Tag.pointwise in getattr(fx_node.target, "tags", ())


def _follow(fx_node, name: str, val, in_nodes, in_args) -> list | None:
    """Dim map per tensor input, or None when the op is not shape-following."""
    out = _shape(val)
    shapes = [n["shape"] for n in in_nodes]
    args = fx_node.args
    if not shapes:
        return None
    src = shapes[0]
    if name == "getitem":  # one piece of a split: a slice along the split dim
        split = args[0]
        if op_name(split) == "unbind":
            return [dims.remove_map(len(src), [split.args[1] if len(split.args) > 1 else 0])]
        dim = split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0)
        return [dims.identity_map(len(src), [dim])]
    if name in ("view", "_unsafe_view", "reshape", "flatten", "unflatten", "view_as"):
        return [dims.reshape_map(src, out)]
    if name in ("transpose",):
        perm = list(range(len(src)))
        a, b = args[1] % len(src), args[2] % len(src)
        perm[a], perm[b] = perm[b], perm[a]
        return [dims.permute_map(perm, len(src))]
    if name == "t":
        return [[1, 0][:len(src)]]
    if name == "permute":
        return [dims.permute_map(args[1], len(src))]
    if name == "unsqueeze":
        return [dims.insert_map(len(src), args[1])]
    if name == "squeeze":
        gone = [d for d in range(len(src)) if src[d] == 1] if len(args) < 2 else \
            [d for d in (args[1] if isinstance(args[1], (list, tuple)) else [args[1]]) if src[d] == 1]
        return [dims.remove_map(len(src), gone)]
    if name == "select":
        return [dims.remove_map(len(src), [args[1]])]
    if name in ("slice", "cat"):
        dim = args[1] if len(args) > 1 else 0
        return [dims.identity_map(len(s), [dim]) for s in shapes]
    if name == "stack":
        dim = (args[1] if len(args) > 1 else 0) % len(out)
        return [dims.insert_map(len(s), dim) for s in shapes]
    if name == "repeat_interleave":
        return [dims.identity_map(len(src))]  # block-sharded input dims repeat into block shards
    if name == "expand":
        return [dims.broadcast_map(src, out)]
    if name in COPY_OPS or name in NORM_OPS or name in SOFTMAX_OPS or _is_pointwise(fx_node):
        return [dims.broadcast_map(s, out) for s in shapes]
    return None


def _blocked(name: str, fx_node, val) -> list[int]:
    n = len(val.shape)
    if name in NORM_OPS:
        return list(range(n - len(fx_node.args[1]), n))
    if name in SOFTMAX_OPS:
        return [fx_node.args[1] % n]
    if name == "repeat_interleave":
        return []
    return []


def _kind(name: str, fx_node, in_nodes, params) -> str:
    if name == "linear" and any(p["position"] == 1 for p in params):
        return "linear"
    if name == "embedding" and params:
        return "embedding"
    if name in MATMUL_OPS or name == "linear":
        return "matmul" if len(in_nodes) == 2 else "other"
    if name in ATTENTION_OPS:
        return "attention"
    if name in CREATION_OPS and not in_nodes:
        return "creation"
    return ""


def _flops(kind: str, val, in_nodes) -> int:
    out = numel(_shape(val))
    if kind in ("linear", "matmul"):
        k = in_nodes[0]["shape"][-1] if in_nodes else 0
        return 2 * out * k
    if kind == "attention":
        q, k = in_nodes[0]["shape"], in_nodes[1]["shape"]
        return 4 * numel(q[:-2]) * q[-2] * k[-2] * q[-1]
    return out


def _labels(kind: str, follow, val, in_nodes) -> list[str]:
    n = len(val.shape)
    if kind in ("linear", "embedding", "matmul"):
        base = in_nodes[0]["dim_labels"] if kind != "embedding" or in_nodes else []
        return (list(base[:n - 1]) + ["model"] * n)[:n - 1] + ["model"]
    if kind == "attention":
        return list(in_nodes[0]["dim_labels"])
    if follow:
        out = []
        for d in range(n):
            src = [(i, m[d]) for i, m in enumerate(follow) if m[d] is not None and m[d] >= 0]
            out.append(in_nodes[src[0][0]]["dim_labels"][src[0][1]] if src else "model")
        return out
    if in_nodes and in_nodes[0]["dim_labels"][:1] == ["batch"] and n and in_nodes[0]["shape"][0] == val.shape[0]:
        return ["batch"] + ["model"] * (n - 1)
    return ["model"] * n


def describe(fx_node, val, in_nodes: list[dict], in_args, params: list[dict]) -> dict:
    """Attributes of one op node (see ``trace.py`` for the list)."""
    name = op_name(fx_node)
    kind = _kind(name, fx_node, in_nodes, params)
    follow = None
    if not kind:
        follow = _follow(fx_node, name, val, in_nodes, in_args)
        kind = ("view" if name in VIEW_OPS else "follow") if follow is not None else "other"
    for p in params:
        p["role"] = "bias" if (kind == "linear" and p["position"] == 2) else "weight"
    out_bytes = numel(_shape(val)) * val.element_size()
    in_bytes = sum(tensor_bytes(n["shape"], n["dtype"]) for n in in_nodes)
    in_bytes += sum(numel(p["shape"]) * p["itemsize"] for p in params)
    labels = _labels(kind, follow, val, in_nodes)
    batch_leading = bool(in_nodes) and all(n["dim_labels"][:1] == ["batch"] and n["shape"][0] == val.shape[0]
                                           for n in in_nodes if n["shape"])
    is_view = kind == "view"
    return {"kind": "follow" if is_view else kind, "is_view": is_view, "flops": 0 if is_view else _flops(kind, val, in_nodes),
            "bytes_read": 0 if is_view else in_bytes, "bytes_written": 0 if is_view else out_bytes,
            "follow": follow or [], "dim_labels": labels,
            "args": {"blocked_dims": _blocked(name, fx_node, val), "partial_ok": name in PARTIAL_OK,
                     "inputs_batch_leading": batch_leading}}


def add_getitem(graph, fx_node, alias: dict, params) -> None:
    """``getitem(op, 0)`` of a multi-output op (attention, dropout, layer norm) is the op itself."""
    src, index = fx_node.args[0], fx_node.args[1]
    if index == 0 and src.name in graph:
        alias[fx_node.name] = src.name
