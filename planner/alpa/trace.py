"""Trace an ``nn.Module`` on the meta device into an operator graph (the only torch module here).

``torch.export.export(..., strict=False)`` gives the ATen graph with fake tensors (shapes and
dtypes, no memory) and ``nn_module_stack`` (the module each op ran in). Each op becomes a
networkx node with: kind, op, shape, dtype, input_shapes, params (name, shape, role, itemsize),
flops, bytes_read, bytes_written, module, module_stack, dim_labels, follow, args, requires_grad.
"""

from __future__ import annotations

import contextlib
import io
import logging
import operator

import networkx as nx
import torch

from autoplan_base.errors import AutoplanError
from planner.launch.torchjob.user_model import build_on_meta

from . import oprules
from .dims import numel

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int64: "int64",
                torch.int32: "int32", torch.bool: "bool", torch.float64: "fp64", torch.complex64: "complex64"}


def build_from_factory(path: str, dtype: str = "fp32") -> torch.nn.Module:
    """Call the factory under the meta device (no weights allocated), cast to ``dtype``."""
    return build_on_meta(path).to(dtype=DTYPES[dtype])


def token_inputs(shape: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    """Token ids of ``shape`` (e.g. (batch, seq)) on the meta device."""
    return (torch.zeros(shape, dtype=torch.long, device="meta"),)


def trace_module(module: torch.nn.Module, inputs: tuple, *, name: str = "module") -> nx.DiGraph:
    """Export ``module`` on ``inputs`` and convert the ATen graph to an operator DiGraph."""
    module = module.to(device="meta")
    try:
        with _quiet_torch():
            exported = torch.export.export(module, inputs, strict=False)
    except Exception as err:  # noqa: BLE001 - torch raises many types for untraceable code
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise AutoplanError(f"{name}: cannot trace the module with torch.export "
                            f"({type(err).__name__}: {first[:200]})") from None
    return _to_graph(exported)


@contextlib.contextmanager
def _quiet_torch():
    """torch.export logs whole graphs when it fails; the CLI prints one line instead."""
    loggers = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)
               if name == "torch" or name.startswith("torch.")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _dtype_name(dtype) -> str:
    return _DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))


def _val(node):
    val = node.meta.get("val")
    if isinstance(val, (tuple, list)):
        val = val[0] if val and isinstance(val[0], torch.Tensor) else None
    return val if isinstance(val, torch.Tensor) else None


def _module_info(node) -> tuple[str, list[str], str]:
    stack = node.meta.get("nn_module_stack") or {}
    fqns = [v[0] for v in stack.values() if v[0]]
    types = [v[1] for v in stack.values() if v[0]]
    leaf_type = types[-1] if types else ""
    leaf_type = leaf_type.__name__ if isinstance(leaf_type, type) else str(leaf_type).rsplit(".", 1)[-1]
    return (fqns[-1] if fqns else ""), fqns, leaf_type


def _to_graph(exported) -> nx.DiGraph:
    sig = exported.graph_signature
    params = dict(sig.inputs_to_parameters) | dict(sig.inputs_to_buffers)
    graph = nx.DiGraph(batch_size=None)
    alias: dict[str, str] = {}  # fx name -> graph op it stands for (getitem 0, split inputs)
    for fx_node in exported.graph_module.graph.nodes:
        if fx_node.op == "placeholder":
            if fx_node.name not in params:
                _add_input(graph, fx_node)
            continue
        if fx_node.op == "output":
            _add_output(graph, fx_node, alias)
            continue
        if fx_node.op != "call_function":
            continue
        if oprules.op_name(fx_node) in oprules.SPLIT_OPS:  # its pieces become slice-like ops
            source = fx_node.args[0]
            alias[fx_node.name] = alias.get(source.name, source.name)
            continue
        if fx_node.target is operator.getitem and oprules.op_name(fx_node.args[0]) not in oprules.SPLIT_OPS:
            oprules.add_getitem(graph, fx_node, alias, params)
            continue
        _add_op(graph, fx_node, params, alias)
    return graph


def _add_input(graph: nx.DiGraph, fx_node) -> None:
    val = _val(fx_node)
    shape = list(val.shape) if val is not None else []
    labels = (["batch", "seq"] + ["model"] * len(shape))[:len(shape)]
    graph.add_node(fx_node.name, kind="input", op="input", shape=shape, dtype=_dtype_name(val.dtype),
                   input_shapes=[], params=[], flops=0, bytes_read=0,
                   bytes_written=numel(shape) * val.element_size(), module="", module_stack=[],
                   module_type="", inputs=[], dim_labels=labels, follow=[], args={}, requires_grad=False)


def _add_output(graph: nx.DiGraph, fx_node, alias) -> None:
    outs = [a for a in torch.utils._pytree.tree_leaves(fx_node.args) if isinstance(a, torch.fx.Node)]
    sources = [alias.get(a.name, a.name) for a in outs if alias.get(a.name, a.name) in graph]
    shapes = [graph.nodes[s]["shape"] for s in sources]
    graph.add_node("output", kind="output", op="output", shape=shapes[0] if shapes else [], dtype="",
                   input_shapes=shapes, params=[], flops=0, bytes_read=0, bytes_written=0, module="",
                   module_stack=[], module_type="", inputs=sources, dim_labels=[], follow=[], args={}, requires_grad=False)
    for i, s in enumerate(sources):
        graph.add_edge(s, "output", index=i)


def _add_op(graph: nx.DiGraph, fx_node, params: dict, alias: dict) -> None:
    val = _val(fx_node)
    if val is None:
        return
    tensor_args = [a for a in torch.utils._pytree.tree_leaves((fx_node.args, fx_node.kwargs))
                   if isinstance(a, torch.fx.Node) and _val(a) is not None]
    inputs, in_args, param_list = [], [], []
    for position, a in enumerate(tensor_args):
        if a.name in params:
            pv = _val(a)
            param_list.append({"name": params[a.name], "shape": list(pv.shape), "position": position,
                               "itemsize": pv.element_size()})
        elif alias.get(a.name, a.name) in graph:
            inputs.append(alias.get(a.name, a.name))
            in_args.append(a)
    module, stack, module_type = _module_info(fx_node)
    attrs = oprules.describe(fx_node, val, [graph.nodes[i] for i in inputs], in_args, param_list)
    requires_grad = bool(val.is_floating_point() and (param_list or any(graph.nodes[i]["requires_grad"] for i in inputs)))
    graph.add_node(fx_node.name, op=str(fx_node.target), shape=list(val.shape), dtype=_dtype_name(val.dtype),
                   input_shapes=[graph.nodes[i]["shape"] for i in inputs], params=param_list, module=module,
                   module_stack=stack, module_type=module_type, inputs=inputs, requires_grad=requires_grad, **attrs)
    for index, i in enumerate(inputs):
        graph.add_edge(i, fx_node.name, index=index)
