"""Alpa-style search (Zheng et al., OSDI'22) on PyTorch graphs.

Intra-operator: ``shard.shard_graph`` (ILP over per-operator sharding strategies, PuLP with
HiGHS). Inter-operator: ``slice_stages`` (dynamic programming over pipeline stage boundaries).
Importing this package imports neither torch nor a solver; only ``trace`` and ``apply`` use
torch, and they import it themselves.
"""

from planner.search.stage_dp import brute_force_slice_stages, pipeline_latency_s, slice_stages

__all__ = ["brute_force_slice_stages", "pipeline_latency_s", "slice_stages"]
