"""Tracing on the meta device: shapes, FLOPs, parameter ownership, repeated blocks, JSON."""

from __future__ import annotations

import json

import pytest

import test_alpa_fixtures as fx


@pytest.fixture(scope="module")
def mlp_graph():
    from planner.alpa.trace import token_inputs, trace_module

    return trace_module(fx.Mlp(hidden=64, ffn=256, vocab=128), token_inputs((8, 16)))


def _by_module(graph, fqn):
    return [d for _, d in graph.nodes(data=True) if d["module"] == fqn and d["params"]][0]


def test_linear_flops_bytes_and_params(mlp_graph):
    up = _by_module(mlp_graph, "up")
    assert up["kind"] == "linear" and up["shape"] == [8, 16, 256]
    assert up["flops"] == 2 * 8 * 16 * 64 * 256  # 2·m·n·k
    assert {p["name"]: p["role"] for p in up["params"]} == {"up.weight": "weight", "up.bias": "bias"}
    assert up["bytes_written"] == 8 * 16 * 256 * 4
    assert up["bytes_read"] == (8 * 16 * 64 + 256 * 64 + 256) * 4
    emb = _by_module(mlp_graph, "embed")
    assert emb["kind"] == "embedding" and emb["dim_labels"] == ["batch", "seq", "model"]


def test_every_parameter_is_owned_once(mlp_graph):
    from planner.alpa.graph import totals

    owned = [p["name"] for _, d in mlp_graph.nodes(data=True) for p in d["params"]]
    assert sorted(owned) == sorted(n for n, _ in fx.Mlp(64, 256, 128).named_parameters())
    assert totals(mlp_graph)["num_params"] == sum(p.numel() for p in fx.Mlp(64, 256, 128).parameters())


def test_big_model_traces_without_memory():
    """A 70B-class layer stack traces on the meta device: nothing is allocated."""
    import dataclasses

    import torch

    from costmodels.presets import load_model
    from planner.alpa.graph import totals
    from planner.alpa.trace import token_inputs, trace_module
    from planner.launch.torchjob.model import build_model

    spec = dataclasses.replace(load_model("llama3-70b"), num_layers=2)
    graph = trace_module(build_model(spec, device="meta", dtype=torch.bfloat16), token_inputs((8, 2048)))
    from costmodels.params import total_params

    assert totals(graph)["num_params"] == total_params(spec)  # the cost model's closed form
    assert totals(graph)["num_params"] > 3.2e9  # two 70B layers (0.86B each) plus 2 x 128k x 8k tables


def test_repeated_blocks_are_detected_by_structure():
    from planner.alpa.graph import find_blocks
    from planner.alpa.trace import token_inputs, trace_module

    graph = trace_module(fx.Tower(depth=4), token_inputs((2, 8)))
    blocks = find_blocks(graph)
    assert blocks.members == ("trunk.0", "trunk.1", "trunk.2", "trunk.3")
    assert len({len(n) for n in blocks.nodes}) == 1
    rep = blocks.representative()
    assert all(graph.nodes[n]["op"] == graph.nodes[rep[n]]["op"] for n in rep)
    assert find_blocks(trace_module(fx.Mlp(), token_inputs((2, 8)))) is None


def test_graph_json_round_trip(mlp_graph):
    from planner.alpa.graph import from_json, to_json

    text = to_json(mlp_graph)
    doc = json.loads(text)
    assert doc["schema_version"] == 1 and doc["totals"]["num_ops"] == mlp_graph.number_of_nodes()
    again = from_json(text)
    assert list(again.nodes) == list(mlp_graph.nodes)
    assert sorted(again.edges) == sorted(mlp_graph.edges)
    assert to_json(again) == text


def test_untraceable_module_is_a_one_line_error():
    from autoplan_base.errors import AutoplanError
    from planner.alpa.trace import token_inputs, trace_module

    with pytest.raises(AutoplanError, match="cannot trace"):
        trace_module(fx.DataDependent(), token_inputs((2, 4)), name="--module x:y")


def test_split_pieces_keep_their_edges():
    """q, k, v cut from one fused projection all reach attention, each a slice of the linear."""
    from planner.alpa.trace import token_inputs, trace_module

    graph = trace_module(fx.FusedQKV(), token_inputs((2, 8)))
    attention = [n for n, d in graph.nodes(data=True) if d["kind"] == "attention"][0]
    qkv = [n for n, d in graph.nodes(data=True) if d["module"] == "qkv"][0]
    assert len(graph.nodes[attention]["inputs"]) == 3
    pieces = [n for n in graph.successors(qkv)]
    assert len(pieces) == 3 and all(graph.nodes[n]["shape"] == [2, 8, 32] for n in pieces)
    assert all(graph.nodes[n]["follow"] == [[0, 1, None]] for n in pieces)  # the split dim is not shardable
    assert all(nx_has_path(graph, n, attention) for n in pieces)


def nx_has_path(graph, a, b) -> bool:
    import networkx as nx

    return nx.has_path(graph, a, b)


def test_plan_styles_parse_and_map_to_pytorch():
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel

    from autoplan_base.errors import AutoplanError
    from planner.launch.torchjob.tp_styles import parallel_styles, parse_style

    assert parse_style("colwise;input=shard(1);output=replicate") == (
        "colwise", {"input": "shard(1)", "output": "replicate"})
    model = fx.Tower(depth=2)
    styles = parallel_styles(model, {"lookup": "rowwise", "trunk.0.inner": "colwise;input=shard(1)",
                                     "trunk.0": "prepare_input;input=shard(1)", "proj": "replicate",
                                     "trunk.9.inner": "colwise"}, skip_missing=True)
    assert set(styles) == {"lookup", "trunk.0.inner", "trunk.0"}
    assert isinstance(styles["lookup"], RowwiseParallel) and styles["lookup"].input_layouts == (Replicate(),)
    assert isinstance(styles["trunk.0.inner"], ColwiseParallel) and styles["trunk.0.inner"].input_layouts == (Shard(1),)
    assert isinstance(styles["trunk.0"], PrepareModuleInput)
    with pytest.raises(AutoplanError, match="no module"):
        parallel_styles(model, {"trunk.9.inner": "colwise"})
    with pytest.raises(AutoplanError, match="unknown style"):
        parse_style("diagonal")
