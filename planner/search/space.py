"""The search space: every layout the model, batch and cluster allow.

Outer choices (``MeshChoice``): a factorisation of the GPU count into dp · tp · pp · cp, with
ep dividing dp, subject to: tp divides the attention heads and (by default) fits inside a node;
pp is at most the number of layers (balanced split, refined by the stage DP afterwards; the
interleaved schedules take v among the divisors of ceil(L / pp) with pp·v <= L, its chunks balanced
to within one layer when pp·v does not divide L; ZB-V and DualPipeV take v = 2); cp divides the
sequence; ep divides the experts. Each schedule's own rules on v and m are
``costmodels.layout.schedule_problems``, the rule ``Layout`` checks.

The zero-bubble and DualPipe schedules enter as schedule choices like the others, and the search
bounds each in a group of its own (``groups.schedule_groups``: only GPipe and 1F1B share a group,
having the same time) by its pipeline floor plus the state floors (``costmodels.bounds``). That
bound never cuts the optimum: ZeRO, HSDP and offload only add to a rank's per-micro-batch time and
to its B part, every bubble form of ``costmodels.pipeline`` is non-decreasing in F and B,
recomputation adds to B (so the group's no-recomputation member bounds the rest), and DualPipe's
hidden communication depends on EP, PP and compute only, taken at its largest over the ranks.
Inner choices per mesh: ZeRO stage 0-3 (and HSDP for ZeRO-3 with the dp ranks of one node as
the shard group), optimizer offload, micro-batch size (a divisor of the per-replica batch, so the
global batch is met exactly), schedule and virtual stages, recomputation mode, sequence parallel,
and TP communication overlap (only with tp > 1 and sequence parallelism).
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields, replace
from typing import Iterator

from costmodels.layout import MULTI_CHUNK_SCHEDULES, Layout, ep_overlap_runs, schedule_problems
from costmodels.model_spec import ModelSpec
from costmodels.process_groups import group_shapes, placement_signature, spans_domains
from costmodels.stage_split import StageSplitError, chunk_order, first_last_split, rank_chunks
from costmodels.training import TrainingSpec

from .factors import divisors
from .framework_rules import layout_rule_problems


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchOptions:
    """Which parts of the space to search."""

    allow_cross_node_tp: bool = False
    """Let tensor-parallel groups span nodes (slow links; off by default)."""
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    recompute_modes: tuple[str, ...] = ("none", "selective", "full")
    schedules: tuple[str, ...] = ("1f1b", "gpipe", "interleaved", "zb-h1", "interleaved-zb", "zb-v", "dualpipe-v")
    """Schedules searched. DualPipe (``dualpipe``) is costed by ``evaluate`` but not searched by
    default: it holds two parameter copies and neither torch 2.13's pipelining, upstream
    Megatron-LM nor torchtitan runs it, so a plan that picked it could not be launched or exported;
    pass it here to search it (DualPipeV, which torch ships, is searched)."""
    allow_hsdp: bool = True
    tp_comm_overlap: bool = True
    """Search TP communication overlap (``Layout.tp_comm_overlap``) on and off wherever tp > 1 with
    sequence parallelism; ``planner.api.plan`` turns it off on CPU hardware (userbuffers and torch's
    symmetric memory need CUDA)."""
    job_rules: str = ""
    """The runtime whose job must run every layout searched: its rules
    (``planner.search.framework_rules.layout_rule_problems``; for ``torch``, what ``autoplan launch``
    applies, ``planner.search.launchable.launch_problems``) are checked on every mesh, state and
    schedule choice (see ``rules_pass``); "" checks none."""
    runtime_version: str | None = None
    """The release of ``job_rules``' runtime whose rules apply (None: its capability table's latest)."""
    layers_per_chunk: tuple[int, ...] = ()
    """A fixed split (layers per chunk): only pipelines with pp · v chunks of that count are searched."""
    first_stage_layers: int | None = None
    """Megatron's uneven form (``costmodels.stage_split.first_last_split``), applied at every pp and v
    that admits it; pipelines that do not are skipped."""
    last_stage_layers: int | None = None
    pipelined_zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    """ZeRO stages searched with pp > 1 (``RuntimeCapabilities.pipelined_zero_stages``: DeepSpeed's
    pipeline engine and Megatron's distributed optimizer stop at ZeRO-1)."""
    allow_offload: bool = True
    """Search optimizer offload (``Layout.optimizer_offload``) on as well as off."""
    cp_chunks_per_rank: int = 1
    """cp is searched only where seq-len divides by this times cp (2: load-balanced ring attention)."""
    tp_degrees: tuple[int, ...] = ()
    """Tensor-parallel degrees searched; () = every degree the model and cluster allow. Likewise
    ``pp_degrees``, ``cp_degrees``, ``ep_degrees``, ``virtual_stages`` (pipelines with pp > 1 only)
    and ``micro_batch_sizes``."""
    pp_degrees: tuple[int, ...] = ()
    cp_degrees: tuple[int, ...] = ()
    ep_degrees: tuple[int, ...] = ()
    virtual_stages: tuple[int, ...] = ()
    micro_batch_sizes: tuple[int, ...] = ()
    gpus_per_nvlink_domain: tuple[int, ...] = (0,)
    """Rack placements searched (``Layout.gpus_per_nvlink_domain``; ``hardware_specs.placement.
    placement_choices``); a mesh takes each only where it moves one of its groups (``_placements``)."""
    moe_dispatchers: tuple[str, ...] = ("alltoall",)
    """MoE token dispatchers searched (``Layout.moe_dispatcher``), for meshes with ep > 1; a flex
    backend only where the ep group spans NVLink domains (``_dispatchers``)."""
    ep_comm_overlap: bool = False
    """Search Megatron's EP overlap (``Layout.ep_comm_overlap``) on as well as off where ep > 1."""

    @property
    def fixed_split(self) -> bool:
        return bool(self.layers_per_chunk) or self.first_stage_layers is not None \
            or self.last_stage_layers is not None


def overlap_searched(device_type: str) -> bool:
    """Whether TP communication overlap is searched on this kind of device: Transformer Engine's
    userbuffers and torch's symmetric memory (async TP) need GPUs with peer memory access (CUDA, or
    ROCm with TE), not CPUs."""
    return device_type != "cpu"


LAUNCHABLE = dict(job_rules="torch")
"""Options that keep the search to what ``autoplan launch`` applies (``runtime_space.search_options``
sets each runtime's own, with the rest of that runtime's table)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MeshChoice:
    """Parallel degrees of one candidate family, and how its ranks and tokens cross the links."""

    dp: int
    tp: int
    pp: int
    cp: int
    ep: int
    gpus_per_nvlink_domain: int = 0
    """``Layout.gpus_per_nvlink_domain``."""
    moe_dispatcher: str = "alltoall"
    """``Layout.moe_dispatcher``."""

    @property
    def degrees(self) -> tuple[int, int, int, int, int]:
        """(dp, tp, pp, cp, ep): the mesh as ``ranking.mesh_of`` names it, whatever the placement."""
        return (self.dp, self.tp, self.pp, self.cp, self.ep)


def mesh_choices(model: ModelSpec, training: TrainingSpec, num_gpus: int, domain_gpus: int,
                 options: SearchOptions) -> list[MeshChoice]:
    """Every (dp, tp, pp, cp, ep) the model, batch and cluster allow, in a fixed order; tp stays inside
    one NVLink domain of ``domain_gpus`` (``ClusterSpec.nvlink_domain_gpus``) unless
    ``allow_cross_node_tp``."""
    out = []
    for tp in divisors(num_gpus):
        if model.num_attention_heads % tp or (tp > domain_gpus and not options.allow_cross_node_tp) \
                or not _allowed(tp, options.tp_degrees):
            continue
        for pp in divisors(num_gpus // tp):
            if pp > model.num_layers or not _allowed(pp, options.pp_degrees):
                continue
            for cp in divisors(num_gpus // (tp * pp)):
                if training.seq_len % (cp if cp == 1 else cp * options.cp_chunks_per_rank) \
                        or not _allowed(cp, options.cp_degrees):
                    continue
                dp = num_gpus // (tp * pp * cp)
                if training.global_batch_size % dp:
                    continue
                for ep in _expert_degrees(model, dp, options.ep_degrees):
                    for mesh in _placed_meshes(MeshChoice(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep), model, num_gpus,
                                               domain_gpus, options):
                        if not options.job_rules or neutral_state(options, model, training, mesh) is not None:
                            out.append(mesh)
    return out


def _placed_meshes(mesh: MeshChoice, model: ModelSpec, num_gpus: int, domain_gpus: int,
                   options: SearchOptions) -> Iterator[MeshChoice]:
    """The mesh at each placement and dispatcher that can change its cost.

    Placements: each of ``options.gpus_per_nvlink_domain`` unless an earlier one puts every group
    of the mesh on the same domains (``process_groups.placement_signature``): collectives then
    cost the same, the twin ranks second among equals (``ranking.simplicity_key``), and skipping
    it never changes the answer. Dispatchers: a flex backend only for a MoE mesh with ep > 1 whose
    ep group spans domains; inside one, all three move the same copies over NVLink and cost the
    same (``moe_dispatch.dispatch``), so again the skipped twin could only tie."""
    seen: set[tuple] = set()
    shapes = group_shapes(dp=mesh.dp, tp=mesh.tp, pp=mesh.pp, cp=mesh.cp, ep=mesh.ep, etp=mesh.tp)
    for placement in options.gpus_per_nvlink_domain:
        domain = min(placement or domain_gpus, num_gpus)
        if len(options.gpus_per_nvlink_domain) > 1:
            signature = placement_signature(shapes, domain, num_gpus)
            if signature in seen:
                continue
            seen.add(signature)
        spans = model.moe is not None and any(spans_domains(mesh.ep, stride, domain, num_gpus)
                                              for stride in (mesh.tp, mesh.tp * mesh.cp))
        for dispatcher in options.moe_dispatchers:
            if dispatcher == "alltoall" or spans:
                yield replace(mesh, gpus_per_nvlink_domain=placement, moe_dispatcher=dispatcher)


def _allowed(value: int, allowed: tuple[int, ...]) -> bool:
    """Whether ``value`` is among ``allowed`` (() allows every value)."""
    return not allowed or value in allowed


def _expert_degrees(model: ModelSpec, dp: int, allowed: tuple[int, ...] = ()) -> list[int]:
    if model.moe is None:
        return [1] if _allowed(1, allowed) else []
    return [e for e in divisors(dp) if model.moe.num_experts % e == 0 and _allowed(e, allowed)]


@dataclass(frozen=True, slots=True, kw_only=True)
class StateChoice:
    """How model states are held: ZeRO stage, HSDP shard group, optimizer offload."""

    zero_stage: int
    hsdp_shard_degree: int
    optimizer_offload: bool


def state_choices(mesh: MeshChoice, domain_gpus: int, options: SearchOptions, model: ModelSpec,
                  training: TrainingSpec) -> list[StateChoice]:
    """ZeRO stages (only 0 without data parallelism; with pp > 1 only ``options.pipelined_zero_stages``),
    HSDP for ZeRO-3, offload on or off (``options.allow_offload``). Without a data-parallel group
    ZeRO-1 holds what ZeRO-0 holds, so it is searched there only with offload, which Megatron runs
    only under its distributed optimizer (``--optimizer-cpu-offload``, a ZeRO-1 option)."""
    out = []
    for zero in _zero_stages(mesh, options):
        shard_degrees = [0]
        node_share = domain_gpus // (mesh.tp * mesh.cp) if domain_gpus % (mesh.tp * mesh.cp) == 0 else 0
        if options.allow_hsdp and zero == 3 and 1 < node_share < mesh.dp and mesh.dp % node_share == 0:
            shard_degrees.append(node_share)
        for shard in shard_degrees:
            for offload in ((False, True) if options.allow_offload else (False,)):
                state = StateChoice(zero_stage=zero, hsdp_shard_degree=shard, optimizer_offload=offload)
                if rules_pass(options, model, training, mesh, state=state):
                    out.append(state)
    if mesh.dp * mesh.cp == 1 and options.allow_offload and 1 in options.zero_stages \
            and (mesh.pp == 1 or 1 in options.pipelined_zero_stages):
        state = StateChoice(zero_stage=1, hsdp_shard_degree=0, optimizer_offload=True)
        if rules_pass(options, model, training, mesh, state=state):
            out.append(state)
    return out


def _zero_stages(mesh: MeshChoice, options: SearchOptions) -> list[int]:
    """The ZeRO stages searched at ``mesh``: only 0 without a data-parallel (or cp) group; with pp > 1
    only ``options.pipelined_zero_stages``."""
    group = mesh.dp * mesh.cp
    return [z for z in options.zero_stages if (group > 1 or z == 0)
            and (mesh.pp == 1 or z in options.pipelined_zero_stages)]


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleChoice:
    """Micro-batching, pipeline schedule, recomputation and sequence parallelism."""

    micro_batch_size: int
    num_microbatches: int
    schedule: str
    virtual_stages: int
    recompute: str
    sequence_parallel: bool
    layers_per_chunk: tuple[int, ...] = ()
    tp_comm_overlap: bool = False
    ep_comm_overlap: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineChoice:
    """The micro-batching and pipeline part of a schedule choice (no recomputation or SP yet)."""

    micro_batch_size: int
    num_microbatches: int
    schedule: str
    virtual_stages: int
    layers_per_chunk: tuple[int, ...] = ()


def pipeline_choices(mesh: MeshChoice, model: ModelSpec, training: TrainingSpec,
                     options: SearchOptions) -> list[PipelineChoice]:
    """Every micro-batch size dividing the per-replica batch, with each allowed schedule and v."""
    per_replica = training.global_batch_size // mesh.dp
    # the interleaved schedules' v: divisors of ceil(L / pp), which are the divisors when pp | L
    interleaved = [v for v in divisors(-(-model.num_layers // mesh.pp)) if v > 1]
    out = []
    for b in divisors(per_replica):
        if not _allowed(b, options.micro_batch_sizes):
            continue
        m = per_replica // b
        for schedule, v in _schedules(mesh, model, m, options, interleaved):
            split = _requested_split(options, model.num_layers, mesh.pp, v, schedule)
            if split is not None:
                out.append(PipelineChoice(micro_batch_size=b, num_microbatches=m, schedule=schedule, virtual_stages=v,
                                          layers_per_chunk=split))
    return out


def sequence_parallel_values(mesh: MeshChoice, training: TrainingSpec) -> tuple[bool, ...]:
    """Sequence parallelism on and off where tp > 1 divides the sequence; else off."""
    return (True, False) if mesh.tp > 1 and training.seq_len % mesh.tp == 0 else (False,)


def tp_overlap_values(sp_values: tuple[bool, ...], options: SearchOptions) -> list[tuple[bool, bool]]:
    """(sequence parallel, TP overlap) pairs: each SP value without overlap, and with SP also with
    overlap when ``options.tp_comm_overlap`` (Megatron's ``--tp-comm-overlap`` needs SP)."""
    return [(sp, False) for sp in sp_values] + ([(True, True)] if True in sp_values and options.tp_comm_overlap
                                                else [])


def schedule_choices(mesh: MeshChoice, model: ModelSpec, training: TrainingSpec, options: SearchOptions,
                     pipes: list[PipelineChoice] | None = None,
                     sp_values: tuple[bool, ...] | None = None) -> list[ScheduleChoice]:
    """Each pipeline choice (``pipes``, else ``pipeline_choices``) with each recomputation mode and SP
    value (``sp_values``, else ``sequence_parallel_values``) that the job rules pass (``rules_pass``,
    asked of each; ``planner.search.schedule_rules`` asks once per value of the fields they read)."""
    out = candidate_schedules(mesh, model, training, options, pipes, sp_values)
    if options.job_rules:
        state = neutral_state(options, model, training, mesh)
        out = [sched for sched in out if state is not None and rules_pass(options, model, training, mesh, state, sched)]
    return out


def candidate_schedules(mesh: MeshChoice, model: ModelSpec, training: TrainingSpec, options: SearchOptions,
                        pipes: list[PipelineChoice] | None = None,
                        sp_values: tuple[bool, ...] | None = None) -> list[ScheduleChoice]:
    """``schedule_choices`` before the job rules, in its order: pipeline choice, recomputation mode,
    (SP, TP overlap), EP overlap."""
    sp_values = sequence_parallel_values(mesh, training) if sp_values is None else sp_values
    tp_values = tp_overlap_values(sp_values, options)
    return [schedule_choice(pipe, recompute, sp, overlap, ep_overlap)
            for pipe in (pipeline_choices(mesh, model, training, options) if pipes is None else pipes)
            for recompute in options.recompute_modes for sp, overlap in tp_values
            for ep_overlap in ep_overlap_values(mesh, model, options)
            if not ep_overlap or ep_overlap_runs(mesh.pp, pipe.schedule)]


def schedule_choice(pipe: PipelineChoice, recompute: str, sequence_parallel: bool, tp_comm_overlap: bool,
                    ep_comm_overlap: bool) -> ScheduleChoice:
    """The schedule choice of a pipeline choice with these values. Built through its slots, as
    ``make_layout`` builds a layout: a search builds tens of thousands of choices, and a frozen
    dataclass's ``__init__`` sets each field through ``object.__setattr__`` (its fields are plain
    values, so it has no check to skip)."""
    sched = _new(ScheduleChoice)
    for slot, value in zip(_SCHEDULE_SLOTS, (pipe.micro_batch_size, pipe.num_microbatches, pipe.schedule,
                                              pipe.virtual_stages, recompute, sequence_parallel,
                                              pipe.layers_per_chunk, tp_comm_overlap, ep_comm_overlap)):
        slot(sched, value)
    return sched


_SCHEDULE_SLOTS = tuple(getattr(ScheduleChoice, name).__set__ for name in (
    "micro_batch_size", "num_microbatches", "schedule", "virtual_stages", "recompute", "sequence_parallel",
    "layers_per_chunk", "tp_comm_overlap", "ep_comm_overlap"))
"""Each ``ScheduleChoice`` field's slot setter, in ``schedule_choice``'s order."""


def ep_overlap_values(mesh: MeshChoice, model: ModelSpec, options: SearchOptions) -> tuple[bool, ...]:
    """EP overlap off, and on too where ``options.ep_comm_overlap`` and the mesh has an expert
    all-to-all to hide (a MoE model, ep > 1)."""
    return (False, True) if options.ep_comm_overlap and mesh.ep > 1 and model.moe is not None else (False,)


def num_schedule_choices(mesh: MeshChoice, model: ModelSpec, training: TrainingSpec, options: SearchOptions,
                         pipes: list[PipelineChoice]) -> int:
    """``len(schedule_choices(...))`` without building them where no job rule filters them."""
    if options.job_rules:
        return len(schedule_choices(mesh, model, training, options, pipes))
    ep_values = ep_overlap_values(mesh, model, options)
    per_pipe = len(options.recompute_modes) * len(tp_overlap_values(sequence_parallel_values(mesh, training), options))
    return per_pipe * sum(sum(not on or ep_overlap_runs(mesh.pp, pipe.schedule) for on in ep_values) for pipe in pipes)


def _schedules(mesh: MeshChoice, model: ModelSpec, m: int, options: SearchOptions,
               interleaved: list[int]) -> Iterator[tuple[str, int]]:
    """Each schedule with each v it takes at this mesh and m (``interleaved``: the interleaved ones' v)."""
    if mesh.pp == 1:
        yield "1f1b", 1  # no pipeline: the schedule is moot, one canonical choice
        return
    for schedule in options.schedules:
        if schedule in ("interleaved", "interleaved-zb"):
            chunks = interleaved
        else:
            chunks = [2] if schedule in MULTI_CHUNK_SCHEDULES else [1]
        for v in chunks:
            if mesh.pp * v <= model.num_layers and _allowed(v, options.virtual_stages) \
                    and not schedule_problems(schedule, mesh.pp, m, v):
                yield schedule, v


def _requested_split(options: SearchOptions, num_layers: int, pp: int, v: int,
                     schedule: str) -> tuple[int, ...] | None:
    """The split ``options`` asks for at this pp and v; () = none asked; None = this pipeline cannot
    take it."""
    if not options.fixed_split:
        return ()
    if options.layers_per_chunk:
        return options.layers_per_chunk if len(options.layers_per_chunk) == pp * v else None
    if pp == 1 or rank_chunks(schedule, pp, v) != chunk_order(pp, v):
        return None  # Megatron's first/last-rank form is for looped placements only
    try:
        return first_last_split(num_layers, pp, v, options.first_stage_layers, options.last_stage_layers)
    except StageSplitError:
        return None


def rules_pass(options: SearchOptions, model: ModelSpec, training: TrainingSpec, mesh: MeshChoice,
          state: StateChoice, sched: ScheduleChoice | None = None) -> bool:
    """True unless ``options.job_rules`` names a runtime whose ``layout_rule_problems`` finds a problem
    with this choice.

    Each rule reads the mesh plus at most one level: how model states are held (``state``), or the
    schedule choice (``sched``). So a state is checked with the neutral schedule choice
    (``_neutral_schedule``, which passes every schedule rule some choice of the mesh passes), a
    schedule choice with a state of the mesh that passes (``neutral_state``), and a layout passes
    every level's check exactly when it passes the rules as a whole (``tests/test_launchable.py``
    and ``tests/test_framework_rules.py`` check this on every runtime)."""
    if not options.job_rules:
        return True
    sched = sched or _neutral_schedule(mesh, training)
    return not layout_rule_problems(options.job_rules, model, training, make_layout(mesh, state, sched),
                                    options.runtime_version)


def _neutral_schedule(mesh: MeshChoice, training: TrainingSpec) -> ScheduleChoice:
    """One sequence per micro-batch (so the most micro-batches), 1F1B, no recomputation, no TP
    overlap, and sequence parallelism wherever tp > 1 allows it (torchtitan and Megatron with ep
    require it; no rule refuses it)."""
    per_replica = training.global_batch_size // mesh.dp
    return ScheduleChoice(micro_batch_size=1, num_microbatches=per_replica, schedule="1f1b", virtual_stages=1,
                          recompute="none", sequence_parallel=True in sequence_parallel_values(mesh, training))


def neutral_state(options: SearchOptions, model: ModelSpec, training: TrainingSpec,
                   mesh: MeshChoice) -> StateChoice | None:
    """The first ZeRO stage of the mesh (without HSDP or offload, which no rule asks for) that passes
    the job rules with the neutral schedule choice; None when none does (no layout of the mesh runs)."""
    for zero in _zero_stages(mesh, options):
        state = StateChoice(zero_stage=zero, hsdp_shard_degree=0, optimizer_offload=False)
        if rules_pass(options, model, training, mesh, state):
            return state
    return None


def make_layout(mesh: MeshChoice, state: StateChoice, sched: ScheduleChoice) -> Layout:
    """The layout of these choices. Choices come from this module, whose rules make every layout
    valid (``tests/test_search.py`` checks each with ``check_layout``), so the field checks of
    ``Layout.__post_init__`` are skipped: the search builds tens of thousands of layouts. Fields
    no choice sets keep their defaults."""
    layout = _new(Layout)
    for slot, value in zip(_CHOSEN_SLOTS, (
            mesh.dp, mesh.tp, mesh.pp, mesh.cp, mesh.ep, state.zero_stage, state.hsdp_shard_degree,
            state.optimizer_offload, sched.micro_batch_size, sched.num_microbatches, sched.schedule,
            sched.virtual_stages, sched.recompute, sched.sequence_parallel, sched.layers_per_chunk,
            sched.tp_comm_overlap, mesh.gpus_per_nvlink_domain, mesh.moe_dispatcher, sched.ep_comm_overlap)):
        slot(layout, value)
    for slot, value in _UNCHOSEN_DEFAULTS:
        slot(layout, value)
    return layout


_new = object.__new__
_CHOSEN_FIELDS = ("dp", "tp", "pp", "cp", "ep", "zero_stage", "hsdp_shard_degree", "optimizer_offload",
                  "micro_batch_size", "num_microbatches", "schedule", "virtual_stages", "recompute",
                  "sequence_parallel", "layers_per_chunk", "tp_comm_overlap", "gpus_per_nvlink_domain",
                  "moe_dispatcher", "ep_comm_overlap")
_CHOSEN_SLOTS = tuple(getattr(Layout, name).__set__ for name in _CHOSEN_FIELDS)
"""Each field's slot setter (a frozen dataclass refuses ``setattr``; its slots take values directly)."""
_UNCHOSEN_DEFAULTS = tuple((getattr(Layout, f.name).__set__, f.default_factory() if f.default is MISSING else f.default)
                           for f in fields(Layout) if f.name not in _CHOSEN_FIELDS)


def all_layouts(model: ModelSpec, training: TrainingSpec, num_gpus: int, domain_gpus: int,
                options: SearchOptions) -> Iterator[Layout]:
    """The whole space, one layout at a time (what the brute-force solver walks)."""
    for mesh in mesh_choices(model, training, num_gpus, domain_gpus, options):
        scheds = schedule_choices(mesh, model, training, options)
        for state in state_choices(mesh, domain_gpus, options, model, training):
            for sched in scheds:
                yield make_layout(mesh, state, sched)


def empty_space_reason(model: ModelSpec, training: TrainingSpec, num_gpus: int, domain_gpus: int,
                       options: SearchOptions) -> str:
    """Why ``mesh_choices`` found no mesh at all, as a fix-it sentence (no layout was searched)."""
    batch = training.global_batch_size
    relaxed = TrainingSpec(global_batch_size=num_gpus, seq_len=training.seq_len, precision=training.precision,
                           optimizer=training.optimizer, runtime=training.runtime)
    dps = sorted({m.dp for m in mesh_choices(model, relaxed, num_gpus, domain_gpus, options)})
    if not dps:
        return (f"no split of {num_gpus} GPUs into dp x tp x pp x cp suits {model.name} (tp must divide its "
                f"{model.num_attention_heads} heads and fit in an NVLink domain, pp <= {model.num_layers} layers, cp must "
                f"divide --seq-len {training.seq_len}); change --gpus")
    return (f"nothing to search: --global-batch {batch} is not a multiple of any data-parallel degree "
            f"{num_gpus} GPUs allow for {model.name} (smallest dp {dps[0]}); use a --global-batch that is a "
            f"multiple of {dps[0]}, or fewer --gpus")
