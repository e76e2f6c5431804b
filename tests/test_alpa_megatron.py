"""Megatron rediscovered: the ILP on autoplan's own Llama/GPT blocks (the model ``launch`` trains).

Megatron-LM (Shoeybi et al. 2019, section 3): q/k/v and the MLP up/gate projections split by
columns, the attention output and MLP down projections by rows; per block in forward two
all-reduces, or with sequence parallelism (Korthikanti et al. 2022) two all-gather /
reduce-scatter pairs of the same volume.
"""

from __future__ import annotations

import dataclasses

import pytest

from costmodels.presets import load_model

COLWISE = ("attention.wq", "attention.wk", "attention.wv", "feed_forward.w1", "feed_forward.w3")
ROWWISE = ("attention.wo", "feed_forward.w2")
MEGATRON = ({"tp:all_reduce": 2}, {"tp:all_gather": 2, "tp:reduce_scatter": 2})


def _traced(preset: str, layers: int):
    import torch

    from planner.alpa.trace import token_inputs, trace_module
    from planner.launch.torchjob.model import build_model

    spec = dataclasses.replace(load_model(preset), num_layers=layers)
    return trace_module(build_model(spec, device="meta", dtype=torch.bfloat16), token_inputs((1, 2048)))


@pytest.fixture(scope="module")
def llama_graph():
    return _traced("llama3-8b", 2)


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_llama_block_gets_megatron_plan(llama_graph, tp):
    from planner.alpa.shard import shard_graph

    report = shard_graph(llama_graph, tp=tp).report
    for block in ("layers.0", "layers.1"):
        for name in COLWISE:
            assert report.tp_plan[f"{block}.{name}"].split(";")[0] == "colwise", name
        for name in ROWWISE:
            assert report.tp_plan[f"{block}.{name}"].split(";")[0] == "rowwise", name
    forward = report.collectives_per_block["forward"]
    assert forward in MEGATRON
    # the backward mirrors the forward: f and g of Megatron swap roles
    backward = {k: v for k, v in report.collectives_per_block["backward"].items() if "(grad)" not in k}
    assert backward in MEGATRON
    assert report.unexpressible == []
    assert report.solver["status"] == "optimal"


def test_gpt_block_with_tied_embeddings_gets_megatron_plan():
    """GPT-3 6.7B: tied output projection and a vocabulary not divisible by 8; still Megatron."""
    from planner.alpa.shard import shard_graph

    report = shard_graph(_traced("gpt3-6.7b", 2), tp=8).report
    for name in ("attention.wq", "attention.wk", "attention.wv", "feed_forward.w1"):
        assert report.tp_plan[f"layers.0.{name}"].split(";")[0] == "colwise"
    for name in ROWWISE:
        assert report.tp_plan[f"layers.0.{name}"].split(";")[0] == "rowwise"
    assert report.collectives_per_block["forward"] in MEGATRON


def test_memory_per_device_falls_with_tp(llama_graph):
    from planner.alpa.shard import shard_graph

    mem = [shard_graph(llama_graph, tp=tp).report.cost["memory_gib_per_device"] for tp in (2, 8)]
    assert mem[1] < mem[0] / 2.5
