"""``export_problems``: what of a layout a runtime's own job cannot run as it was costed.

Each exporter raises ``PlanFileError`` with its first line (``require_exportable``), so nothing
costed is dropped or rewritten silently. The runtime's capability table (``costmodels.capabilities``)
says which degrees, ZeRO stages, schedules, recomputation modes and overlaps it runs (the search
walks only that space); ``planner.search.framework_rules`` adds what the table does not hold: model
features, precision recipes and options whose meaning differs. The search applies the layout half
of those rules too, so it never offers a layout the export refuses.
"""

from __future__ import annotations

from costmodels.capabilities import RuntimeCapabilities, capabilities
from costmodels.layout import Layout
from costmodels.model_spec import ModelSpec
from costmodels.training import TrainingSpec
from planner.plan.plan_file import PlanFileError
from planner.search.framework_rules import job_rule_problems, layout_rule_problems
from planner.search.launchable import launch_problems

_DEGREE_VALUES = {"tp": lambda L: L.tp > 1, "pp": lambda L: L.pp > 1, "cp": lambda L: L.cp > 1,
                  "ep": lambda L: L.ep > 1, "expert_tp": lambda L: bool(L.expert_tp) and L.expert_tp != L.tp,
                  "virtual_stages": lambda L: L.virtual_stages > 1}
"""Whether a layout uses each degree of ``capabilities.DEGREES``."""


def _table_problems(table: RuntimeCapabilities, layout: Layout) -> list[str]:
    """What the capability table says the runtime does not run."""
    L, name, out = layout, table.runtime, []
    for degree, used in _DEGREE_VALUES.items():
        if used(L) and not table.has(degree):
            out.append(f"layout.{degree}: {name} ({table.framework}) has no {degree} degree; plan with "
                       f"--runtime {name}, which searches only what it runs")
    stages = [s for s in table.sharding if s.zero_stage == L.zero_stage]
    hsdp = L.zero_stage > 0 and 0 < L.hsdp_shard_degree < L.dp
    if not stages:
        out.append(f"layout.zero_stage = {L.zero_stage}: {name} runs ZeRO stages "
                   f"{', '.join(map(str, table.zero_stages))} only")
    elif L.pp > 1 and not any(s.pipelined for s in stages):
        out.append(f"layout.zero_stage = {L.zero_stage} with pp {L.pp}: {name} runs it only without pipelining "
                   f"({stages[0].option})")
    elif hsdp and not any(s.hsdp for s in stages):
        out.append(f"layout.hsdp_shard_degree = {L.hsdp_shard_degree}: {name} has no hybrid sharding at ZeRO stage "
                   f"{L.zero_stage}")
    if L.pp > 1 and not table.has(L.schedule):
        out.append(f"layout.schedule = {L.schedule}: {name} runs {', '.join(table.names('schedules'))} only")
    if L.recompute not in table.names("recompute"):
        out.append(f"layout.recompute = {L.recompute}: {name} runs {', '.join(table.names('recompute'))} only")
    for overlap, on in (("tp_comm_overlap", L.tp_comm_overlap), ("optimizer_offload", L.optimizer_offload)):
        if on and not table.has(overlap):
            out.append(f"layout.{overlap} = true: {name} has no such option")
    return out


def export_problems(runtime: str, model: ModelSpec, training: TrainingSpec, layout: Layout,
                    version: str | None = None) -> list[str]:
    """Every part of ``layout`` (with ``model`` and ``training``) that ``runtime``'s exported job (of
    release ``version``, None: the latest) cannot run as costed, one sentence each naming the field;
    empty when the job runs it exactly: the capability table's check, then the framework's rules
    (``planner.search.framework_rules``). ``torch`` is autoplan's own job:
    ``planner.search.launchable.launch_problems``."""
    if runtime == "torch":
        return launch_problems(model, training, layout)
    return (_table_problems(capabilities(runtime, version), layout)
            + job_rule_problems(runtime, model, training, version)
            + layout_rule_problems(runtime, model, training, layout, version))


def require_exportable(runtime: str, model: ModelSpec, training: TrainingSpec, layout: Layout,
                       version: str | None = None) -> None:
    """Raise ``PlanFileError`` with the first of ``export_problems``, if any."""
    problems = export_problems(runtime, model, training, layout, version)
    if problems:
        raise PlanFileError(f"{problems[0]} (the {runtime} job cannot run it as costed)")
