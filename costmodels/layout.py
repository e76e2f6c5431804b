"""``Layout``: one parallel configuration of a training job, and its validity rules.

Rank order (innermost first) follows Megatron-LM: tp, cp, dp, pp. Expert parallelism
is carved out of the data-parallel ranks (Megatron-Core and torchtitan do the same):
``ep`` divides ``dp``; dense weights are replicated over all ``dp`` ranks, expert
weights are split ``ep`` ways and replicated ``dp / ep`` ways.
World size = dp · tp · pp · cp.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal, get_args

from autoplan_base.errors import SpecError, field

from .model_spec import ModelSpec
from .stage_split import balanced_split
from .training import TrainingSpec

Schedule = Literal["gpipe", "1f1b", "interleaved", "zb-h1", "interleaved-zb", "zb-v", "dualpipe-v", "dualpipe"]
Recompute = Literal["none", "selective", "op-sac", "full"]
SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved", "zb-h1", "interleaved-zb", "zb-v", "dualpipe-v",
                              "dualpipe")
"""GPipe; 1F1B; interleaved 1F1B; ZB-H1 and interleaved zero bubble (Qi et al. 2023); ZB-V (Qi et al.
2024); DualPipeV and DualPipe (DeepSeek-V3 report, Sec. 3.2.1). ``costmodels.pipeline`` costs each."""
MULTI_CHUNK_SCHEDULES: tuple[str, ...] = ("interleaved", "interleaved-zb", "zb-v", "dualpipe-v")
"""Schedules with v > 1 model chunks per rank (ZB-V and DualPipeV: exactly 2, in a V)."""
RECOMPUTE_MODES: tuple[str, ...] = ("none", "selective", "op-sac", "full")
"""selective: Megatron's (the attention core, Korthikanti et al. 2022); op-sac: torchtitan's op-level
selective checkpointing (``costmodels.op_sac``); full: the whole block."""
MoeDispatcher = Literal["alltoall", "deepep", "hybridep"]
MOE_DISPATCHERS: tuple[str, ...] = get_args(MoeDispatcher)
"""How a MoE layer's tokens reach their experts: one NCCL all-to-all over the ep group, or the
deduplicating DeepEP / HybridEP kernels of Megatron-Core's flex dispatcher (``costmodels.moe_dispatch``)."""


class LayoutError(SpecError):
    """A layout that the model, batch or cluster does not allow."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """Parallel degrees and per-step schedule of one candidate plan."""

    dp: int = 1
    """Data-parallel degree (includes the ep ranks)."""
    tp: int = 1
    """Tensor-parallel degree (Megatron column/row split of attention heads and MLP)."""
    pp: int = 1
    """Pipeline stages."""
    cp: int = 1
    """Context-parallel degree (ring attention over the sequence)."""
    ep: int = 1
    """Expert-parallel degree (MoE experts split over ep of the dp ranks)."""
    expert_tp: int = 0
    """Tensor-parallel degree of the routed experts (Megatron ``--expert-tensor-parallel-size``);
    0 = tp. Once set, the ep · expert_tp expert ranks fold into the tp · cp · dp ranks (Megatron's
    MoE parallel folding), so ep may exceed dp."""
    zero_stage: int = 0
    """0 = DDP; 1 = optimizer states sharded; 2 = + gradients; 3 = + parameters (FSDP)."""
    hsdp_shard_degree: int = 0
    """HSDP: shard states over groups of this many dp ranks, replicate across groups. 0 = all dp ranks."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism for norms and dropout (needs tp > 1)."""
    tp_comm_overlap: bool = False
    """Overlap the sequence-parallel all-gathers and reduce-scatters with the GEMMs they feed or
    drain, decomposed into chunks (Megatron ``--tp-comm-overlap``, Transformer Engine userbuffers;
    torch async TP, torchtitan ``parallelism.enable_async_tensor_parallel``); needs tp > 1 and
    sequence parallelism. Costed by ``costmodels.collectives_tp_overlap``."""
    micro_batch_size: int = 1
    """Sequences per micro-batch per data-parallel replica, b."""
    num_microbatches: int = 1
    """Micro-batches per step per replica, m (gradient accumulation steps when pp = 1)."""
    schedule: Schedule = "1f1b"
    """Pipeline schedule."""
    virtual_stages: int = 1
    """Model chunks per pipeline rank (v > 1 only with the interleaved schedule)."""
    layers_per_chunk: tuple[int, ...] = ()
    """Layers on each of the pp · v model chunks, in model order (chunk c of pipeline rank i is model chunk
    c·pp + i), for plain and interleaved schedules; empty = balanced split (the first L mod (pp·v)
    chunks take one layer more)."""
    recompute: Recompute = "none"
    """Activation recomputation: none, selective (attention core), op-sac (torchtitan's op-level SAC:
    every other matmul output and the attention output kept, ``costmodels.op_sac``), full (whole block)."""
    recompute_num_layers: int = 0
    """With full recomputation: layers per stage recomputed; 0 = all of them."""
    optimizer_offload: bool = False
    """Optimizer states and master weights in host memory, step on the CPU (ZeRO-Offload)."""
    activation_offload_layers: int = 0
    """Layers whose saved activations go to host memory after their forward and come back before
    their backward (Megatron-Core ``cpu_offloading_num_layers``; ``costmodels.offload``); 0 = none.
    Needs pp 1, as Megatron-Core does."""
    gpus_per_nvlink_domain: int = 0
    """GPUs of each NVLink domain the ranks fill, in rank order, before the next domain: a whole
    number of nodes, at most the node type's domain (64 of a GB200 NVL72 rack's 72; ``hardware_specs.
    placement``); 0 = all of each domain. Decides which process groups stay on NVLink."""
    moe_dispatcher: MoeDispatcher = "alltoall"
    """MoE token exchange (``MOE_DISPATCHERS``): alltoall (Megatron ``--moe-token-dispatcher-type
    alltoall``), or the flex dispatcher's deepep / hybridep backend; the last two need ep > 1."""
    ep_comm_overlap: bool = False
    """Hide the EP all-to-alls of one micro-batch behind another's compute by running a forward and
    a backward together in the 1F1B steady state (Megatron ``--overlap-moe-expert-parallel-comm
    --delay-wgrad-compute``; ``costmodels.moe_overlap``); needs ep > 1."""

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def etp(self) -> int:
        """Expert tensor-parallel degree in effect."""
        return self.expert_tp or self.tp

    @property
    def num_chunks(self) -> int:
        """Model chunks in the pipeline, pp · v."""
        return self.pp * self.virtual_stages

    @property
    def zero_shard_degree(self) -> int:
        """Ranks over which ZeRO shards model states (the HSDP shard group, or all of dp)."""
        return self.hsdp_shard_degree or self.dp

    def degree_labels(self) -> tuple[str, ...]:
        """The parallel degrees it uses, each as ``axis degree``: dp, tp and pp always, cp and ep above 1,
        the expert tp where it is set apart from tp, e.g. ``("dp 2", "tp 4", "pp 4", "cp 2")``. The plan's
        summary and every generated job's header name them so."""
        labels = [f"dp {self.dp}", f"tp {self.tp}", f"pp {self.pp}"]
        labels += [f"cp {self.cp}"] if self.cp > 1 else []
        labels += [f"ep {self.ep}"] if self.ep > 1 else []
        labels += [f"expert tp {self.expert_tp}"] if self.expert_tp and self.expert_tp != self.tp else []
        return tuple(labels)

    def chunk_layers(self, num_layers: int) -> tuple[int, ...]:
        """Layers on each model chunk, in pipeline order."""
        return self.layers_per_chunk or balanced_split(num_layers, self.num_chunks)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["layers_per_chunk"] = list(self.layers_per_chunk)
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "Layout":
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(raw) - known)
        if unknown:
            raise LayoutError(f"layout: unknown field {unknown[0]!r}; known fields: {', '.join(sorted(known))}")
        values = dict(raw)
        if isinstance(values.get("layers_per_chunk"), list):
            values["layers_per_chunk"] = tuple(values["layers_per_chunk"])
        return cls(**values)

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "cp", "ep", "micro_batch_size", "num_microbatches", "virtual_stages"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise LayoutError(f"layout.{name} must be a positive integer, got {value!r}")
        if isinstance(self.zero_stage, bool) or not isinstance(self.zero_stage, int) or self.zero_stage not in (0, 1, 2, 3):
            raise LayoutError(f"layout.zero_stage must be 0, 1, 2 or 3, got {self.zero_stage!r}")
        if self.schedule not in SCHEDULES:
            raise LayoutError(f"layout.schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if self.recompute not in RECOMPUTE_MODES:
            raise LayoutError(f"layout.recompute must be one of {', '.join(RECOMPUTE_MODES)}, got {self.recompute!r}")
        for name in ("hsdp_shard_degree", "recompute_num_layers", "expert_tp", "activation_offload_layers",
                     "gpus_per_nvlink_domain"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise LayoutError(f"layout.{name} must be a non-negative integer, got {value!r}")
        if self.moe_dispatcher not in MOE_DISPATCHERS:
            raise LayoutError(f"layout.moe_dispatcher must be one of {', '.join(MOE_DISPATCHERS)}, "
                              f"got {self.moe_dispatcher!r}")
        for name in ("sequence_parallel", "tp_comm_overlap", "optimizer_offload", "ep_comm_overlap"):
            if not isinstance(getattr(self, name), bool):
                raise LayoutError(f"layout.{name} must be true or false, got {getattr(self, name)!r}")
        stages = self.layers_per_chunk
        if not isinstance(stages, tuple) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1
                                                    for n in stages):
            raise LayoutError(f"layout.layers_per_chunk must be a tuple of positive integers, got {stages!r}")


def local_seq_len(training: TrainingSpec, layout: Layout) -> int:
    """Tokens of one sequence that a context-parallel rank holds: s / cp (``layout_problems``
    requires cp to divide s)."""
    return training.seq_len // layout.cp


def local_micro_batch_tokens(training: TrainingSpec, layout: Layout) -> int:
    """Tokens of one micro-batch that a context-parallel rank holds: b · s / cp."""
    return layout.micro_batch_size * local_seq_len(training, layout)


def check_layout(layout: Layout, model: ModelSpec, training: TrainingSpec, num_gpus: int,
                 gpus_per_node: int) -> None:
    """Raise ``LayoutError`` naming the first rule ``layout`` breaks; return if it is valid."""
    for problem in layout_problems(layout, model, training, num_gpus, gpus_per_node):
        raise LayoutError(problem)


def layout_problems(layout: Layout, model: ModelSpec, training: TrainingSpec, num_gpus: int,
                    gpus_per_node: int) -> list[str]:
    """Every divisibility and consistency rule ``layout`` breaks, as fix-it sentences."""
    L = layout
    problems: list[str] = []
    if L.world_size != num_gpus:
        problems.append(f"dp {L.dp} x tp {L.tp} x pp {L.pp} x cp {L.cp} = {L.world_size}, "
                        f"but {field('gpus', num_gpus)}; choose degrees whose product is {num_gpus}")
    if model.num_attention_heads % L.tp:
        problems.append(f"tp {L.tp} does not divide the {model.num_attention_heads} attention heads")
    if L.sequence_parallel and L.tp == 1:
        problems.append("sequence parallel needs tp > 1; pass --no-sequence-parallel or raise --tp")
    if L.tp_comm_overlap and not L.sequence_parallel:
        problems.append("tp comm overlap needs sequence parallelism (tp > 1 with --sequence-parallel; Megatron-LM "
                        "asserts the same); pass --no-tp-comm-overlap or --sequence-parallel")
    if training.seq_len % (L.tp if L.sequence_parallel else 1):
        problems.append(f"{field('seq_len', training.seq_len)} is not divisible by tp {L.tp} (sequence parallel "
                        "splits it)")
    if training.seq_len % L.cp:
        problems.append(f"{field('seq_len', training.seq_len)} is not divisible by cp {L.cp}")
    if L.ep > 1 and model.moe is None:
        problems.append(f"ep {L.ep} needs a mixture-of-experts model; {model.name} is dense")
    if model.moe is not None and model.moe.num_experts % L.ep:
        problems.append(f"ep {L.ep} does not divide the {model.moe.num_experts} experts")
    if L.ep == 1 and (L.moe_dispatcher != "alltoall" or L.ep_comm_overlap):
        what = f"moe dispatcher {L.moe_dispatcher}" if L.moe_dispatcher != "alltoall" else "ep comm overlap"
        problems.append(f"{what} needs ep > 1 (there is no expert all-to-all to run or hide otherwise)")
    if L.expert_tp:
        problems += _folded_expert_problems(L, model)
    elif L.dp % L.ep:
        problems.append(f"ep {L.ep} must divide dp {L.dp} (expert ranks are carved from data-parallel ranks)")
    if L.hsdp_shard_degree and (L.dp % L.hsdp_shard_degree or L.zero_stage == 0):
        problems.append(f"hsdp shard degree {L.hsdp_shard_degree} must divide dp {L.dp} and needs zero stage >= 1")
    problems += _batch_problems(L, training)
    problems += _pipeline_problems(L, model)
    return problems


def _folded_expert_problems(L: Layout, model: ModelSpec) -> list[str]:
    """Expert tensor parallelism: ep · expert_tp ranks fold into the tp · cp · dp ranks of a stage."""
    problems = []
    if model.moe is None:
        problems.append(f"expert tp {L.expert_tp} needs a mixture-of-experts model; {model.name} is dense")
    if (L.tp * L.cp * L.dp) % (L.ep * L.expert_tp):
        problems.append(f"ep {L.ep} x expert tp {L.expert_tp} must divide tp {L.tp} x cp {L.cp} x dp {L.dp} "
                        "(expert ranks fold into the ranks of one pipeline stage)")
    if model.moe is not None and model.moe.expert_ffn_hidden_size % L.expert_tp:
        problems.append(f"expert tp {L.expert_tp} does not divide the expert FFN size {model.moe.expert_ffn_hidden_size}")
    if L.expert_tp != L.tp and L.tp > 1 and not L.sequence_parallel:
        problems.append(f"expert tp {L.expert_tp} differing from tp {L.tp} needs sequence parallelism "
                        "(each tp rank then routes its own tokens)")
    return problems


def schedule_problems(schedule: str, pp: int, num_microbatches: int, virtual_stages: int) -> list[str]:
    """What each schedule asks of v and m, as torch 2.13's ``torch.distributed.pipelining`` and the
    closed forms of ``costmodels.pipeline`` need it.

    - interleaved, interleaved-zb: m a multiple of pp (Megatron's rule; it implies torch's
      m mod max(1, m // pp) = 0); interleaved-zb needs v >= 2 (one chunk per rank is zb-h1).
    - zb-v, dualpipe-v: exactly 2 chunks per rank (torch: "requires exactly 2 stages per rank");
      zb-v m >= 2·pp − 1 (torch plans max(2·pp − 1, m) micro-batches and blanks the rest; the bubble
      formula holds from there); dualpipe-v m >= 2·pp (torch: "at least as many microbatches as stages").
    - dualpipe: pp even and m even, m >= 2·pp (``deepseek-ai/DualPipe``'s ``dualpipe.py`` asserts these);
      one chunk per rank per direction, so v = 1.
    """
    s, p, m, v = schedule, pp, num_microbatches, virtual_stages
    out = []
    if s in ("interleaved", "interleaved-zb") and m % p:
        out.append(f"the {s} schedule needs micro-batches ({m}) to be a multiple of pp ({p})")
    if s == "interleaved-zb" and v < 2:
        out.append("the interleaved-zb schedule needs --virtual-stages 2 or more (with one chunk per rank use zb-h1)")
    if s in ("zb-v", "dualpipe-v") and v != 2:
        out.append(f"the {s} schedule needs --virtual-stages 2 (two chunks per rank in a V), got {v}")
    least = {"zb-v": 2 * p - 1, "dualpipe-v": 2 * p, "dualpipe": 2 * p}.get(s, 0)
    if m < least:
        out.append(f"the {s} schedule needs at least {least} micro-batches at pp {p}, got {m}")
    if s == "dualpipe" and (p % 2 or m % 2):
        out.append(f"the dualpipe schedule needs an even pp and an even micro-batch count, got pp {p}, {m} micro-batches")
    return out


def ep_overlap_runs(pp: int, schedule: str) -> bool:
    """Whether Megatron's EP overlap (``Layout.ep_comm_overlap``) runs under this pipeline: without
    one, or with the interleaved 1F1B schedule (``costmodels.moe_overlap``)."""
    return pp == 1 or schedule == "interleaved"


def _batch_problems(L: Layout, training: TrainingSpec) -> list[str]:
    per_replica = L.micro_batch_size * L.num_microbatches
    if per_replica * L.dp != training.global_batch_size:
        return [f"micro-batch {L.micro_batch_size} x {L.num_microbatches} micro-batches x dp {L.dp} = "
                f"{per_replica * L.dp} sequences, but {field('global_batch', training.global_batch_size)}"]
    return []


def _pipeline_problems(L: Layout, model: ModelSpec) -> list[str]:
    problems = []
    if L.virtual_stages > 1 and L.schedule not in MULTI_CHUNK_SCHEDULES:
        problems.append(f"virtual stages {L.virtual_stages} need --schedule interleaved, interleaved-zb, zb-v "
                        "or dualpipe-v")
    if L.schedule != "1f1b" and L.schedule != "gpipe" and L.pp == 1:
        problems.append(f"the {L.schedule} schedule needs pp > 1")
    problems += schedule_problems(L.schedule, L.pp, L.num_microbatches, L.virtual_stages)
    if L.layers_per_chunk:
        if len(L.layers_per_chunk) != L.num_chunks or sum(L.layers_per_chunk) != model.num_layers \
                or min(L.layers_per_chunk) < 1:
            problems.append(f"layers_per_chunk {list(L.layers_per_chunk)} must list {L.num_chunks} positive "
                            f"counts summing to {model.num_layers}")
    elif model.num_layers < L.num_chunks:
        problems.append(f"pp {L.pp} x virtual stages {L.virtual_stages} exceeds the {model.num_layers} layers")
    if L.ep_comm_overlap and not ep_overlap_runs(L.pp, L.schedule):
        problems.append(f"ep comm overlap merges 1F1B steady-state passes: it needs pp 1 or --schedule interleaved "
                        f"(Megatron-Core asserts virtual stages with pp > 1), got pp {L.pp} with {L.schedule}")
    if L.recompute_num_layers and L.recompute != "full":
        problems.append("recompute_num_layers needs --recompute full")
    if L.activation_offload_layers and L.pp > 1:
        problems.append("activation_offload_layers needs pp 1 (Megatron-Core offloads activations to the host only "
                        "without pipeline parallelism)")
    if L.activation_offload_layers >= model.num_layers:
        problems.append(f"activation_offload_layers {L.activation_offload_layers} must be below the "
                        f"{model.num_layers} layers (the last layer's backward follows its forward at once)")
    return problems
