"""The search space: every layout the model, batch and cluster allow.

Outer choices (``MeshChoice``): a factorisation of the GPU count into dp · tp · pp · cp, with
ep dividing dp, subject to: tp divides the attention heads and (by default) fits inside a node;
pp is at most the number of layers (balanced split, refined by the stage DP afterwards; the
interleaved schedule needs pp·v to divide the layers); cp divides the sequence; ep divides the
experts.
Inner choices per mesh: ZeRO stage 0-3 (and HSDP for ZeRO-3 with the dp ranks of one node as
the shard group), optimizer offload, micro-batch size (a divisor of the per-replica batch, so the
global batch is met exactly), schedule and virtual stages, recomputation mode, sequence parallel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from costmodels.layout import Layout
from costmodels.model_spec import ModelSpec
from costmodels.training import TrainingSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchOptions:
    """Which parts of the space to search."""

    allow_cross_node_tp: bool = False
    """Let tensor-parallel groups span nodes (slow links; off by default)."""
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    recompute_modes: tuple[str, ...] = ("none", "selective", "full")
    schedules: tuple[str, ...] = ("1f1b", "gpipe", "interleaved")
    allow_offload: bool = True
    allow_hsdp: bool = True
    max_cp: int = 0
    """Largest context-parallel degree (0 = no limit)."""
    max_ep: int = 0
    """Largest expert-parallel degree (0 = no limit)."""
    pipeline_needs_pp_microbatches: bool = False
    """Pipeline schedules only with at least pp micro-batches (torch.distributed.pipelining's
    Schedule1F1B and ScheduleInterleaved1F1B refuse fewer)."""


LAUNCHABLE = dict(max_cp=1, max_ep=1, allow_offload=False, pipeline_needs_pp_microbatches=True)
"""Options that keep the search to what ``autoplan launch`` applies (no cp, ep or offload)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MeshChoice:
    """Parallel degrees of one candidate family."""

    dp: int
    tp: int
    pp: int
    cp: int
    ep: int


def divisors(n: int) -> list[int]:
    """Positive divisors of ``n``, ascending."""
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def mesh_choices(model: ModelSpec, training: TrainingSpec, num_gpus: int, gpus_per_node: int,
                 options: SearchOptions) -> list[MeshChoice]:
    """Every (dp, tp, pp, cp, ep) the model, batch and cluster allow, in a fixed order."""
    out = []
    for tp in divisors(num_gpus):
        if model.num_attention_heads % tp or (tp > gpus_per_node and not options.allow_cross_node_tp):
            continue
        for pp in divisors(num_gpus // tp):
            if pp > model.num_layers:
                continue
            for cp in divisors(num_gpus // (tp * pp)):
                if training.seq_len % cp or (options.max_cp and cp > options.max_cp):
                    continue
                dp = num_gpus // (tp * pp * cp)
                if training.global_batch_size % dp:
                    continue
                for ep in _expert_degrees(model, dp, options.max_ep):
                    out.append(MeshChoice(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep))
    return out


def _expert_degrees(model: ModelSpec, dp: int, max_ep: int) -> list[int]:
    if model.moe is None:
        return [1]
    return [e for e in divisors(dp) if model.moe.num_experts % e == 0 and (not max_ep or e <= max_ep)]


@dataclass(frozen=True, slots=True, kw_only=True)
class StateChoice:
    """How model states are held: ZeRO stage, HSDP shard group, optimizer offload."""

    zero_stage: int
    hsdp_shard_degree: int
    optimizer_offload: bool


def state_choices(mesh: MeshChoice, gpus_per_node: int, options: SearchOptions) -> list[StateChoice]:
    """ZeRO stages (only 0 without data parallelism), HSDP for ZeRO-3, offload on or off."""
    group = mesh.dp * mesh.cp
    stages = [z for z in options.zero_stages if group > 1 or z == 0]
    out = []
    for zero in stages:
        shard_degrees = [0]
        node_share = gpus_per_node // (mesh.tp * mesh.cp) if gpus_per_node % (mesh.tp * mesh.cp) == 0 else 0
        if options.allow_hsdp and zero == 3 and 1 < node_share < mesh.dp and mesh.dp % node_share == 0:
            shard_degrees.append(node_share)
        for shard in shard_degrees:
            for offload in ((False, True) if options.allow_offload else (False,)):
                out.append(StateChoice(zero_stage=zero, hsdp_shard_degree=shard, optimizer_offload=offload))
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleChoice:
    """Micro-batching, pipeline schedule, recomputation and sequence parallelism."""

    micro_batch_size: int
    num_microbatches: int
    schedule: str
    virtual_stages: int
    recompute: str
    sequence_parallel: bool


def schedule_choices(mesh: MeshChoice, model: ModelSpec, training: TrainingSpec,
                     options: SearchOptions) -> list[ScheduleChoice]:
    """Every micro-batch size dividing the per-replica batch, with each allowed schedule."""
    per_replica = training.global_batch_size // mesh.dp
    sp_values = (True, False) if mesh.tp > 1 and training.seq_len % mesh.tp == 0 else (False,)
    out = []
    for b in divisors(per_replica):
        m = per_replica // b
        for schedule, v in _schedules(mesh, model, m, options):
            for recompute in options.recompute_modes:
                for sp in sp_values:
                    out.append(ScheduleChoice(micro_batch_size=b, num_microbatches=m, schedule=schedule,
                                              virtual_stages=v, recompute=recompute, sequence_parallel=sp))
    return out


def _schedules(mesh: MeshChoice, model: ModelSpec, m: int, options: SearchOptions) -> Iterator[tuple[str, int]]:
    if mesh.pp == 1:
        yield "1f1b", 1  # no pipeline: the schedule is moot, one canonical choice
        return
    if options.pipeline_needs_pp_microbatches and m < mesh.pp:
        return
    for schedule in options.schedules:
        if schedule != "interleaved":
            yield schedule, 1
            continue
        if m % mesh.pp or model.num_layers % mesh.pp:
            continue
        for v in divisors(model.num_layers // mesh.pp):
            if v > 1:
                yield "interleaved", v


def make_layout(mesh: MeshChoice, state: StateChoice, sched: ScheduleChoice) -> Layout:
    return Layout(dp=mesh.dp, tp=mesh.tp, pp=mesh.pp, cp=mesh.cp, ep=mesh.ep, zero_stage=state.zero_stage,
                  hsdp_shard_degree=state.hsdp_shard_degree, optimizer_offload=state.optimizer_offload,
                  micro_batch_size=sched.micro_batch_size, num_microbatches=sched.num_microbatches,
                  schedule=sched.schedule, virtual_stages=sched.virtual_stages, recompute=sched.recompute,
                  sequence_parallel=sched.sequence_parallel)


def all_layouts(model: ModelSpec, training: TrainingSpec, num_gpus: int, gpus_per_node: int,
                options: SearchOptions) -> Iterator[Layout]:
    """The whole space, one layout at a time (what the brute-force solver walks)."""
    for mesh in mesh_choices(model, training, num_gpus, gpus_per_node, options):
        scheds = schedule_choices(mesh, model, training, options)
        for state in state_choices(mesh, gpus_per_node, options):
            for sched in scheds:
                yield make_layout(mesh, state, sched)
