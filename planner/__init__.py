"""autoplan: choose the parallel layout of a transformer training job.

    >>> import planner
    >>> report = planner.plan(model="llama3-8b", hardware="h100-sxm-80gb", gpus=8,
    ...                       global_batch=64, seq_len=4096)
    >>> report.best.layout.tp, report.best.step_time_s

``plan`` searches the whole space exactly (branch and bound over the analytic cost model);
``evaluate`` costs one explicit ``Layout``. Importing this package loads no torch.
"""

from costmodels.breakdown import CostBreakdown
from costmodels.layout import Layout, LayoutError
from autoplan_base.errors import AutoplanError, SpecError

from .api import PlanError, evaluate, plan, resolve_job
from planner.plan.report import NoFit, PlanReport
from planner.plan.plan_file import PlanFile, PlanFileError, read_plan_file

__all__ = ["AutoplanError", "CostBreakdown", "Layout", "LayoutError", "PlanError", "PlanFile", "PlanFileError",
           "NoFit", "PlanReport", "SpecError", "evaluate", "plan", "read_plan_file", "resolve_job"]
