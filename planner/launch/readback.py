"""Read an exported job back: each framework's own file turned into a ``Layout`` and training options.

The round trip (export, read back, ``planner.evaluate``) is how the tests show the file runs what
was costed. Each reader reads only the framework's file(s) and the world size the launch script
starts (``NNODES`` x ``GPUS_PER_NODE``); the model's architecture is the plan's (not re-read).
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path

from costmodels.layout import Layout
from costmodels.stage_split import first_last_split

from .frameworks import TORCHTITAN_SCHEDULES
from .megatron_fields import args_to_fields

_PRECISION = {("e4m3", "blockwise"): ("fp8", "blockwise"), ("hybrid", "delayed"): ("fp8", "delayed"),
              ("hybrid", "tensorwise"): ("fp8", "tensorwise"), ("e4m3", "mxfp8"): ("mxfp8", None)}
"""(Megatron ``--fp8-format``, ``--fp8-recipe``) -> (autoplan precision, fp8 recipe)."""


def launch_world_size(job: Path) -> int:
    """``NNODES`` x ``GPUS_PER_NODE`` as launch.sh sets them by default."""
    text = (job / "launch.sh").read_text(encoding="utf-8")
    get = lambda name: int(re.search(rf'^{name}="\$\{{{name}:-(\d+)\}}"', text, re.M).group(1))  # noqa: E731
    return get("NNODES") * get("GPUS_PER_NODE")


def bash_array(text: str, name: str) -> list[str]:
    """The tokens of ``NAME=( ... )`` in a bash file (shell quoting undone, comments skipped)."""
    body = re.search(rf"^{name}=\((.*?)^\)", text, re.M | re.S).group(1)
    return shlex.split(body, comments=True)


def _chunks(fields: dict, num_layers: int, pp: int, v: int) -> tuple[int, ...]:
    layout = fields.get("model.pipeline_model_parallel_layout")
    if layout:
        return tuple(int(part.removeprefix("t*")) for part in str(layout)[1:-1].split("|"))
    first, last = (fields.get(f"model.num_layers_in_{end}_pipeline_stage") for end in ("first", "last"))
    if first is None and last is None:
        return ()
    return first_last_split(num_layers, pp, v, first, last)


def _megatron_zero(fields: dict) -> int:
    strategy = fields.get("ddp.data_parallel_sharding_strategy")
    if fields.get("ddp.use_megatron_fsdp"):
        return {"optim_grads": 2, "optim_grads_params": 3}[strategy]
    return 1 if fields.get("ddp.use_distributed_optimizer") else 0


def megatron_fields_layout(fields: dict, world_size: int, num_layers: int) -> tuple[Layout, dict]:
    """(Layout, training options) of Megatron-Core config fields (``section.field``)."""
    get = lambda key, default=None: default if fields.get(key) is None else fields[key]  # noqa: E731  null = unset
    tp, pp, cp = get("model.tensor_model_parallel_size", 1), get("model.pipeline_model_parallel_size", 1), \
        get("model.context_parallel_size", 1)
    layout_string = get("model.pipeline_model_parallel_layout")  # it carries the virtual stages itself
    v = len(str(layout_string).split("|")) // pp if layout_string else get("model.virtual_pipeline_model_parallel_size", 1)
    dp, mb = world_size // (tp * pp * cp), get("train.micro_batch_size")
    granularity, method = get("model.recompute_granularity"), get("model.recompute_method")
    layout = Layout(dp=dp, tp=tp, pp=pp, cp=cp, ep=get("model.expert_model_parallel_size", 1),
                    expert_tp=get("model.expert_tensor_parallel_size", 0), zero_stage=_megatron_zero(fields),
                    sequence_parallel=bool(get("model.sequence_parallel")),
                    tp_comm_overlap=bool(get("model.tp_comm_overlap") or get("comm_overlap.tp_comm_overlap")),
                    micro_batch_size=mb, num_microbatches=get("train.global_batch_size") // (mb * dp),
                    schedule="interleaved" if v > 1 else "1f1b", virtual_stages=v,
                    layers_per_chunk=_chunks(fields, num_layers, pp, v), recompute=granularity or "none",
                    recompute_num_layers=get("model.recompute_num_layers") if method == "block" else 0,
                    optimizer_offload=bool(get("optimizer.optimizer_cpu_offload")),
                    activation_offload_layers=get("model.cpu_offloading_num_layers", 0),
                    moe_dispatcher=get("model.moe_flex_dispatcher_backend", "deepep")  # TransformerConfig's default
                    if get("model.moe_token_dispatcher_type") == "flex" else "alltoall",
                    ep_comm_overlap=bool(get("model.overlap_moe_expert_parallel_comm")
                                         or get("comm_overlap.overlap_moe_expert_parallel_comm")))
    if get("model.fp8"):
        precision, recipe = _PRECISION[(get("model.fp8"), get("model.fp8_recipe"))]
    elif get("model.fp4"):
        precision, recipe = "nvfp4", None
    else:
        precision, recipe = ("bf16" if get("model.bf16") else "fp16" if get("model.fp16") else "fp32"), None
    training = {"global_batch_size": get("train.global_batch_size"), "seq_len": get("model.seq_length"),
                "precision": precision, "fp8_recipe": recipe,
                "optimizer": "sgd" if get("optimizer.optimizer") == "sgd" else "adamw",
                "context_attention": "all_gather" if get("model.cp_comm_type") == "allgather" else "ring"}
    return layout, training


def read_megatron_job(job: Path, num_layers: int) -> tuple[Layout, dict]:
    """The Megatron-LM job: ``megatron_args.sh``'s MEGATRON_ARGS and launch.sh's world size."""
    tokens = bash_array((job / "megatron_args.sh").read_text(encoding="utf-8"), "MEGATRON_ARGS")
    return megatron_fields_layout(args_to_fields(tokens), launch_world_size(job), num_layers)


def bridge_fields(job: Path) -> dict[str, object]:
    """``{section.field: value}`` of the Megatron-Bridge overrides file (YAML-free ``KEY=VALUE`` lines)."""
    values = {}
    for line in (job / "bridge_overrides.txt").read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            key, text = line.split("=", 1)
            values[key] = json.loads(text)
    return values


def read_bridge_job(job: Path, num_layers: int) -> tuple[Layout, dict]:
    return megatron_fields_layout(bridge_fields(job), launch_world_size(job), num_layers)


def read_torchtitan_job(job: Path, num_layers: int) -> tuple[Layout, dict]:
    """The torchtitan job: ``torchtitan.toml`` and launch.sh's world size."""
    c = tomllib.loads((job / "torchtitan.toml").read_text(encoding="utf-8"))
    return torchtitan_sections_layout(c, launch_world_size(job), num_layers)


def torchtitan_sections_layout(c: dict, world_size: int, num_layers: int) -> tuple[Layout, dict]:
    """(Layout, training options) of torchtitan's config sections (``{section: {field: value}}``, as
    the TOML holds them or as torchtitan's parsed ``JobConfig`` has them)."""
    p, t, ac = c["parallelism"], c["training"], c["activation_checkpoint"]
    tp, pp, cp = p["tensor_parallel_degree"], p["pipeline_parallel_degree"], p["context_parallel_degree"]
    replicate, shard = p["data_parallel_replicate_degree"], p["data_parallel_shard_degree"]
    dp = replicate * shard
    assert dp * tp * pp * cp == world_size, (dp, tp, pp, cp, world_size)
    schedule = {v: k for k, v in TORCHTITAN_SCHEDULES.items()}[p["pipeline_parallel_schedule"]]
    parts = p.get("module_fqns_per_model_part")
    counts = tuple(sum(name.startswith("layers.") for name in part) for part in parts) if parts else ()
    per_stage = p.get("pipeline_parallel_layers_per_stage")
    v = (len(counts) if counts else num_layers // per_stage if per_stage else 1) // pp if pp > 1 else 1
    mb = p["pipeline_parallel_microbatch_size"] if pp > 1 else t["local_batch_size"]
    # torchtitan's FSDP mesh is dp_shard x cp: it shards whenever either is > 1 (parallel_dims.py fsdp_enabled)
    zero = 0 if shard == 1 and cp == 1 else 3 if p["fsdp_reshard_after_forward"] == "always" else 2
    layout = Layout(dp=dp, tp=tp, pp=pp, cp=cp, ep=p["expert_parallel_degree"],
                    expert_tp=p["expert_tensor_parallel_degree"] if p["expert_parallel_degree"] > 1 and
                    p["expert_tensor_parallel_degree"] != tp else 0,
                    zero_stage=zero, hsdp_shard_degree=shard if zero and replicate > 1 else 0,
                    sequence_parallel=tp > 1, tp_comm_overlap=p["enable_async_tensor_parallel"],
                    micro_batch_size=mb, num_microbatches=t["global_batch_size"] // (mb * dp),
                    schedule=schedule if pp > 1 else "1f1b", virtual_stages=v, layers_per_chunk=counts,
                    recompute={"selective": "op-sac"}.get(ac["mode"], ac["mode"]),
                    optimizer_offload=t["enable_cpu_offload"])
    converters = c["model"].get("converters") or []
    quantize = c.get("quantize", {}).get("linear", {})
    precision, recipe = ("fp8", quantize["float8"]["recipe_name"]) if "quantize.linear.float8" in converters else \
        ("mxfp8", None) if "quantize.linear.mx" in converters else \
        ("fp32" if t["mixed_precision_param"] == "float32" else "bf16", None)
    training = {"global_batch_size": t["global_batch_size"], "seq_len": t["seq_len"], "precision": precision,
                "fp8_recipe": recipe, "optimizer": "adamw", "compiled": c["compile"]["enable"],
                "context_attention": "ring" if p["context_parallel_rotate_method"] == "alltoall" else "all_gather"}
    return layout, training


TORCHTITAN_030_POLICIES = {"FullAC": "full", "SelectiveAC": "selective", None: "none"}
"""torchtitan 0.3.0's activation-checkpoint policy class (None: the ``none`` subcommand) -> 0.2.2's mode."""


def torchtitan_030_sections_layout(c: dict, world_size: int, num_layers: int) -> tuple[Layout, dict]:
    """(Layout, training options) of torchtitan 0.3.0's parsed ``Trainer.Config`` sections, with
    ``activation_checkpoint.mode`` the policy's class name: read as 0.2.2's (``torchtitan_sections_layout``)
    after the moves of 0.3.0. Async TP sits in ``compile``; the model spec holds no converter (the
    export refuses low precision); there is no expert tp degree (the export refuses MoE models) and
    no cp rotation option (K/V are all-gathered; the attention is left out of the options at cp 1)."""
    p = c["parallelism"]
    moved = {"expert_tensor_parallel_degree": p["tensor_parallel_degree"],
             "context_parallel_rotate_method": "allgather",
             "enable_async_tensor_parallel": c["compile"]["enable_async_tensor_parallel"]}
    sections = {**c, "parallelism": {**p, **moved}, "model": {"converters": []},
                "activation_checkpoint": {"mode": TORCHTITAN_030_POLICIES[c["activation_checkpoint"]["mode"]]}}
    layout, training = torchtitan_sections_layout(sections, world_size, num_layers)
    if layout.cp == 1:  # how K/V cross cp ranks says nothing without cp
        del training["context_attention"]
    return layout, training


def read_deepspeed_job(job: Path, num_layers: int) -> tuple[Layout, dict]:
    """The Megatron-DeepSpeed job: ``deepspeed.json`` and ``megatron_deepspeed_args.sh``."""
    ds = json.loads((job / "deepspeed.json").read_text(encoding="utf-8"))
    tokens = bash_array((job / "megatron_deepspeed_args.sh").read_text(encoding="utf-8"), "MEGATRON_DS_ARGS")
    fields = args_to_fields(tokens)
    get = lambda key, default=None: default if fields.get(key) is None else fields[key]  # noqa: E731  null = unset
    tp, pp = get("model.tensor_model_parallel_size"), get("model.pipeline_model_parallel_size")
    dp = launch_world_size(job) // (tp * pp)
    ep = int(tokens[tokens.index("--moe-expert-parallel-size") + 1]) if "--moe-expert-parallel-size" in tokens else 1
    zero = ds["zero_optimization"]
    layout = Layout(dp=dp, tp=tp, pp=pp, ep=ep, zero_stage=zero["stage"],
                    sequence_parallel=bool(get("model.sequence_parallel")),
                    micro_batch_size=ds["train_micro_batch_size_per_gpu"],
                    num_microbatches=ds["gradient_accumulation_steps"],
                    recompute=get("model.recompute_granularity") or "none",
                    recompute_num_layers=get("model.recompute_num_layers") if get("model.recompute_method") == "block"
                    else 0, optimizer_offload="offload_optimizer" in zero)
    precision = "bf16" if ds["bf16"]["enabled"] else "fp16" if ds["fp16"]["enabled"] else "fp32"
    training = {"global_batch_size": ds["train_batch_size"], "seq_len": get("model.seq_length"),
                "precision": precision, "fp8_recipe": None,
                "optimizer": "sgd" if ds["optimizer"]["type"] == "SGD" else "adamw"}
    return layout, training


def read_checkpoint_every(runtime: str, job: Path) -> int | None:
    """Steps between checkpoints the exported job saves at (None: it saves none): Megatron's
    ``--save-interval`` (Megatron-LM, Megatron-DeepSpeed), Megatron-Bridge's ``checkpoint.save_interval``,
    torchtitan's ``[checkpoint] interval`` when ``enable``."""
    if runtime == "torchtitan":
        section = tomllib.loads((job / "torchtitan.toml").read_text(encoding="utf-8")).get("checkpoint", {})
        return section.get("interval") if section.get("enable") else None
    if runtime == "megatron-bridge":
        return bridge_fields(job).get("checkpoint.save_interval")
    file, name = ("megatron_args.sh", "MEGATRON_ARGS") if runtime == "megatron" else \
        ("megatron_deepspeed_args.sh", "MEGATRON_DS_ARGS")
    tokens = bash_array((job / file).read_text(encoding="utf-8"), name)
    return args_to_fields(tokens).get("checkpoint.save_interval")


READERS = {"megatron": read_megatron_job, "megatron-bridge": read_bridge_job, "torchtitan": read_torchtitan_job,
           "deepspeed": read_deepspeed_job}
"""Runtime -> reader of its exported job."""
