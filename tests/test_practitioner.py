"""benchmarks/practitioner.py: every published layout is a valid layout of its job and evaluates;
the script prints the pick, the published layout and the terms that decide."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))

import practitioner  # noqa: E402


@pytest.mark.parametrize("case", practitioner.CASES, ids=lambda c: c.name)
def test_each_published_layout_evaluates(case):
    entry = practitioner.evaluate_published(case)
    L, r = entry.layout, case.request
    assert L.dp * L.tp * L.pp * L.cp == r["gpus"]
    assert L.dp * L.micro_batch_size * L.num_microbatches == r["global_batch"]
    p = entry.predicted
    assert p["step_time_s"] > 0 and 0 < p["mfu"] < 1
    assert p["band"]["step_time_s"]["low"] <= p["step_time_s"] <= p["band"]["step_time_s"]["high"]


def test_llama3_405b_split_is_one_layer_fewer_on_the_first_and_last_stage():
    L = practitioner.published_layout(next(c for c in practitioner.CASES if c.name == "llama3-405b"))
    per_rank = [sum(L.layers_per_chunk[c * L.pp + i] for c in range(L.virtual_stages)) for i in range(L.pp)]
    assert per_rank == [7] + [8] * 14 + [7] and sum(per_rank) == 126


def test_script_prints_pick_published_and_deciding_terms(capsys):
    assert practitioner.main(["--case", "mixtral-8x7b"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("mixtral-8x7b on 64 x h100-sxm-80gb")
    assert "  published  dp 16 · tp 1 · pp 4 · ep 8" in out
    assert "  autoplan   " in out
    assert "published minus pick:" in out or "same layout" in out
