"""Each runtime's exported job, checked by the framework's own code and read back.

Parsers: torchtitan v0.2.2's ``ConfigManager`` parses the TOML into its ``JobConfig``; DeepSpeed's
``DeepSpeedConfig`` validates the JSON; Megatron-LM's argument parser is not in the megatron-core
wheel (``megatron/training`` is not shipped), so the Megatron arguments and Megatron-Bridge overrides
are built into Megatron-Core's own ``TransformerConfig`` (which validates degrees, stages, recompute,
offload), ``DistributedDataParallelConfig`` and ``OptimizerConfig``. Round trip: the file read back
(``planner.launch.readback``) and evaluated gives the plan's step time and peak memory, and the job
saves at the plan's checkpoint interval: torchtitan's ``Checkpoint`` config parses it; Megatron's
``CheckpointConfig`` (``--save-interval``) is in ``megatron/training`` too, so it is read back only, and
Megatron-DeepSpeed takes the same argument beside its DeepSpeed JSON, which has no interval."""

from __future__ import annotations

import dataclasses

import importlib.util
import json
import sys
import types
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

from costmodels.layout import Layout
from planner import api
from planner.cli import main
from planner.launch.export_problems import export_problems
from planner.launch.job import write_job
from planner.launch.megatron_fields import args_to_fields
from planner.launch.readback import (READERS, bash_array, bridge_fields, launch_world_size,
                                     read_checkpoint_every)
from planner.plan.plan_file import PlanFile, PlanFileError, read_plan_file

CASES = {
    # (model, gpus, global batch, seq len, evaluate layout options) per done-criterion size
    "llama3-8b": ("llama3-8b", "h100-sxm-80gb", 8, 64, 4096),
    "llama3-70b": ("llama3-70b", "h100-sxm-80gb", 64, 512, 8192),
    "gpt3-175b": ("gpt3-175b", "a100-sxm-80gb", 1024, 1536, 2048),
    "mixtral-8x7b": ("mixtral-8x7b", "h100-sxm-80gb", 64, 512, 4096),
    "llama3-405b": ("llama3-405b", "h100-sxm-80gb", 16384, 2048, 8192),
}
MEGATRON_LAYOUTS = {
    "llama3-8b": "--dp 2 --tp 2 --pp 2 --zero 1 --sequence-parallel --tp-comm-overlap --schedule interleaved "
                 "--virtual-stages 2 --recompute selective",
    "llama3-70b": "--dp 4 --tp 4 --pp 2 --cp 2 --zero 1 --sequence-parallel --tp-comm-overlap --layers-per-chunk 41,39",
    "gpt3-175b": "--dp 16 --tp 8 --pp 8 --zero 1 --sequence-parallel --recompute full --schedule interleaved "
                 "--virtual-stages 3",
    "mixtral-8x7b": "--dp 8 --tp 2 --pp 4 --ep 8 --zero 1 --sequence-parallel --recompute full --recompute-layers 2",
    "llama3-405b": "--dp 128 --tp 8 --pp 16 --zero 1 --sequence-parallel --tp-comm-overlap --schedule interleaved "
                   "--virtual-stages 2 --precision fp8 --fp8-recipe delayed",
}
TORCHTITAN_LAYOUTS = {
    "llama3-8b": "--dp 8 --tp 1 --pp 1 --zero 3 --recompute op-sac",
    "llama3-70b": "--dp 8 --tp 8 --pp 1 --zero 3 --hsdp-shard 4 --sequence-parallel",
    "llama3-405b": "--dp 128 --tp 8 --pp 16 --zero 3 --sequence-parallel --schedule interleaved-zb "
                   "--virtual-stages 2 --precision fp8 --fp8-recipe rowwise",
}
DEEPSPEED_LAYOUTS = {
    "llama3-8b": "--dp 8 --tp 1 --pp 1 --zero 3 --recompute full",
    "llama3-70b": "--dp 8 --tp 4 --pp 2 --zero 1 --sequence-parallel --recompute selective",
}
BRIDGE_LAYOUTS = {"llama3-8b": MEGATRON_LAYOUTS["llama3-8b"], "llama3-70b": MEGATRON_LAYOUTS["llama3-70b"],
                  "mixtral-8x7b": "--dp 8 --tp 2 --pp 1 --cp 4 --ep 8 --zero 2 --sequence-parallel"}


def _evaluated_plan(tmp_path: Path, runtime: str, case: str, options: str) -> Path:
    model, hardware, gpus, batch, seq = CASES[case]
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(main, ["evaluate", "--model", model, "--hardware", hardware, "--gpus", str(gpus),
                                       "--global-batch", str(batch), "--seq-len", str(seq), "--runtime", runtime,
                                       *options.split(), "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def _round_trip(tmp_path: Path, runtime: str, case: str, plan_path: Path,
                runtime_version: str | None = None) -> tuple[PlanFile, Path, Layout]:
    """Export the plan's layout (for the runtime's release ``runtime_version``, None: the plan's), read it
    back, evaluate it again: same step time and peak memory."""
    plan = at_release(read_plan_file(plan_path), runtime_version)
    job = tmp_path / "job"
    write_job(plan, job)
    model, hardware, gpus, *_ = CASES[case]
    layout, training = READERS[runtime](job, plan.inputs.model_spec.num_layers)
    expected = plan.best.layout
    same = {f: getattr(layout, f) for f in Layout.__slots__ if f != "layers_per_chunk"}
    assert same == {f: getattr(expected, f) for f in Layout.__slots__ if f != "layers_per_chunk"}
    num_layers = plan.inputs.model_spec.num_layers
    assert layout.chunk_layers(num_layers) == expected.chunk_layers(num_layers)
    spec = plan.inputs.training
    for key, value in training.items():
        assert getattr(spec, key) == value, key
    options = {k: v for k, v in training.items() if k != "global_batch_size"}
    cost = api.evaluate(model=model, hardware=hardware, gpus=gpus, layout=layout, runtime=runtime,
                        global_batch=training["global_batch_size"], gpus_per_node=plan.inputs.gpus_per_node, **options)
    planned = api.evaluate(model=model, hardware=hardware, gpus=gpus, layout=expected, runtime=runtime,
                           global_batch=spec.global_batch_size, seq_len=spec.seq_len, precision=spec.precision,
                           fp8_recipe=spec.fp8_recipe, gpus_per_node=plan.inputs.gpus_per_node,
                           context_attention=spec.context_attention, compiled=spec.compiled)
    assert (cost.step_time_s, cost.peak_memory_bytes) == (planned.step_time_s, planned.peak_memory_bytes)
    predicted = plan.best.predicted  # the plan file rounds to 6 significant digits
    assert cost.step_time_s == pytest.approx(predicted["step_time_s"], rel=1e-5)
    assert cost.peak_memory_bytes / 2**30 == pytest.approx(predicted["peak_memory_gib"], rel=1e-4)
    # the job saves at the plan's Young/Daly interval ("checkpoint every N steps")
    assert read_checkpoint_every(runtime, job) == predicted["goodput"]["checkpoint_every_steps"]
    return plan, job, layout


def at_release(plan: PlanFile, runtime_version: str | None) -> PlanFile:
    """``plan`` for its runtime's release ``runtime_version`` (None: as it is); an evaluated plan names none."""
    if runtime_version is None:
        return plan
    return dataclasses.replace(plan, inputs=dataclasses.replace(plan.inputs, runtime_version=runtime_version))


def _no_torchtitan_init() -> None:
    """Import torchtitan's config package without its ``__init__``, which imports the tokenizer and
    dataset stack (``tokenizers``, ``datasets``) that parsing a config does not need."""
    if "torchtitan" not in sys.modules:
        spec = importlib.util.find_spec("torchtitan")
        if spec is None:
            pytest.skip("torchtitan is not installed (pip install -e '.[frameworks]')")
        package = types.ModuleType("torchtitan")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["torchtitan"] = package


def _megatron_core_configs(fields: dict) -> tuple:
    """Megatron-Core's own config objects built from ``section.field`` values (they validate)."""
    pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install -e '.[frameworks]')")
    import torch
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.transformer_config import TransformerConfig

    section = lambda name: {k.split(".", 1)[1]: v for k, v in fields.items() if k.startswith(name + ".")}  # noqa: E731
    model = {k: v for k, v in section("model").items() if k != "seq_length"}
    # core_transformer_config_from_args: pipeline_dtype is the parameters' dtype
    model["pipeline_dtype"] = torch.bfloat16 if model.get("bf16") else torch.float16 if model.get("fp16") else torch.float32
    optimizer = section("optimizer")
    for key in ("exp_avg_dtype", "exp_avg_sq_dtype"):
        if key in optimizer:
            optimizer[key] = {"bf16": torch.bfloat16, "fp32": torch.float32}[optimizer[key]]
    ddp = {k: v for k, v in section("ddp").items()}
    return model, ddp, optimizer, TransformerConfig, DistributedDataParallelConfig, OptimizerConfig


def _check_megatron_core(fields: dict, plan: PlanFile) -> None:
    model_fields, ddp, optimizer, TransformerConfig, DDPConfig, OptimizerConfig = _megatron_core_configs(fields)
    spec, L = plan.inputs.model_spec, plan.best.layout
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = TransformerConfig(num_layers=spec.num_layers, hidden_size=spec.hidden_size,
                                   num_attention_heads=spec.num_attention_heads, **model_fields)
        ddp_config = DDPConfig(**ddp)
        OptimizerConfig(**optimizer)
    assert (config.tensor_model_parallel_size, config.pipeline_model_parallel_size, config.context_parallel_size,
            config.expert_model_parallel_size) == (L.tp, L.pp, L.cp, L.ep)
    assert (config.virtual_pipeline_model_parallel_size or 1) == L.virtual_stages
    assert config.sequence_parallel == L.sequence_parallel and config.tp_comm_overlap == L.tp_comm_overlap
    assert config.recompute_granularity == (None if L.recompute == "none" else L.recompute)
    assert ddp_config.overlap_grad_reduce  # the cost model counts DP overlap (capabilities dp_overlap)
    assert ddp_config.use_distributed_optimizer == (L.zero_stage >= 1)
    assert ddp_config.overlap_param_gather == (L.zero_stage >= 1)
    strategy = {0: "no_shard", 1: "no_shard", 2: "optim_grads", 3: "optim_grads_params"}[L.zero_stage]
    assert ddp_config.data_parallel_sharding_strategy == strategy


def _check_megatron_job(job: Path, plan: PlanFile) -> None:
    tokens = bash_array((job / "megatron_args.sh").read_text(encoding="utf-8"), "MEGATRON_ARGS")
    _check_megatron_core(args_to_fields(tokens), plan)


@pytest.mark.parametrize("case", sorted(MEGATRON_LAYOUTS))
def test_megatron_job_parses_and_round_trips(tmp_path, case):
    plan_path = _evaluated_plan(tmp_path, "megatron", case, MEGATRON_LAYOUTS[case])
    plan, job, _ = _round_trip(tmp_path, "megatron", case, plan_path)
    _check_megatron_job(job, plan)


@pytest.mark.parametrize("case", sorted(BRIDGE_LAYOUTS))
def test_megatron_bridge_job_parses_and_round_trips(tmp_path, case):
    plan, job, _ = _round_trip(tmp_path, "megatron-bridge", case,
                               _evaluated_plan(tmp_path, "megatron-bridge", case, BRIDGE_LAYOUTS[case]))
    fields = bridge_fields(job)
    assert fields["ddp.grad_reduce_in_fp32"] is False  # the megatron-bridge convention's bf16 reduction
    assert fields["model.cross_entropy_fusion_impl"] == "te"  # and its fused loss (fused_cross_entropy)
    fields = {("model.tp_comm_overlap" if k == "comm_overlap.tp_comm_overlap" else k): v for k, v in fields.items()
              if not k.startswith(("mixed_precision.", "train.")) and k != "ddp.grad_reduce_in_fp32"}
    _check_megatron_core(fields, plan)


@pytest.mark.parametrize("case", sorted(TORCHTITAN_LAYOUTS))
def test_torchtitan_job_parses_and_round_trips(tmp_path, case):
    plan_path = _evaluated_plan(tmp_path, "torchtitan", case, TORCHTITAN_LAYOUTS[case])
    plan, job, _ = _round_trip(tmp_path, "torchtitan", case, plan_path, "v0.2.2")  # the TOML's release
    _check_torchtitan_job(job, plan)


def _check_torchtitan_job(job: Path, plan: PlanFile) -> None:
    """torchtitan's own ``ConfigManager`` parses the TOML; its fields are the plan's, field by field."""
    L = plan.best.layout
    _no_torchtitan_init()
    from torchtitan.config import ConfigManager

    config = ConfigManager().parse_args(["--job.config_file", str(job / "torchtitan.toml")])
    p = config.parallelism
    assert (p.tensor_parallel_degree, p.pipeline_parallel_degree, p.context_parallel_degree,
            p.expert_parallel_degree) == (L.tp, L.pp, L.cp, L.ep)
    assert p.data_parallel_replicate_degree * p.data_parallel_shard_degree == L.dp
    assert p.fsdp_reshard_after_forward == ("always" if L.zero_stage == 3 else "never")
    from torchtitan.distributed.parallel_dims import ParallelDims  # it checks the degrees against the world

    dims = ParallelDims(dp_replicate=p.data_parallel_replicate_degree, dp_shard=p.data_parallel_shard_degree,
                        cp=p.context_parallel_degree, tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
                        ep=p.expert_parallel_degree, etp=p.expert_tensor_parallel_degree,
                        world_size=launch_world_size(job))
    assert dims.fsdp_enabled == (L.zero_stage > 0)  # FSDP over dp_shard x cp: what autoplan costs as ZeRO-2/3
    assert config.activation_checkpoint.mode == {"op-sac": "selective"}.get(L.recompute, L.recompute)
    assert config.training.global_batch_size == plan.inputs.training.global_batch_size
    assert config.training.seq_len == plan.inputs.training.seq_len
    assert config.checkpoint.enable is True
    assert config.checkpoint.interval == plan.best.predicted["goodput"]["checkpoint_every_steps"]


@pytest.mark.parametrize("case", sorted(DEEPSPEED_LAYOUTS))
def test_deepspeed_job_parses_and_round_trips(tmp_path, case, monkeypatch):
    plan, job, L = _round_trip(tmp_path, "deepspeed", case,
                               _evaluated_plan(tmp_path, "deepspeed", case, DEEPSPEED_LAYOUTS[case]))
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (pip install -e '.[frameworks]')")
    from deepspeed.runtime import config as ds_config
    from deepspeed.runtime.config import DeepSpeedConfig

    # no process group on a test machine: rank 0, and the mpu below gives the data-parallel world
    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = DeepSpeedConfig(json.loads((job / "deepspeed.json").read_text(encoding="utf-8")),
                                 world_size_override(L))
    assert config.zero_optimization_stage == L.zero_stage
    assert config.zero_config.overlap_comm is True
    assert config.train_micro_batch_size_per_gpu == L.micro_batch_size
    assert config.gradient_accumulation_steps == L.num_microbatches
    assert config.bfloat16_config.enabled == (plan.inputs.training.precision == "bf16")


def world_size_override(layout: Layout):
    """DeepSpeedConfig's ``mpu``: the data-parallel world it checks the batch against (dp ranks)."""
    return types.SimpleNamespace(get_data_parallel_world_size=lambda: layout.dp,
                                 get_sequence_parallel_world_size=lambda: 1,
                                 get_sequence_data_parallel_world_size=lambda: layout.dp)


@pytest.mark.parametrize("runtime,options,field", [
    ("megatron", "--dp 4 --tp 4 --pp 2 --cp 2 --zero 2 --sequence-parallel", "layout.zero_stage"),
    ("megatron", "--dp 16 --tp 2 --pp 2 --schedule zb-v --virtual-stages 2", "layout.schedule"),
    ("megatron", "--dp 16 --tp 2 --pp 2 --recompute op-sac", "layout.recompute"),
    ("torchtitan", "--dp 16 --tp 2 --pp 2 --zero 1 --sequence-parallel", "layout.zero_stage"),
    ("torchtitan", "--dp 16 --tp 2 --pp 2 --zero 3 --recompute selective --sequence-parallel", "layout.recompute"),
    ("deepspeed", "--dp 16 --tp 2 --pp 2 --zero 2", "layout.zero_stage"),
    ("deepspeed", "--dp 16 --tp 2 --pp 2 --cp 2 --zero 1", "layout.cp"),
])
def test_what_a_runtime_cannot_run_is_refused_naming_the_field(tmp_path, runtime, options, field):
    dims = dict(zip(options.split()[::2], options.split()[1::2]))
    gpus = int(dims["--dp"]) * int(dims["--tp"]) * int(dims["--pp"]) * int(dims.get("--cp", 1))
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(main, ["evaluate", "--model", "llama3-70b", "--hardware", "h100-sxm-80gb", "--gpus",
                                       str(gpus), "--global-batch", str(gpus * 4), "--seq-len", "4096", "--runtime",
                                       runtime, *options.split(), "--out", str(out)])
    assert result.exit_code == 0, result.output
    plan = read_plan_file(out)
    problems = export_problems(runtime, plan.inputs.model_spec, plan.inputs.training, plan.best.layout)
    assert problems and problems[0].startswith(field)
    with pytest.raises(PlanFileError, match=field):
        write_job(plan, tmp_path / "job")
    refused = CliRunner().invoke(main, ["launch", str(out), "--out", str(tmp_path / "job2")])
    assert refused.exit_code == 2 and field in refused.output and "Traceback" not in refused.output


def test_readme_default_plan_launches_as_a_megatron_job(tmp_path):
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(main, ["plan", "--model", "llama3-70b", "--hardware", "h100-sxm-80gb", "--gpus", "64",
                                       "--global-batch", "512", "--seq-len", "8192", "--out", str(out)])
    assert result.exit_code == 0, result.output
    launched = CliRunner().invoke(main, ["launch", str(out), "--out", str(tmp_path / "job")])
    assert launched.exit_code == 0, launched.output
    plan = read_plan_file(out)
    tokens = bash_array((tmp_path / "job" / "megatron_args.sh").read_text(encoding="utf-8"), "MEGATRON_ARGS")
    _check_megatron_core(args_to_fields(tokens), plan)


def test_torchtitan_toml_names_torchtitans_own_llama3_flavors():
    """torchtitan v0.2.2 registers Llama 3 as "8B", "70B" and "405B" (torchtitan/models/llama3/__init__.py);
    the TOML names that flavor for those shapes, and keeps the plan's name (with a note) for any other."""
    from costmodels.presets import load_model
    from planner.launch.frameworks import torchtitan_flavor

    assert [torchtitan_flavor(n, load_model(n)) for n in ("llama3-8b", "llama3-70b", "llama3-405b")] == \
        ["8B", "70B", "405B"]
    assert torchtitan_flavor("mixtral-8x7b", load_model("mixtral-8x7b")) == "mixtral-8x7b"  # 32 x 4096 too, but MoE
    assert torchtitan_flavor("llama2-7b", load_model("llama2-7b")) == "llama2-7b"
