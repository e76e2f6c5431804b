"""The Python API a scheduler calls: ``plan`` and ``evaluate``. No torch, no printing.

Every argument accepts a name or a spec object; errors are ``ValueError`` subclasses whose
messages name the field, the same lines the CLI prints.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from costmodels.breakdown import CostBreakdown
from costmodels.capabilities import Narrowing, capabilities
from costmodels.assumptions import DEFAULT_ASSUMPTIONS, Assumptions
from costmodels.bands import shipped_memory_band
from costmodels.estimate import CostModel, estimate
from costmodels.moe_dispatch import available_dispatchers
from costmodels.job import Job as CostJob
from costmodels.layout import Layout, LayoutError, check_layout
from costmodels.model_spec import ModelSpec
from costmodels.presets import load_model
from costmodels.stage_split import StageSplitError, check_requested_split, first_last_split, parse_layers
from costmodels.training import TrainingSpec
from hardware_specs import ClusterSpec, NodeSpec, load_node, make_cluster
from hardware_specs.checks import MAX_GPUS, MAX_TOKENS_PER_STEP, finite, flag, whole
from autoplan_base.errors import AutoplanError, SpecError, field

from planner.plan.bands import job_bands
from planner.search.brute_force import solve_brute_force
from planner.search.infeasible import model_state_gib, no_fit, suggestions
from planner.search.ranking import prefer_simplest, rank_key, tie_band
from planner.search.recipes import apply_recipe
from planner.plan.report import ClosestMiss, NoFit, PlanReport
from costmodels.runtimes import CONVENTIONS
from planner.plan.plan_file import PlanInputs
from planner.search.solve import collector_paused, solve
from planner.search.space import SearchOptions, empty_space_reason, mesh_choices, overlap_searched
from planner.search.framework_rules import runtime_refusal
from planner.search.narrowing_conflicts import narrowing_conflicts, virtual_stage_pipelines
from planner.search.runtime_space import (NarrowingError, check_narrowing, check_narrowing_cluster,
                                          check_narrowing_gpus, dispatcher_names, narrowing_from)
from planner.search.runtime_space import search_options as runtime_search_options
from planner.search.stages import refine_stages

if TYPE_CHECKING:
    from profiles import HardwareProfile


class PlanError(AutoplanError):
    """A request the planner cannot answer as asked (bad option combination)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """A resolved request: specs plus the names the user gave (for the plan file)."""

    model: ModelSpec
    training: TrainingSpec
    cluster: ClusterSpec
    profile: "HardwareProfile | None"
    memory_fraction: float
    inputs: PlanInputs

    @classmethod
    def from_inputs(cls, inputs: PlanInputs, *, profile: "str | Path | HardwareProfile | None" = None) -> "Job":
        """The job a plan file's ``inputs`` describe (the one place specs are rebuilt from a plan
        file). ``profile``: a loaded profile or a path; None costs with datasheet rates (pass
        ``inputs.profile`` to cost as ``plan`` did)."""
        cluster = make_cluster(load_node(inputs.hardware), inputs.gpus, inputs.gpus_per_node)
        loaded = _load_profile(profile)
        # The same rule as ``resolve_job``: a profile of another machine only if the plan allowed it.
        _check_profile(loaded, profile, cluster, "ok" if inputs.profile_device_mismatch else "refuse")
        return cls(model=inputs.model_spec, training=inputs.training, cluster=cluster,
                   profile=loaded, memory_fraction=float(inputs.memory_fraction), inputs=inputs)

    @property
    def warnings(self) -> tuple[str, ...]:
        """What the request asks that the model was not built for, one line each (the plan is still made)."""
        context, seq_len = self.model.max_position_embeddings, self.training.seq_len
        if seq_len <= context:
            return ()
        return (f"seq_len {seq_len} is past {self.model.name}'s context of {context} tokens "
                "(max_position_embeddings): positions beyond it were never trained; the costs hold, the "
                "model quality may not (extend the context first, e.g. RoPE scaling)",)

    def check_layout(self, layout: Layout) -> None:
        """Raise ``LayoutError`` naming the first rule ``layout`` breaks on this job: its degrees,
        batch and model (``costmodels.layout.layout_problems``), then what the hardware and runtime
        run. The one check of an explicit layout: ``evaluate``, and each run ``calibrate`` and
        ``validate --from-log`` read."""
        check_layout(layout, self.model, self.training, self.cluster.num_gpus, self.cluster.gpus_per_node)
        if layout.tp_comm_overlap and not overlap_searched(self.cluster.hardware.device_type):
            raise LayoutError(f"layout.tp_comm_overlap: {self.cluster.hardware.name} is a CPU, and TP communication "
                              "overlap needs GPU peer memory (userbuffers, symmetric memory); pass --no-tp-comm-overlap")
        _check_moe_comm(layout, self)

    def cost_job(self, assumptions: Assumptions = DEFAULT_ASSUMPTIONS) -> CostJob:
        """What the cost model needs of this request, with the convention of its runtime
        (``costmodels.runtimes.CONVENTIONS``)."""
        return CostJob(model=self.model, training=self.training, cluster=self.cluster, profile=self.profile,
                       assumptions=assumptions, memory_fraction=self.memory_fraction,
                       convention=CONVENTIONS[self.training.runtime])

    def cost_model(self, assumptions: Assumptions = DEFAULT_ASSUMPTIONS) -> CostModel:
        """A fresh memo for costing many layouts of this job (``costmodels.estimate.estimate``)."""
        return CostModel(self.cost_job(assumptions))


def job_as_planned(inputs: PlanInputs) -> Job:
    """The job a plan file was made for, with the profile its inputs name (``inputs.profile``), if any."""
    from planner.plan.plan_file import PlanFileError

    profile = inputs.profile
    if profile is not None and not Path(profile).is_file():
        raise PlanFileError(f"inputs.profile {profile}: no such file here; the plan was costed with it, so "
                            "explaining it needs it too (run from the directory 'autoplan plan' ran in)")
    return Job.from_inputs(inputs, profile=profile)


def context_attention_of(runtime: str, device_type: str) -> str:
    """The context-parallel attention that runs a plan: the generated job (runtime torch) uses
    torch's ring ``context_parallel`` on CUDA and the all-gather elsewhere
    (``planner.launch.torchjob.context_parallel.variant_for``); Megatron-LM rings."""
    return "all_gather" if runtime == "torch" and device_type != "cuda" else "ring"


def resolve_job(*, model: str | ModelSpec, hardware: str | NodeSpec, gpus: int, global_batch: int,
                seq_len: int, gpus_per_node: int | None = None, precision: str = "bf16",
                fp8_recipe: str | None = None, optimizer: str = "adamw", lora_rank: int = 0, attention: str = "fused",
                runtime: str = "megatron", memory_fraction: float = 0.95, profile: "str | Path | HardwareProfile | None" = None,
                profile_device_mismatch: str = "refuse", moe_imbalance: float | None = None,
                context_attention: str | None = None, compiled: bool = False) -> Job:
    """Turn names and numbers into specs, validating each where it enters.

    ``moe_imbalance`` sets the model's ``MoESpec.load_imbalance`` (tokens of the busiest expert rank
    over the even share), recorded in the plan's ``model_spec``.
    ``compiled`` (``TrainingSpec.compiled``): the model runs under ``torch.compile`` (torch runtimes).
    ``context_attention`` (``TrainingSpec.context_attention``): None costs what runs the plan, the
    generated job's all-gather on a non-CUDA device under ``runtime`` torch, else the ring.

    A profile measured on other devices than ``hardware`` (``profiles.match``) is refused unless
    ``profile_device_mismatch`` is ``ok``; the plan's inputs then record the override.
    """
    for name, value, kinds in (("model", model, (str, ModelSpec)), ("hardware", hardware, (str, NodeSpec))):
        if not isinstance(value, kinds):
            raise SpecError(f"{field(name, repr(value))}: expected a name, a path or a spec object")
    if not (profile is None or isinstance(profile, (str, Path, _profile_type()))):  # None imports no profiles
        raise SpecError(f"{field('profile', repr(profile))}: expected a name, a path or a spec object")
    model_spec = model if isinstance(model, ModelSpec) else load_model(model)
    if moe_imbalance is not None:
        model_spec = _with_imbalance(model_spec, moe_imbalance)
    node = hardware if isinstance(hardware, NodeSpec) else load_node(hardware)
    for name, value, high in (("gpus", gpus, MAX_GPUS), ("global_batch", global_batch, MAX_TOKENS_PER_STEP),
                              ("seq_len", seq_len, MAX_TOKENS_PER_STEP)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise SpecError(f"{field(name)} must be a positive integer, got {value!r}")
        whole(field(name), value, high=high)
    if gpus_per_node is not None and (not isinstance(gpus_per_node, int) or isinstance(gpus_per_node, bool)):
        raise SpecError(f"{field('gpus_per_node')} must be a positive integer, got {gpus_per_node!r}")
    if not isinstance(memory_fraction, (int, float)) or not 0 < memory_fraction <= 1:
        raise SpecError(f"{field('memory_fraction')} must be in (0, 1], got {memory_fraction!r}")
    finite(field("memory_fraction"), memory_fraction, high=1.0)
    if profile_device_mismatch not in ("refuse", "ok"):
        raise SpecError(f"{field('profile_device_mismatch')} must be refuse or ok, "
                        f"got {profile_device_mismatch!r}")
    if context_attention is None:
        context_attention = context_attention_of(runtime, node.hardware.device_type)
    training = TrainingSpec(global_batch_size=global_batch, seq_len=seq_len, precision=precision,
                            fp8_recipe=fp8_recipe, optimizer=optimizer, lora_rank=lora_rank, attention=attention, runtime=runtime,
                            context_attention=context_attention, compiled=compiled)
    if training.recipe.is_low_precision and not node.hardware.supports(training.precision):
        needs = "block-scaled formats need Blackwell: b200, b300, gb200-nvl72, gb300-nvl72" \
            if training.precision != "fp8" else "FP8 needs Hopper, Ada, Blackwell or MI300"
        raise SpecError(f"{field('precision', precision)}: {node.hardware.name} has no {precision} rate ({needs}); "
                        "use bf16" + (" or fp8" if training.precision != "fp8" else ""))
    if training.precision not in ("fp8", "fp32", "mxfp8", "nvfp4") and not node.hardware.supports(training.precision):
        raise SpecError(f"{field('precision', precision)}: {node.hardware.name} has no {precision} rate; use fp16")
    cluster = make_cluster(node, gpus, gpus_per_node)
    loaded = _load_profile(profile)
    mismatches = _check_profile(loaded, profile, cluster, profile_device_mismatch)
    inputs = PlanInputs(model=model if isinstance(model, str) else model.name, model_spec=model_spec,
                        hardware=hardware if isinstance(hardware, str) else node.hardware.name,
                        gpus=gpus, gpus_per_node=cluster.gpus_per_node, training=training,
                        memory_fraction=memory_fraction,
                        profile=str(profile) if isinstance(profile, (str, Path)) else None,
                        profile_device_mismatch=tuple(mismatches) if mismatches else None)
    return Job(model=model_spec, training=training, cluster=cluster, profile=loaded,
               memory_fraction=float(memory_fraction), inputs=inputs)


def _with_imbalance(model: ModelSpec, imbalance: float) -> ModelSpec:
    """``model`` with its MoE load imbalance set (``--moe-imbalance``)."""
    from dataclasses import replace

    if model.moe is None:
        raise SpecError(f"{field('moe_imbalance')}: {model.name} has no mixture-of-experts layers; drop the option")
    finite(field("moe_imbalance"), imbalance, low=1.0, high=float(model.moe.num_experts), low_open=False)
    return replace(model, moe=replace(model.moe, load_imbalance=float(imbalance)))


def _profile_type() -> type:
    """``profiles.HardwareProfile``, imported when first needed (``profiles`` is light, no torch)."""
    from profiles import HardwareProfile

    return HardwareProfile


def _load_profile(profile: "str | Path | HardwareProfile | None") -> "HardwareProfile | None":
    if profile is None or not isinstance(profile, (str, Path)):
        return profile
    from profiles import load_profile

    return load_profile(Path(profile))


def _check_profile(loaded: "HardwareProfile | None", given: Any, cluster: ClusterSpec,
                   mismatch: str) -> tuple[str, ...]:
    """Where the profile meets the cluster: ``profiles.match.check_profile_matches``."""
    if loaded is None:
        return ()
    from profiles.match import check_profile_matches

    where = str(given) if isinstance(given, (str, Path)) else "(given as an object)"
    return check_profile_matches(loaded, cluster, where, mismatch)


_RESOLVE_OPTIONS = ("gpus_per_node", "precision", "fp8_recipe", "optimizer", "lora_rank", "attention", "runtime",
                    "memory_fraction", "profile", "profile_device_mismatch", "moe_imbalance", "context_attention",
                    "compiled")
"""The keyword options ``plan`` and ``evaluate`` pass on to ``resolve_job``."""


@collector_paused()
def plan(*, model: str | ModelSpec, hardware: str | NodeSpec, gpus: int, global_batch: int, seq_len: int,
         top_k: int = 5, solver: str = "search", allow_cross_node_tp: bool = False,
         launchable: bool = False, layers_per_chunk: tuple[int, ...] = (), first_stage_layers: int | None = None,
         last_stage_layers: int | None = None, runtime_version: str | None = None,
         tp: Sequence[int] | None = None, pp: Sequence[int] | None = None, cp: Sequence[int] | None = None,
         ep: Sequence[int] | None = None, virtual_stages: Sequence[int] | None = None,
         micro_batch_sizes: Sequence[int] | None = None, zero_stages: Sequence[int] | None = None,
         schedules: Sequence[str] | None = None, recompute_modes: Sequence[str] | None = None,
         gpus_per_nvlink_domain: Sequence[int] | None = None, moe_dispatchers: Sequence[str] | None = None,
         allow_offload: bool = True, **options: Any) -> PlanReport:
    """The fastest layout that fits (of the plans within the measured tie band of the fastest,
    ``ranking.tie_band``, the least risky: no memory risk, then the fewest uncertain mechanisms, then
    the simplest, ``ranking.tie_key``), ranked alternatives, and why others were rejected.

    ``options``: gpus_per_node, precision, fp8_recipe, optimizer, lora_rank, attention, runtime, memory_fraction,
    profile, profile_device_mismatch, moe_imbalance, context_attention (see ``resolve_job``). ``solver``: ``search`` (branch and bound, exact) or ``brute-force``.
    The space searched is the runtime's (``costmodels.capabilities``, as of ``runtime_version``, default
    its latest), narrowed by ``tp``, ``pp``, ``cp``, ``ep``, ``virtual_stages``, ``micro_batch_sizes``,
    ``zero_stages`` (values allowed), ``schedules``, ``recompute_modes`` (names allowed),
    ``gpus_per_nvlink_domain`` (GPUs of each NVLink domain the job may use: whole nodes, at most one
    domain; default: every domain filled, and on rack-scale hardware also the even split the
    search tries, ``hardware_specs.placement``), ``moe_dispatchers`` (names allowed) and
    ``allow_offload`` (``planner.search.runtime_space``).
    ``launchable``: deprecated, the same as ``runtime="torch"`` (the job ``autoplan launch`` writes).
    ``layers_per_chunk`` or ``first_stage_layers`` / ``last_stage_layers`` (Megatron's form): search
    only pipelines that take this split, and keep it (no stage refinement).
    """
    unknown = sorted(set(options) - set(_RESOLVE_OPTIONS))
    if unknown:
        raise PlanError(f"plan(): unknown option {unknown[0]!r}; known: {', '.join(_RESOLVE_OPTIONS)}")
    flag("allow_cross_node_tp", allow_cross_node_tp, error=PlanError)
    flag("launchable", launchable, error=PlanError)
    _one_split_form(bool(layers_per_chunk), first_stage_layers, last_stage_layers)
    if launchable:
        if options.get("runtime", "torch") != "torch":
            raise PlanError(f"{field('runtime', options['runtime'])} with {field('launchable')}: the launched job "
                            f"runs on PyTorch's APIs; drop {field('launchable')} (it means {field('runtime', 'torch')})")
        options = {**options, "runtime": "torch"}
    if runtime_version is not None and not isinstance(runtime_version, str):
        raise PlanError(f"runtime_version= must be a release name, got {runtime_version!r}")
    table = capabilities(options.get("runtime", "megatron"), runtime_version, label="runtime_version=")
    narrowing = narrowing_from(dict(tp=tp, pp=pp, cp=cp, ep=ep, virtual_stages=virtual_stages,
                                    micro_batch_sizes=micro_batch_sizes, zero_stages=zero_stages, schedules=schedules,
                                    recompute_modes=recompute_modes, gpus_per_nvlink_domain=gpus_per_nvlink_domain,
                                    moe_dispatchers=moe_dispatchers, allow_offload=allow_offload))
    check_narrowing(table, narrowing)
    job = resolve_job(model=model, hardware=hardware, gpus=gpus, global_batch=global_batch,
                      seq_len=seq_len, **options)
    check_narrowing_gpus(narrowing, gpus)
    check_narrowing_cluster(narrowing, job.cluster)
    if not isinstance(layers_per_chunk, (tuple, list)):
        raise StageSplitError(f"{field('layers_per_chunk')} must be a list of layer counts, got {layers_per_chunk!r}")
    check_requested_split(job.model.name, job.model.num_layers, tuple(layers_per_chunk), first_stage_layers,
                          last_stage_layers)
    if table.applies_launch_rule and job.training.recipe.is_low_precision:
        raise PlanError(f"{field('precision', job.training.precision)} with {field('runtime', 'torch')}: the generated "
                        f"job does not apply low-precision recipes; plan with {field('runtime', 'megatron')} or "
                        f"torchtitan, or {field('precision', 'bf16')}")
    refusal = runtime_refusal(job.training.runtime, job.model, job.training, runtime_version)
    if refusal is not None:
        raise PlanError(refusal)
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
        raise PlanError(f"{field('top_k')} must be a positive integer, got {top_k!r}")
    if solver not in ("search", "brute-force"):
        raise PlanError(f"solver must be 'search' or 'brute-force', got {solver!r}")
    conflicts = narrowing_conflicts(table, narrowing, job.model, job.training, gpus, job.cluster.nvlink_domain_gpus,
                                    allow_cross_node_tp, name=field)
    if conflicts:  # every value of an option is excluded: the user's narrowing, not capacity, leaves nothing
        raise NarrowingError("; ".join(conflicts) + "; nothing else is left to search: widen or drop the option")
    search_options = runtime_search_options(table, pipelined_for_virtual_stages(narrowing, gpus, job.model.num_layers),
                                            job.cluster.hardware.device_type, job.cluster,
                                            allow_cross_node_tp=allow_cross_node_tp,
                                            layers_per_chunk=tuple(layers_per_chunk),
                                            first_stage_layers=first_stage_layers, last_stage_layers=last_stage_layers)
    started = time.perf_counter()
    run = solve if solver == "search" else solve_brute_force
    cost_model = job.cost_model()
    band = tie_band(job.training.runtime)
    result = _search_offload_last(run, cost_model, gpus, job.cluster.nvlink_domain_gpus, search_options, top_k + 1,
                                  band)
    if not result.num_candidates and search_options.fixed_split and \
            any(True for _ in mesh_choices(job.model, job.training, gpus, job.cluster.nvlink_domain_gpus, search_options)):
        raise StageSplitError(_split_fits_no_pipeline(layers_per_chunk, first_stage_layers, last_stage_layers))
    refined = result.ranked if search_options.fixed_split or not table.uneven_stages else \
        tuple(sorted((refine_stages(cost_model, b) for b in result.ranked), key=rank_key))
    memory_band = shipped_memory_band(job.training.runtime)
    ranked, num_tied, reason = prefer_simplest(refined, band, memory_band=memory_band, tied_in_mesh=result.tied_in_mesh)
    recipe = apply_recipe(cost_model, ranked, gpus=gpus, band=band, memory_band=memory_band, options=search_options)
    if recipe.moved:
        ranked, reason = recipe.ranked, "no slower than its runtime's published recipe, then the least risky"
    rejected = dict(result.rejected)
    if len(ranked) > top_k + 1:  # compared for ties, then beaten: counted as slower
        rejected["slower"] = rejected.get("slower", 0) + len(ranked) - (top_k + 1)
        ranked = ranked[:top_k + 1]
    seconds = time.perf_counter() - started
    fit = None if ranked else _no_fit(result, cost_model, search_options, _node_gpus(hardware, options))
    fixes = suggestions(fit, gpus) if result.closest_misses else ()
    misses = tuple(ClosestMiss(breakdown=b, suggestions=fixes) for b in result.closest_misses)
    return PlanReport(
        inputs=replace(job.inputs, top_k=top_k, allow_cross_node_tp=allow_cross_node_tp,
                       runtime_version=table.latest, narrowing=narrowing.to_dict() or None,
                       layers_per_chunk=tuple(layers_per_chunk) or None, first_stage_layers=first_stage_layers,
                       last_stage_layers=last_stage_layers),
        best=ranked[0] if ranked else None, candidates=ranked[1:], rejected=rejected,
        closest_misses=misses, bands=job_bands(job.profile, job.inputs.profile, job.training.runtime), no_fit=fit,
        warnings=job.warnings,
        search={"solver": solver, "space_size": result.num_candidates, "evaluated": result.num_evaluated,
                "tie_band": band.band_rel, "tie_band_source": band.source, "num_tied": num_tied,
                "tie_reason": reason or None, "recipe": recipe.statement or None, "seconds": round(seconds, 4)},
    )


def _search_offload_last(run: Any, cost_model: CostModel, gpus: int, domain_gpus: int, options: SearchOptions,
                         top_k: int, band: Any) -> Any:
    """The search with optimizer offload as a last resort: the space without offload first, and
    the whole space only when nothing fits there. Offload trades host-link traffic and a CPU
    optimizer step for device memory; no published sweep measures it against a layout that keeps
    its optimizer on the GPU (``costmodels.tie_band``), so where the job fits without it, the
    plan keeps its optimizer on the GPU. The first search keeps no closest misses (it is answered
    only where something fits, and then has none), so it cuts by memory floors from the start."""
    if not options.allow_offload:
        return run(cost_model, gpus, domain_gpus, options, top_k, band=band)
    on_gpu = run(cost_model, gpus, domain_gpus, replace(options, allow_offload=False), top_k, num_misses=0,
                 band=band)
    return on_gpu if on_gpu.ranked else run(cost_model, gpus, domain_gpus, options, top_k, band=band)


def _node_gpus(hardware: str | NodeSpec, options: dict[str, Any]) -> int:
    """GPUs per node to scale a request up by: ``gpus_per_node`` as given, else the hardware's own
    (the request's cluster holds fewer when it asked for less than a node)."""
    return options.get("gpus_per_node") or (hardware if isinstance(hardware, NodeSpec) else load_node(hardware)).gpus_per_node


def pipelined_for_virtual_stages(narrowing: Narrowing, gpus: int, num_layers: int) -> Narrowing:
    """The narrowing the search walks: virtual stages exist only in a pipeline, so a ``virtual_stages``
    narrowing without 1 searches pp > 1 only (else a pp 1 layout, which has no virtual stages, would
    answer ``--virtual-stages 3``). The plan file records the user's narrowing as given."""
    if not narrowing.virtual_stages or 1 in narrowing.virtual_stages:
        return narrowing
    pps = virtual_stage_pipelines(narrowing, gpus, num_layers)
    if not pps:
        raise NarrowingError(f"{field('virtual_stages')} {','.join(map(str, narrowing.virtual_stages))}: virtual "
                             f"stages need pp > 1, and no pp above 1 divides the {gpus} GPUs; drop the option")
    return replace(narrowing, pp=pps)


def _no_fit(result: Any, cost_model: CostModel, options: SearchOptions, node_gpus: int) -> NoFit:
    """Why a search found no plan: its closest miss's memory, or why no layout could be formed."""
    if result.closest_misses:
        return no_fit(result.closest_misses[0], cost_model, options, node_gpus)
    reason = empty_space_reason(cost_model.model, cost_model.training, cost_model.cluster.num_gpus,
                                cost_model.cluster.gpus_per_node, options)
    return NoFit(reason=reason, model_state_gib=model_state_gib(cost_model), smallest_fitting_gpus=None,
                 fitting_layout=None)


def evaluate(*, model: str | ModelSpec, hardware: str | NodeSpec, gpus: int, global_batch: int, seq_len: int,
             layout: Layout, **options: Any) -> CostBreakdown:
    """Cost of one explicit ``layout``; raises ``LayoutError`` naming the rule it breaks."""
    if not isinstance(layout, Layout):
        raise LayoutError(f"layout must be a planner.Layout, got {layout!r}")
    unknown = sorted(set(options) - set(_RESOLVE_OPTIONS))
    if unknown:
        raise PlanError(f"evaluate(): unknown option {unknown[0]!r}; known: {', '.join(_RESOLVE_OPTIONS)}")
    job = resolve_job(model=model, hardware=hardware, gpus=gpus, global_batch=global_batch,
                      seq_len=seq_len, **options)
    job.check_layout(layout)
    return estimate(job.cost_job(), layout)


def _check_moe_comm(layout: Layout, job: Job) -> None:
    """Refuse, naming the field, a rack placement the cluster cannot take, or a MoE dispatcher or EP
    overlap that the runtime (``costmodels.capabilities``) or the hardware
    (``moe_dispatch.available_dispatchers``) does not run."""
    job.cluster.placed(layout.gpus_per_nvlink_domain,
                       label=field("gpus_per_nvlink_domain", layout.gpus_per_nvlink_domain))
    runtime = job.training.runtime
    table = capabilities(runtime)
    runs = [d for d in dispatcher_names(table) if d in available_dispatchers(job.cluster.node)]
    if layout.moe_dispatcher not in runs:
        raise LayoutError(f"{field('moe_dispatcher', layout.moe_dispatcher)}: {runtime} on {job.cluster.hardware.name} "
                          f"runs {', '.join(runs)}")
    if layout.ep_comm_overlap and not table.has("ep_comm_overlap"):
        raise LayoutError(f"{field('ep_comm_overlap')}: {runtime} has no EP overlap (Megatron-Core's "
                          "--overlap-moe-expert-parallel-comm); drop it or use --runtime megatron")


def layout_for_batch(global_batch: int, *, dp: int, micro_batch_size: int = 1, tp: int = 1,
                     sequence_parallel: bool | None = None, **degrees: Any) -> Layout:
    """The layout with these degrees that meets ``global_batch`` exactly: the micro-batch count is
    global_batch / (dp · micro_batch_size); sequence parallelism defaults to on when tp > 1.
    ``degrees``: the other ``Layout`` fields (pp, cp, ep, zero_stage, schedule, ...)."""
    for name, value in (("global_batch", global_batch), ("dp", dp), ("micro_batch_size", micro_batch_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise LayoutError(f"{field(name)} must be a positive integer, got {value!r}")
    per_replica, rest = divmod(global_batch, dp * micro_batch_size)
    if rest or per_replica == 0:
        raise LayoutError(f"{field('global_batch', global_batch)} is not divisible by dp {dp} x "
                          f"{field('micro_batch_size', micro_batch_size)}")
    return Layout(dp=dp, tp=tp, micro_batch_size=micro_batch_size, num_microbatches=per_replica,
                  sequence_parallel=tp > 1 if sequence_parallel is None else sequence_parallel, **degrees)


def stage_split_option(num_layers: int, *, pp: int, virtual_stages: int, layers_per_chunk: str | None,
                       first: int | None, last: int | None) -> tuple[int, ...]:
    """Layers per chunk from ``--layers-per-stage`` or Megatron's ``--first/last-stage-layers``
    (``costmodels.stage_split``); () = the balanced default."""
    _one_split_form(bool(layers_per_chunk), first, last)
    if layers_per_chunk is not None:
        return parse_layers(layers_per_chunk)
    if first is None and last is None:
        return ()
    return first_last_split(num_layers, pp, virtual_stages, first, last)


def _split_fits_no_pipeline(layers_per_chunk: Sequence[int], first: int | None, last: int | None) -> str:
    """Why a search asked to keep a split had nothing to search: no pipeline the options allow takes it."""
    if layers_per_chunk:
        asked = f"{field('layers_per_chunk', ','.join(map(str, layers_per_chunk)))}"
        need = (f"its {len(layers_per_chunk)} chunks need a pipeline of pp x virtual stages = {len(layers_per_chunk)} "
                "(2 chunks per rank under ZB-V and DualPipeV)")
    else:
        asked = " ".join(field(name, value) for name, value in (("first_stage_layers", first),
                                                                 ("last_stage_layers", last)) if value is not None)
        need = "Megatron's form needs pp > 1, and the rest of the layers to split evenly over the middle ranks' chunks"
    return (f"no pipeline the other options allow takes {asked}: {need}; change the split, or the "
            f"{field('pp')} / {field('virtual_stages')} values")


def _one_split_form(listed: bool, first: int | None, last: int | None) -> None:
    if listed and (first is not None or last is not None):
        raise StageSplitError(f"give either {field('layers_per_chunk')} or {field('first_stage_layers')}/"
                              f"{field('last_stage_layers')}, not both")

