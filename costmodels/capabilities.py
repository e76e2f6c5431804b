"""What each runtime runs: one capability table per target framework, pure data.

A runtime is the framework that will run a plan, and one object with two halves (DESIGN.md): its
accounting, ``costmodels.convention.RuntimeConvention`` (how it holds and syncs model states), and
its capability table, here: the parallel degrees it composes, the sharding options, pipeline
schedules, recomputation modes and overlaps it implements, each with the option that turns it on,
the release that introduced it (among the releases the table knows) and the file of the
framework's own source that defines it, read at the commit in ``RuntimeCapabilities.commit``.

``plan`` searches exactly a table's space (``planner.search.runtime_space``) and ``launch`` writes
the options named here. An overlap the cost model counts as on (``Feature.costed``) names in
``Feature.option`` the options the export must set for the runtime to run it that way.

Names follow autoplan's: degrees ``tp pp cp ep expert_tp virtual_stages``; schedules as
``costmodels.layout.SCHEDULES``; recomputation as ``Layout.recompute``; overlaps
``tp_comm_overlap`` (``Layout.tp_comm_overlap``), ``dp_overlap`` (data-parallel gradient reduction
and parameter gathers hidden behind compute, ``costmodels.overlap.exposed_comm_s``) and
``optimizer_offload`` (``Layout.optimizer_offload``) and ``ep_comm_overlap`` (``Layout.ep_comm_overlap``);
MoE token dispatchers as ``costmodels.layout.MOE_DISPATCHERS`` (``Layout.moe_dispatcher``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from autoplan_base.errors import SpecError

if TYPE_CHECKING:
    from .layout import Layout

DEGREES = ("tp", "pp", "cp", "ep", "expert_tp", "virtual_stages")
"""The parallel degrees a table may list."""
OVERLAPS = ("tp_comm_overlap", "dp_overlap", "optimizer_offload", "ep_comm_overlap")
"""The overlaps and offloads a table may list."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Feature:
    """One thing a runtime runs, and how it is asked for."""

    name: str
    """autoplan's name for it (a degree, schedule, recomputation mode or overlap)."""
    option: str
    """The framework's option(s) that turn it on, as its own parser spells them."""
    since: str
    """The first of ``RuntimeCapabilities.versions`` that has it."""
    source: str
    """File in the framework's repository that defines the option (at ``RuntimeCapabilities.commit``)."""
    costed: bool = False
    """Overlaps only: the cost model always counts it as on, so every export sets ``option``."""
    pipelined: bool = True
    """Overlaps only: it also overlaps with pp > 1 (``dp_overlap``: the runtime's pipeline schedule
    issues the data-parallel reduction inside the last backward, not after it)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardingOption:
    """One ZeRO stage (Rajbhandari et al., SC'20, Sec. 5) as the runtime implements it."""

    zero_stage: int
    """0 replicates everything; 1 shards optimizer states; 2 also gradients; 3 also parameters."""
    option: str
    """The framework's option(s) for it."""
    since: str
    """The first of ``RuntimeCapabilities.versions`` that has it."""
    source: str
    """File in the framework's repository that defines the option."""
    pipelined: bool = True
    """It composes with pipeline parallelism (pp > 1)."""
    hsdp: bool = False
    """It also runs hybrid-sharded (shard inside a node, replicate across: ``Layout.hsdp_shard_degree``)."""
    standard: str = ""
    """Where the framework's own published recipes turn this stage on by default (the file that
    says so); empty: not its standard. At most one stage of a runtime is standard: the tie rule
    counts the ZeRO stage as a mechanism in use where it departs from it
    (``costmodels.tie_band.in_use``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeCapabilities:
    """Everything one runtime can run, with the option and release of each part."""

    runtime: str
    """``TrainingSpec.runtime``: megatron, megatron-bridge, torchtitan, deepspeed or torch."""
    framework: str
    """What runs the plan, in words."""
    repository: str
    """Where its source is read (GitHub owner/name; autoplan for its own job)."""
    commit: str
    """The commit of ``repository`` the sources below were read at."""
    versions: tuple[str, ...]
    """Releases the table knows, oldest first; the last is the default ``runtime_version``."""
    degrees: tuple[Feature, ...]
    """Parallel degrees it composes (names from ``DEGREES``)."""
    sharding: tuple[ShardingOption, ...]
    """ZeRO stages it runs."""
    schedules: tuple[Feature, ...]
    """Pipeline schedules it runs (autoplan's names)."""
    recompute: tuple[Feature, ...]
    """Recomputation modes it runs (``none`` included)."""
    overlaps: tuple[Feature, ...]
    """Overlaps and offloads it runs (names from ``OVERLAPS``)."""
    dispatchers: tuple[Feature, ...] = ()
    """MoE token dispatchers it runs (``costmodels.layout.MOE_DISPATCHERS``); () = its all-to-all only,
    with no option to write."""
    cp_chunks_per_rank: int = 1
    """Context parallelism splits each sequence into this many chunks per cp rank (2: the
    load-balanced zigzag of Megatron's and torch's ring attention), so seq-len must divide by it · cp."""
    uneven_stages: bool = True
    """Pipeline stages may hold different layer counts (``plan`` then moves layers between stages,
    ``planner.search.stages.refine_stages``); False: every stage holds num_layers / (pp · v)."""
    applies_launch_rule: bool = False
    """Its space is further cut by ``planner.search.launchable.launch_problems`` (autoplan's own job)."""

    @property
    def latest(self) -> str:
        return self.versions[-1]

    def at(self, version: str) -> "RuntimeCapabilities":
        """The table as of ``version``: the parts introduced in a later release dropped."""
        self.check_version(version)
        known = self.versions[:self.versions.index(version) + 1]
        keep = lambda parts: tuple(p for p in parts if p.since in known)  # noqa: E731
        return replace(self, versions=known, degrees=keep(self.degrees), sharding=keep(self.sharding),
                       schedules=keep(self.schedules), recompute=keep(self.recompute), overlaps=keep(self.overlaps),
                       dispatchers=keep(self.dispatchers))

    def check_version(self, version: str, label: str = "--runtime-version ") -> None:
        """``label``: how the value is named in the error (``runtime_version=`` from the API)."""
        if version not in self.versions:
            raise SpecError(f"{label}{version!r}: {self.runtime} knows {', '.join(self.versions)}; "
                            f"pick one (default {self.latest})")

    def has(self, name: str) -> bool:
        """Whether a degree, schedule, recomputation mode, overlap or dispatcher of this name is in the table."""
        return self.feature(name) is not None

    def feature(self, name: str) -> Feature | None:
        parts = self.degrees + self.schedules + self.recompute + self.overlaps + self.dispatchers
        return next((f for f in parts if f.name == name), None)

    def names(self, part: str) -> tuple[str, ...]:
        """The names in one part: ``degrees``, ``schedules``, ``recompute``, ``overlaps`` or ``dispatchers``."""
        return tuple(f.name for f in getattr(self, part))

    @property
    def zero_stages(self) -> tuple[int, ...]:
        return tuple(sorted({s.zero_stage for s in self.sharding}))

    @property
    def pipelined_zero_stages(self) -> tuple[int, ...]:
        return tuple(sorted({s.zero_stage for s in self.sharding if s.pipelined}))

    @property
    def hsdp(self) -> bool:
        return any(s.hsdp for s in self.sharding)

    @property
    def standard_zero_stage(self) -> int:
        """The ZeRO stage its published recipes run (``ShardingOption.standard``); 0 where none is."""
        return next((s.zero_stage for s in self.sharding if s.standard), 0)


_MLM_ARGS = "megatron/training/arguments.py"
_MLM_DDP = "megatron/core/distributed/distributed_data_parallel_config.py"
_MLM_MPC = "megatron/core/model_parallel_config.py"
_MLM_TC = "megatron/core/transformer/transformer_config.py"

MEGATRON = RuntimeCapabilities(
    runtime="megatron",
    framework="Megatron-LM (Megatron-Core) pretrain_gpt.py",
    repository="NVIDIA/Megatron-LM",
    commit="d98e8a64ddf34856e74b24714e3bedb2f5a39553",
    versions=("core_v0.12.0", "core_v0.13.0", "core_v0.14.0", "core_v0.15.0", "core_v0.16.0", "core_v0.17.0",
              "core_v0.18.0", "core_v0.19.0"),
    degrees=(
        Feature(name="tp", option="--tensor-model-parallel-size", since="core_v0.12.0", source=_MLM_MPC),
        Feature(name="pp", option="--pipeline-model-parallel-size", since="core_v0.12.0", source=_MLM_MPC),
        Feature(name="cp", option="--context-parallel-size", since="core_v0.12.0", source=_MLM_MPC),
        Feature(name="ep", option="--expert-model-parallel-size", since="core_v0.12.0", source=_MLM_MPC),
        Feature(name="expert_tp", option="--expert-tensor-parallel-size", since="core_v0.12.0", source=_MLM_MPC),
        Feature(name="virtual_stages", option="--num-virtual-stages-per-pipeline-rank", since="core_v0.12.0",
                source=_MLM_ARGS),
    ),
    sharding=(
        ShardingOption(zero_stage=0, option="(DDP, no flag)", since="core_v0.12.0", source=_MLM_DDP),
        # The distributed optimizer shards the fp32 main parameters and Adam states only: every rank
        # keeps the full gradient buffer (costmodels.convention.MEGATRON's ZeRO-1 rule).
        # --overlap-param-gather, the gathers' half of dp_overlap, needs the distributed optimizer
        # (arguments.py validate_args), so it is this stage's option and the FSDP stages'.
        ShardingOption(zero_stage=1, option="--use-distributed-optimizer --overlap-param-gather", since="core_v0.12.0",
                       source=_MLM_DDP, standard="examples/llama/train_llama3_8b_h100_fp8.sh @157006d6 (DDP_ARGS: "
                       "--use-distributed-optimizer); Megatron-Bridge's recipes for Megatron-Core, llama3.py"),
        # Megatron-FSDP (--use-custom-fsdp in 0.12-0.13, renamed in 0.14). Not offered with pp > 1:
        # its docs (docs/user-guide/features/megatron_fsdp.md) state no pipeline combination, so the
        # table keeps to the one it shows (dp x tp x cp).
        ShardingOption(zero_stage=2, option="--use-distributed-optimizer --overlap-param-gather --use-megatron-fsdp "
                       "--data-parallel-sharding-strategy optim_grads", since="core_v0.14.0", source=_MLM_ARGS,
                       pipelined=False),
        ShardingOption(zero_stage=3, option="--use-distributed-optimizer --overlap-param-gather --use-megatron-fsdp "
                       "--data-parallel-sharding-strategy optim_grads_params", since="core_v0.14.0", source=_MLM_ARGS,
                       pipelined=False),
    ),
    schedules=(
        Feature(name="1f1b", option="--pipeline-model-parallel-size P", since="core_v0.12.0",
                source="megatron/core/pipeline_parallel/schedules.py"),
        Feature(name="interleaved", option="--num-virtual-stages-per-pipeline-rank V", since="core_v0.12.0",
                source="megatron/core/pipeline_parallel/schedules.py"),
    ),
    recompute=(
        Feature(name="none", option="(no flag)", since="core_v0.12.0", source=_MLM_TC),
        Feature(name="selective", option="--recompute-granularity selective", since="core_v0.12.0", source=_MLM_TC),
        Feature(name="full", option="--recompute-granularity full --recompute-method uniform "
                "--recompute-num-layers 1", since="core_v0.12.0", source=_MLM_TC),
    ),
    overlaps=(
        Feature(name="tp_comm_overlap", option="--tp-comm-overlap", since="core_v0.12.0", source=_MLM_MPC),
        # store_true, default False (arguments.py): the cost counts DP traffic as overlapped, so every
        # export sets it; its gathers' half, --overlap-param-gather, comes with the sharded stages.
        Feature(name="dp_overlap", option="--overlap-grad-reduce", since="core_v0.12.0", source=_MLM_ARGS,
                costed=True),
        Feature(name="optimizer_offload", option="--optimizer-cpu-offload", since="core_v0.12.0",
                source="megatron/core/optimizer/optimizer_config.py"),
        # combined_1f1b.py; TransformerConfig.__post_init__ asserts ep > 1, the alltoall or flex
        # dispatcher, no full recomputation, bf16/fp16 and virtual stages when pp > 1. Megatron's MoE
        # README pairs it with --delay-wgrad-compute (the weight gradients deferred to widen the overlap).
        Feature(name="ep_comm_overlap", option="--overlap-moe-expert-parallel-comm --delay-wgrad-compute",
                since="core_v0.14.0", source=_MLM_MPC),
    ),
    dispatchers=(
        # TransformerConfig.moe_token_dispatcher_type defaults to allgather: the costed all-to-all is
        # written out. DeepEP came in core_v0.12.0 behind --moe-enable-deepep, which 0.16 deprecated
        # for --moe-flex-dispatcher-backend (deepep or its new hybridep): the table lists that option.
        Feature(name="alltoall", option="--moe-token-dispatcher-type alltoall", since="core_v0.12.0", source=_MLM_TC),
        Feature(name="deepep", option="--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep",
                since="core_v0.16.0", source=_MLM_TC),
        Feature(name="hybridep", option="--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep",
                since="core_v0.16.0", source=_MLM_TC),
    ),
    cp_chunks_per_rank=2,  # arguments.py: "seq-length should be a multiple of 2 * context-parallel-size"
)
"""Megatron-LM's ``pretrain_gpt.py``: no GPipe or zero-bubble schedules (Megatron-Core runs 1F1B and
interleaved 1F1B, ``get_forward_backward_func``); ZeRO-1 is the distributed optimizer."""


_MB_CONFIG = "src/megatron/bridge/training/config.py"
_MB_OVERLAP = "src/megatron/bridge/training/comm_overlap.py"

MEGATRON_BRIDGE = replace(
    MEGATRON,
    runtime="megatron-bridge",
    framework="NeMo 2 / Megatron-Bridge recipes (Megatron-Core)",
    repository="NVIDIA-NeMo/Megatron-Bridge",
    commit="067f987df03b8355b03192d88d70f1709fedf51a",
    versions=("v0.5.0", "v0.6.0"),
    degrees=tuple(Feature(name=f.name, option=f"model.{o}", since="v0.5.0", source=_MB_CONFIG)
                  for f, o in zip(MEGATRON.degrees, ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                                                     "context_parallel_size", "expert_model_parallel_size",
                                                     "expert_tensor_parallel_size",
                                                     "virtual_pipeline_model_parallel_size"))),
    sharding=(
        # The same fields as Megatron-LM's options (planner.launch.megatron_fields): the param-gather
        # overlap needs the distributed optimizer, so it comes with the sharded stages.
        ShardingOption(zero_stage=0, option="ddp.use_distributed_optimizer=False", since="v0.5.0", source=_MB_CONFIG),
        ShardingOption(zero_stage=1, option="ddp.use_distributed_optimizer=True ddp.overlap_param_gather=True",
                       since="v0.5.0", source=_MB_CONFIG,
                       standard="src/megatron/bridge/recipes/llama/llama3.py @0d5f5558: every pretrain config sets "
                                "ddp.use_distributed_optimizer = True"),
        ShardingOption(zero_stage=2, option="ddp.use_distributed_optimizer=True ddp.overlap_param_gather=True "
                       "ddp.use_megatron_fsdp=True ddp.data_parallel_sharding_strategy=optim_grads", since="v0.5.0",
                       source=_MB_CONFIG, pipelined=False),
        ShardingOption(zero_stage=3, option="ddp.use_distributed_optimizer=True ddp.overlap_param_gather=True "
                       "ddp.use_megatron_fsdp=True ddp.data_parallel_sharding_strategy=optim_grads_params",
                       since="v0.5.0", source=_MB_CONFIG, pipelined=False),
    ),
    schedules=(
        Feature(name="1f1b", option="model.pipeline_model_parallel_size=P", since="v0.5.0", source=_MB_CONFIG),
        Feature(name="interleaved", option="model.virtual_pipeline_model_parallel_size=V", since="v0.5.0",
                source=_MB_CONFIG),
    ),
    recompute=(
        Feature(name="none", option="model.recompute_granularity=None", since="v0.5.0", source=_MB_CONFIG),
        Feature(name="selective", option="model.recompute_granularity=selective", since="v0.5.0", source=_MB_CONFIG),
        Feature(name="full", option="model.recompute_granularity=full model.recompute_method=uniform "
                "model.recompute_num_layers=1", since="v0.5.0", source=_MB_CONFIG),
    ),
    overlaps=(
        Feature(name="tp_comm_overlap", option="comm_overlap.tp_comm_overlap=True", since="v0.5.0",
                source=_MB_OVERLAP),
        Feature(name="dp_overlap", option="ddp.overlap_grad_reduce=True", since="v0.5.0", source=_MB_CONFIG,
                costed=True),
        Feature(name="optimizer_offload", option="optimizer.optimizer_cpu_offload=True", since="v0.5.0",
                source=_MB_CONFIG),
        # scripts/performance/utils/overrides.py sets this pair for its MoE A2A overlap (and turns the
        # shared-expert overlap off, which Megatron-Core refuses beside it)
        Feature(name="ep_comm_overlap", option="comm_overlap.overlap_moe_expert_parallel_comm=True "
                "comm_overlap.delay_wgrad_compute=True", since="v0.5.0", source=_MB_OVERLAP),
    ),
    dispatchers=tuple(Feature(name=name, option=f"model.moe_token_dispatcher_type={kind}" + (
        f" model.moe_flex_dispatcher_backend={name}" if kind == "flex" else ""), since="v0.5.0",
        source="src/megatron/bridge/training/flex_dispatcher_backend.py")
        for name, kind in (("alltoall", "alltoall"), ("deepep", "flex"), ("hybridep", "flex"))),
)
"""Megatron-Core configured through Megatron-Bridge's ``ConfigContainer`` (what runs is Megatron-Core,
so the space is ``MEGATRON``'s; option names are the recipe's config fields)."""


_TT_CONFIG = "torchtitan/config/configs.py"
_TT_PP = "torchtitan/distributed/pipeline_parallel.py"
_TT_AC = "torchtitan/distributed/activation_checkpoint.py"

TORCHTITAN = RuntimeCapabilities(
    runtime="torchtitan",
    framework="torchtitan (FSDP2, DTensor TP, torch.distributed.pipelining)",
    repository="pytorch/torchtitan",
    commit="b5bcd76c66d0acb1a08b176d9639425bc55e0b2a",
    versions=("v0.2.0", "v0.2.1", "v0.2.2", "v0.3.0"),
    degrees=(
        Feature(name="tp", option="parallelism.tensor_parallel_degree", since="v0.2.0", source=_TT_CONFIG),
        Feature(name="pp", option="parallelism.pipeline_parallel_degree", since="v0.2.0", source=_TT_CONFIG),
        Feature(name="cp", option="parallelism.context_parallel_degree", since="v0.2.0", source=_TT_CONFIG),
        Feature(name="ep", option="parallelism.expert_parallel_degree", since="v0.2.0", source=_TT_CONFIG),
        Feature(name="expert_tp", option="parallelism.expert_tensor_parallel_degree", since="v0.2.0",
                source=_TT_CONFIG),
        Feature(name="virtual_stages", option="parallelism.pipeline_parallel_layers_per_stage", since="v0.2.0",
                source=_TT_CONFIG),
    ),
    sharding=(
        ShardingOption(zero_stage=0, option="parallelism.data_parallel_replicate_degree=DP "
                       "data_parallel_shard_degree=1", since="v0.2.0", source=_TT_CONFIG),
        # No ZeRO-1: FSDP2 reduce-scatters every micro-batch's gradients (the train loop has no no_sync).
        ShardingOption(zero_stage=2, option="parallelism.fsdp_reshard_after_forward=never", since="v0.2.0",
                       source=_TT_CONFIG),
        ShardingOption(zero_stage=3, option="parallelism.fsdp_reshard_after_forward=always", since="v0.2.0",
                       source=_TT_CONFIG, hsdp=True,
                       standard="torchtitan/models/llama3/train_configs/llama3_{8b,70b}.toml @f3534d77: "
                                "data_parallel_shard_degree = -1 (FSDP over every data-parallel rank)"),
    ),
    schedules=(
        Feature(name="1f1b", option="parallelism.pipeline_parallel_schedule=1F1B", since="v0.2.0", source=_TT_PP),
        Feature(name="gpipe", option="parallelism.pipeline_parallel_schedule=GPipe", since="v0.2.0", source=_TT_PP),
        Feature(name="interleaved", option="parallelism.pipeline_parallel_schedule=Interleaved1F1B", since="v0.2.0",
                source=_TT_PP),
        Feature(name="interleaved-zb", option="parallelism.pipeline_parallel_schedule=InterleavedZeroBubble",
                since="v0.2.0", source=_TT_PP),
        Feature(name="zb-v", option="parallelism.pipeline_parallel_schedule=ZBVZeroBubble", since="v0.2.0",
                source=_TT_PP),
        Feature(name="dualpipe-v", option="parallelism.pipeline_parallel_schedule=DualPipeV", since="v0.2.0",
                source=_TT_PP),
    ),
    recompute=(
        Feature(name="none", option="activation_checkpoint.mode=none", since="v0.2.0", source=_TT_AC),
        Feature(name="full", option="activation_checkpoint.mode=full", since="v0.2.0", source=_TT_AC),
        # torchtitan's "selective" with selective_ac_option=op is op-level SAC, not Korthikanti's
        # attention-core recomputation (autoplan's "selective").
        Feature(name="op-sac", option="activation_checkpoint.mode=selective selective_ac_option=op",
                since="v0.2.0", source=_TT_AC),
    ),
    overlaps=(
        Feature(name="tp_comm_overlap", option="compile.enable_async_tensor_parallel=true", since="v0.2.0",
                source=_TT_CONFIG),
        Feature(name="dp_overlap", option="(FSDP2 prefetching, always on)", since="v0.2.0", source=_TT_CONFIG,
                costed=True),
        Feature(name="optimizer_offload", option="training.enable_cpu_offload=true", since="v0.2.0",
                source=_TT_CONFIG),
    ),
    cp_chunks_per_rank=2,
)
"""torchtitan's trainer. Async TP needs ``torch.compile`` and CUDA symmetric memory. Sources at ``commit``
for v0.2.x; v0.3.0's options were read from its release on the package index
(``torchtitan-0.3.0-py3-none-any.whl``: ``config/configs.py``, ``distributed/activation_checkpoint.py``,
``distributed/pipeline_parallel.py``), where the same degrees, sharding, schedules and recomputation are
set on the command line (``planner.launch.torchtitan_cli``) and async TP is
``compile.enable_async_tensor_parallel``; v0.3.0 has no ``expert_tensor_parallel_degree``, which only MoE
layouts use, and torchtitan's exported model (llama3) has none (``framework_rules``)."""


_DS_PIPE = "deepspeed/runtime/pipe/engine.py"
_MDS_ARGS = "megatron/arguments.py (deepspeedai/Megatron-DeepSpeed@4efb479d5317ce9b86096b9d8e3e8030b0b5263b)"

DEEPSPEED = RuntimeCapabilities(
    runtime="deepspeed",
    framework="Megatron-DeepSpeed under DeepSpeed's pipeline engine",
    repository="deepspeedai/DeepSpeed",
    commit="edaa7221267243c7be7fb49c5d5f5c4fb97b4641",
    versions=("v0.19.5",),
    degrees=(
        Feature(name="tp", option="--tensor-model-parallel-size", since="v0.19.5", source=_MDS_ARGS),
        Feature(name="pp", option="--pipeline-model-parallel-size", since="v0.19.5", source=_MDS_ARGS),
        Feature(name="ep", option="--moe-expert-parallel-size", since="v0.19.5", source=_MDS_ARGS),
    ),
    sharding=(
        ShardingOption(zero_stage=0, option="zero_optimization.stage=0", since="v0.19.5", source=_DS_PIPE),
        ShardingOption(zero_stage=1, option="zero_optimization.stage=1", since="v0.19.5", source=_DS_PIPE),
        # engine.py asserts zero_optimization_stage() < 2 under the pipeline engine ("ZeRO-2 and ZeRO-3
        # are incompatible with pipeline parallelism"); at pp 1, --no-pipeline-parallel leaves it.
        ShardingOption(zero_stage=2, option="zero_optimization.stage=2 --no-pipeline-parallel", since="v0.19.5",
                       source=_DS_PIPE, pipelined=False),
        ShardingOption(zero_stage=3, option="zero_optimization.stage=3 --no-pipeline-parallel", since="v0.19.5",
                       source=_DS_PIPE, pipelined=False),
    ),
    schedules=(
        Feature(name="1f1b", option="(PipelineEngine TrainSchedule)", since="v0.19.5",
                source="deepspeed/runtime/pipe/schedule.py"),
    ),
    recompute=(
        Feature(name="none", option="(no flag)", since="v0.19.5", source=_MDS_ARGS),
        Feature(name="selective", option="--recompute-granularity selective", since="v0.19.5", source=_MDS_ARGS),
        Feature(name="full", option="--checkpoint-activations", since="v0.19.5", source=_MDS_ARGS),
    ),
    overlaps=(
        # Not with pp > 1: the pipeline engine turns the backward-hook all-reduce off and TrainSchedule
        # (deepspeed/runtime/pipe/schedule.py, TrainSchedule.steps) appends ReduceTiedGrads, ReduceGrads
        # and OptimizerStep after the last micro-batch's backward; engine.py's _exec_reduce_grads then
        # all-reduces every gradient (allreduce_gradients / _bf16_reduce_grads), with no compute left to
        # hide it, and ZeRO-1's parameter all-gather follows in the optimizer step.
        Feature(name="dp_overlap", option="zero_optimization.overlap_comm=true", since="v0.19.5",
                source="deepspeed/runtime/zero/config.py", costed=True, pipelined=False),
    ),
    uneven_stages=False,  # megatron/model/gpt_model.py GPTModelPipe: partition_method "type:transformer"
)
"""Megatron-DeepSpeed: 1F1B only (the pipeline engine's ``TrainSchedule``); no context parallelism
(its ``--ds-sequence-parallel-size`` is DeepSpeed-Ulysses, not costed here); no TP overlap; offload
not searched (its ZeRO-Offload under the pipeline engine is not verified here)."""


_JOB = "planner/launch/torchjob"

TORCH = RuntimeCapabilities(
    runtime="torch",
    framework="autoplan's own torchrun job (FSDP2, DTensor TP/SP, torch.distributed.pipelining)",
    repository="autoplan",
    commit="(this repository)",
    versions=("2.13",),
    degrees=tuple(Feature(name=n, option=f"layout.{n}", since="2.13", source=f"{_JOB}/parallel.py")
                  for n in ("tp", "pp", "cp", "ep", "virtual_stages")),
    sharding=(
        ShardingOption(zero_stage=0, option="replicate", since="2.13", source=f"{_JOB}/convention.py"),
        ShardingOption(zero_stage=1, option="fully_shard, reduce after the last micro-batch", since="2.13",
                       source=f"{_JOB}/convention.py"),
        ShardingOption(zero_stage=2, option="fully_shard(reshard_after_forward=False)", since="2.13",
                       source=f"{_JOB}/convention.py"),
        ShardingOption(zero_stage=3, option="fully_shard(reshard_after_forward=True)", since="2.13",
                       source=f"{_JOB}/convention.py", hsdp=True),
    ),
    schedules=tuple(Feature(name=n, option=f"torch.distributed.pipelining {c}", since="2.13",
                            source=f"{_JOB}/pipelining.py")
                    for n, c in (("1f1b", "Schedule1F1B"), ("gpipe", "ScheduleGPipe"),
                                 ("interleaved", "ScheduleInterleaved1F1B"), ("zb-h1", "ScheduleInterleavedZeroBubble, one stage per rank"),
                                 ("interleaved-zb", "ScheduleInterleavedZeroBubble"),
                                 ("zb-v", "ScheduleZBVZeroBubble"), ("dualpipe-v", "ScheduleDualPipeV"))),
    recompute=tuple(Feature(name=n, option=f"layout.recompute={n}", since="2.13", source=f"{_JOB}/parallel.py")
                    for n in ("none", "selective", "full")),
    overlaps=(
        Feature(name="dp_overlap", option="(FSDP2 prefetching, always on)", since="2.13",
                source=f"{_JOB}/parallel.py", costed=True),
        Feature(name="optimizer_offload", option="CPUOffloadPolicy", since="2.13", source=f"{_JOB}/parallel.py"),
    ),
    cp_chunks_per_rank=2,
    applies_launch_rule=True,
)
"""The job ``autoplan launch`` writes; what it cannot apply to a given model is
``planner.search.launchable.launch_problems``."""


CAPABILITIES: dict[str, RuntimeCapabilities] = {c.runtime: c for c in (MEGATRON, MEGATRON_BRIDGE, TORCHTITAN,
                                                                        DEEPSPEED, TORCH)}
"""The capability table of each ``TrainingSpec.runtime`` name."""


def capabilities(runtime: str, version: str | None = None, label: str = "--runtime-version ") -> RuntimeCapabilities:
    """The table of ``runtime`` as of ``version`` (None: its latest); ``label`` names the version in errors."""
    if runtime not in CAPABILITIES:
        raise SpecError(f"--runtime {runtime!r}: known runtimes are {', '.join(CAPABILITIES)}")
    table = CAPABILITIES[runtime]
    version = table.latest if version is None else version
    table.check_version(version, label)
    return table.at(version)


NARROWING_INTS = ("tp", "pp", "cp", "ep", "virtual_stages", "micro_batch_sizes", "zero_stages",
                  "gpus_per_nvlink_domain")
NARROWING_NAMES = ("schedules", "recompute_modes", "moe_dispatchers")


@dataclass(frozen=True, slots=True, kw_only=True)
class Narrowing:
    """The part of a runtime's space the user asks to search (``plan --tp 1,2 ...``); an empty
    tuple leaves that part as the table has it."""

    tp: tuple[int, ...] = ()
    """Tensor-parallel degrees allowed."""
    pp: tuple[int, ...] = ()
    """Pipeline-parallel degrees allowed."""
    cp: tuple[int, ...] = ()
    """Context-parallel degrees allowed."""
    ep: tuple[int, ...] = ()
    """Expert-parallel degrees allowed."""
    virtual_stages: tuple[int, ...] = ()
    """Model chunks per pipeline rank allowed (pipelines with pp > 1)."""
    micro_batch_sizes: tuple[int, ...] = ()
    """Sequences per micro-batch allowed."""
    zero_stages: tuple[int, ...] = ()
    """ZeRO stages allowed (0-3)."""
    schedules: tuple[str, ...] = ()
    """Pipeline schedules allowed (``costmodels.layout.SCHEDULES`` names)."""
    recompute_modes: tuple[str, ...] = ()
    """Recomputation modes allowed (``Layout.recompute`` names)."""
    gpus_per_nvlink_domain: tuple[int, ...] = ()
    """GPUs of each NVLink domain the job may use (``Layout.gpus_per_nvlink_domain``; whole nodes,
    at most the domain); () = the search's own choices (``hardware_specs.placement.placement_choices``)."""
    moe_dispatchers: tuple[str, ...] = ()
    """MoE token dispatchers allowed (``Layout.moe_dispatcher`` names)."""
    allow_offload: bool = True
    """False: never offload optimizer states."""

    def to_dict(self) -> dict:
        """The parts the user narrowed (the plan file's ``inputs.narrowing``)."""
        out: dict = {k: list(getattr(self, k)) for k in NARROWING_INTS + NARROWING_NAMES if getattr(self, k)}
        if not self.allow_offload:
            out["allow_offload"] = False
        return out

    @classmethod
    def from_dict(cls, raw: dict) -> "Narrowing":
        """Inverse of ``to_dict``; raises ``TypeError``/``ValueError`` on a malformed value."""
        unknown = sorted(set(raw) - set(NARROWING_INTS + NARROWING_NAMES + ("allow_offload",)))
        if unknown:
            raise ValueError(f"unknown key {unknown[0]!r}")
        values: dict = {}
        for key, value in raw.items():
            if key == "allow_offload":
                if not isinstance(value, bool):
                    raise ValueError("allow_offload: expected true or false")
                values[key] = value
                continue
            kind = int if key in NARROWING_INTS else str
            if not isinstance(value, list) or not all(isinstance(v, kind) and not isinstance(v, bool) for v in value):
                raise ValueError(f"{key}: expected a list of {'integers' if kind is int else 'names'}")
            values[key] = tuple(value)
        return cls(**values)


def features_used(table: RuntimeCapabilities, layout: "Layout") -> tuple[Feature | ShardingOption, ...]:
    """The table's entries ``layout`` turns on (the options an export must set to run it as costed):
    its ZeRO stage's sharding option, its schedule (pp > 1), its recomputation mode, TP overlap, EP
    overlap and optimizer offload when on, every overlap the cost model always counts
    (``Feature.costed``), and with ep > 1 its MoE dispatcher."""
    out: list[Feature | ShardingOption] = [s for s in table.sharding if s.zero_stage == layout.zero_stage][:1]
    if layout.pp > 1:
        out += [f for f in table.schedules if f.name == layout.schedule]
    out += [f for f in table.recompute if f.name == layout.recompute and f.name != "none"]
    out += [f for f in table.overlaps if f.costed
            or (f.name == "tp_comm_overlap" and layout.tp_comm_overlap)
            or (f.name == "optimizer_offload" and layout.optimizer_offload)
            or (f.name == "ep_comm_overlap" and layout.ep_comm_overlap)]
    if layout.ep > 1:
        out += [f for f in table.dispatchers if f.name == layout.moe_dispatcher]
    return tuple(out)


def runtime_summary(runtime: str, version: str | None, layout: "Layout | None") -> str:
    """One line: the runtime, its version, and the options ``layout`` turns on."""
    table = capabilities(runtime, version)
    line = f"runtime {runtime} {table.latest} ({table.framework})"
    if layout is not None:
        flags = [_with_values(f.option, layout) for f in features_used(table, layout)
                 if not f.option.startswith("(")]  # "(no flag)"
        line += "; sets " + " ".join(flags) if flags else "; no options beyond the degrees"
    return line


def _with_values(option: str, layout: "Layout") -> str:
    """``option`` with the table's placeholders (``P`` pipeline stages, ``V`` virtual stages) set to
    the layout's values: ``--pipeline-model-parallel-size 4``."""
    values = {"P": str(layout.pp), "V": str(layout.virtual_stages)}
    tokens = []
    for token in option.split():
        key, eq, value = token.rpartition("=")
        tokens.append(f"{key}={values[value]}" if eq and value in values else values.get(token, token))
    return " ".join(tokens)
