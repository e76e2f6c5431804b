"""``shard`` picks the same sharding with HiGHS and with CBC (llama3-8b, tp 2, 4 and 8)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from costmodels.presets import load_model  # noqa: E402
from planner.alpa import trace  # noqa: E402
from planner.alpa.shard import shard_graph  # noqa: E402
from planner.launch.torchjob.model import build_model  # noqa: E402


@pytest.fixture(scope="module")
def llama3_8b_graph():
    module = build_model(load_model("llama3-8b"), device="meta", dtype=trace.DTYPES["bf16"])
    return trace.trace_module(module, trace.token_inputs((1, 2048)), name="llama3-8b")


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_highs_and_cbc_choose_the_same_sharding(llama3_8b_graph, tp):
    highs = shard_graph(llama3_8b_graph, tp=tp, solver="highs").report.to_dict()
    cbc = shard_graph(llama3_8b_graph, tp=tp, solver="cbc").report.to_dict()
    assert highs["solver"]["name"] == "highs" and cbc["solver"]["name"] == "cbc"
    assert highs["strategies"] == cbc["strategies"]
    assert highs["tp_plan"] == cbc["tp_plan"]
    assert highs["cost"]["objective_s"] == pytest.approx(cbc["cost"]["objective_s"], rel=1e-9)


@pytest.mark.parametrize("limit", [float("nan"), float("inf"), 0.0])
def test_a_time_limit_that_is_no_limit_is_refused_before_solving(limit):
    """The API refuses what ``shard --time-limit`` refuses (a non-finite or non-positive limit)."""
    import networkx as nx

    from hardware_specs import SpecError

    with pytest.raises(SpecError, match="--time-limit"):
        shard_graph(nx.DiGraph(), tp=2, time_limit_s=limit)
