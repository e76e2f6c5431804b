"""benchmarks/search_speed.py --phases: each phase's share of a search, read from cProfile."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))

import search_speed  # noqa: E402


def test_phase_shares_cover_the_search_and_each_lies_in_it():
    total, shares, estimates = search_speed.phase_shares(dict(model="llama3-8b", hardware="h100-sxm-80gb", gpus=8,
                                                   global_batch=64, seq_len=4096))
    assert total > 0
    assert set(shares) == {label for label, _, _ in search_speed.PHASES}
    assert all(0.0 <= share <= 1.0 for share in shares.values())
    # the result costs in full what it returns; the mesh floors come first
    assert shares["mesh visits"] > 0 and shares["mesh floors"] > 0 and shares["  full estimates"] > 0
    assert shares["the result"] > 0 and estimates >= 1
    assert shares["mesh visits"] >= shares["  memory floors"]
