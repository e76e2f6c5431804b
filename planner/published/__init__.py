"""Published training runs as a measuring stick for the cost model.

``runs`` maps a row of the published-runs table (``benchmarks/data/published_runs.json``) to the
specs ``planner.evaluate`` takes, or to a reason the model cannot express it yet; ``conventions``
turns each source's throughput figure into tokens/s per GPU; ``stats`` holds median, percentile and
Kendall's tau; ``scoring`` evaluates, scores per family and cross-validates by family. Pure Python:
no torch.
"""

from .runs import MappedRun, Unexpressible, load_rows, map_row
from .scoring import FamilyScore, RunResult, cross_validate_by_family, default_evaluate, score

__all__ = ["FamilyScore", "MappedRun", "RunResult", "Unexpressible", "cross_validate_by_family",
           "default_evaluate", "load_rows", "map_row", "score"]
