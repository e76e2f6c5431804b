"""Source labels are a function of the layout costed, not of what was costed before (issue #10).

The shipped CPU profile measured collectives of 2 ranks on one node. On 2 nodes of 2, a tp = 4
all-reduce spans nodes and groups of 4, which the profile never measured, so its rate (and label)
is the datasheet's; a tp = 2 all-reduce is measured. Before the fix, costing tp = 2 first left a
``profile`` label on ``tp_comm`` that later tp = 4 layouts inherited.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import planner
import profiles
from costmodels.layout import Layout
from planner import api

SHIPPED = Path(profiles.__file__).parent / "data" / "cpu-gloo-2proc.json"
JOB = dict(model="tiny-llama", hardware="cpu", gpus=4, global_batch=8, seq_len=128)
TP4 = Layout(tp=4, num_microbatches=8)
TP2 = Layout(tp=2, dp=2, num_microbatches=4)


def test_tp_comm_label_does_not_carry_over_from_an_earlier_layout() -> None:
    job = api.resolve_job(**JOB, profile=SHIPPED)
    fresh = job.cost_model().estimate(TP4)
    reused = job.cost_model()
    assert reused.estimate(TP2).sources["tp_comm"] == "profile"
    assert fresh.sources["tp_comm"] == "datasheet"
    assert reused.estimate(TP4).sources == fresh.sources


@pytest.mark.parametrize("profile", [None, SHIPPED], ids=["datasheet", "profile"])
def test_plan_breakdowns_equal_evaluate_field_for_field(profile) -> None:
    report = planner.plan(**JOB, profile=profile, top_k=30, allow_cross_node_tp=True)
    returned = [b for b in (report.best, *report.candidates) if b is not None]
    returned += [m.breakdown for m in report.closest_misses]
    assert len({b.layout.tp for b in returned}) > 1, "the plan should return several tp degrees"
    for planned in returned:
        alone = planner.evaluate(**JOB, profile=profile, layout=planned.layout)
        assert alone == planned, planned.layout
        assert alone.predicted_dict() == planned.predicted_dict()
