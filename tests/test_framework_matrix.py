"""Issue 35's table: seven jobs under four runtimes. In each cell either ``plan`` refuses in one line
(exit 2) naming a runtime that can run the job, or the pick's exported job passes the framework's
own parser or argument schema, builds (torchtitan: its mesh and pipeline stages on a fake process
group; DeepSpeed: its ``DeepSpeedConfig``; Megatron: Megatron-Core's config classes) and, rebuilt from
what the framework parsed, evaluates to the plan's peak memory and step time exactly.

Parsers: Megatron-LM's and Megatron-DeepSpeed's ``pretrain_gpt.py`` arguments through their schemas
(``tests/framework_args.py``: Megatron-LM at the plan's release and at the capability table's commit);
torchtitan v0.3.0's ``ConfigManager`` on the job's command line in ``tests/torchtitan030_build.py`` (its own
process: it starts a fake process group), and v0.2.2's on the TOML in ``tests/torchtitan_build.py`` for the
jobs planned with ``--runtime-version v0.2.2``; DeepSpeed's ``DeepSpeedConfig``; Megatron-Bridge's overrides are Megatron-Core's
``TransformerConfig``/``DistributedDataParallelConfig``/``OptimizerConfig`` fields (megatron-bridge
itself is not installed by ``scripts/setup.sh``: its package pulls NeMo's stack)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import types
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

from costmodels.capabilities import capabilities
from framework_args import (load_schema, megatron_deepspeed_validate, megatron_fields, megatron_validate, parse)
from planner import api
from planner.cli import main
from planner.launch.export_problems import export_problems
from planner.launch.job import write_job
from planner.launch.readback import (bash_array, bridge_fields, launch_world_size, megatron_fields_layout,
                                     torchtitan_sections_layout)
from planner.plan.plan_file import PlanFile, read_plan_file
from test_framework_jobs import CASES, _check_megatron_core

HF = Path(__file__).parent / "data" / "hf_configs"
JOBS = {
    **CASES,  # the five reference jobs
    "mistral-nemo-12b": (str(HF / "mistral-nemo-12b.json"), "h100-sxm-80gb", 16, 256, 4096),
    "qwen3-30b-a3b": (str(HF / "qwen3-30b-a3b.json"), "h100-sxm-80gb", 64, 512, 4096),
}
"""The five reference jobs, Mistral-Nemo 12B from its config.json (rotary base 1e6, head dim 128
apart from hidden / heads) and Qwen3-30B-A3B (MoE, q/k norms)."""
RUNTIMES = ("megatron", "megatron-bridge", "torchtitan", "deepspeed")
REFUSED = {
    # torchtitan's job names its llama3 model, which is dense, LayerNorm-free, ... (framework_rules)
    ("gpt3-175b", "torchtitan"): "LayerNorm", ("mixtral-8x7b", "torchtitan"): "mixture-of-experts",
    ("mistral-nemo-12b", "torchtitan"): "head dim 128", ("qwen3-30b-a3b", "torchtitan"): "mixture-of-experts",
    # Megatron-DeepSpeed's GPT has no q/k norms
    ("qwen3-30b-a3b", "deepspeed"): "q/k norms",
}
"""The cells ``plan`` refuses, with the reason its line must give; every other cell runs."""


def _plan(tmp_path: Path, job: str, runtime: str, *extra: str):
    model, hardware, gpus, batch, seq = JOBS[job]
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(main, ["plan", "--model", model, "--hardware", hardware, "--gpus", str(gpus),
                                       "--global-batch", str(batch), "--seq-len", str(seq), "--runtime", runtime,
                                       *extra, "--out", str(out)])
    return result, out


def _evaluated(plan: PlanFile, runtime: str, layout, training: dict) -> tuple[float, int]:
    """(step s, peak bytes) of ``layout`` with the training options read back, on the plan's job."""
    inputs = plan.inputs
    options = {k: v for k, v in training.items() if k != "global_batch_size"}
    cost = api.evaluate(model=inputs.model_spec, hardware=inputs.hardware, gpus=inputs.gpus, layout=layout,
                        runtime=runtime, global_batch=training["global_batch_size"],
                        gpus_per_node=inputs.gpus_per_node, **options)
    return cost.step_time_s, cost.peak_memory_bytes


def _assert_round_trip(plan: PlanFile, runtime: str, layout, training: dict) -> None:
    """The layout rebuilt from the parsed job is the plan's, and costs the plan's step and peak."""
    expected, n = plan.best.layout, plan.inputs.model_spec.num_layers
    fields = [f for f in type(expected).__slots__ if f != "layers_per_chunk"]
    assert {f: getattr(layout, f) for f in fields} == {f: getattr(expected, f) for f in fields}
    assert layout.chunk_layers(n) == expected.chunk_layers(n)
    for key, value in training.items():
        assert getattr(plan.inputs.training, key) == value, key
    step, peak = _evaluated(plan, runtime, layout, training)
    assert step == pytest.approx(plan.best.predicted["step_time_s"], rel=1e-5)
    assert peak / 2**30 == pytest.approx(plan.best.predicted["peak_memory_gib"], rel=1e-4)


def _check_megatron(plan: PlanFile, job: Path) -> None:
    tokens = bash_array((job / "megatron_args.sh").read_text(encoding="utf-8"), "MEGATRON_ARGS")
    world = launch_world_size(job)
    for schema in (f"megatron-lm@{plan.inputs.runtime_version}", "megatron-lm@" + capabilities("megatron").commit[:12]):
        args = parse(schema, tokens)  # raises if an option or value would be refused
        assert megatron_validate(args, world) == []
        assert args.rotary_base == int(plan.inputs.model_spec.rope_theta)
        layout, training = megatron_fields_layout(megatron_fields(schema, args), world, args.num_layers)
        _assert_round_trip(plan, "megatron", layout, training)
    _check_megatron_core(megatron_fields(schema, args), plan)


def _check_bridge(plan: PlanFile, job: Path) -> None:
    fields = bridge_fields(job)
    # what a recipe does not fix for the plan: how long and how fast to train, how often to save (where
    # it saves and logs is launch.sh's, in the job directory: test_framework_launch.py)
    assert fields["train.train_iters"] > 0 and fields["optimizer.lr"] > 0 and fields["scheduler.lr_warmup_iters"] >= 0
    assert fields["checkpoint.save_interval"] > 0
    layout, training = megatron_fields_layout(fields, launch_world_size(job), plan.inputs.model_spec.num_layers)
    _assert_round_trip(plan, "megatron-bridge", layout, training)
    fields = {("model.tp_comm_overlap" if k == "comm_overlap.tp_comm_overlap" else k): v for k, v in fields.items()
              if not k.startswith(("mixed_precision.", "train.", "scheduler.")) and k != "ddp.grad_reduce_in_fp32"}
    _check_megatron_core(fields, plan)


def _check_deepspeed(plan: PlanFile, job: Path) -> None:
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (scripts/setup.sh)")
    from deepspeed.runtime import config as ds_module
    from deepspeed.runtime.config import DeepSpeedConfig

    raw = json.loads((job / "deepspeed.json").read_text(encoding="utf-8"))
    args = parse("megatron-deepspeed@4efb479d5317",
                 bash_array((job / "megatron_deepspeed_args.sh").read_text(encoding="utf-8"), "MEGATRON_DS_ARGS"))
    world, model, L = launch_world_size(job), plan.inputs.model_spec, plan.best.layout
    assert megatron_deepspeed_validate(args, raw, world) == []
    dp = world // (args.tensor_model_parallel_size * args.pipeline_model_parallel_size)
    mpu = types.SimpleNamespace(get_data_parallel_world_size=lambda: dp, get_sequence_parallel_world_size=lambda: 1,
                                get_sequence_data_parallel_world_size=lambda: dp)
    original = ds_module.dist.get_rank
    ds_module.dist.get_rank = lambda *a, **k: 0  # no process group here: rank 0
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds = DeepSpeedConfig(raw, mpu)
    finally:
        ds_module.dist.get_rank = original
    # what the framework holds agrees with the plan, field by field
    assert args.zero_stage == ds.zero_optimization_stage == L.zero_stage
    assert (args.tokenizer_type, args.vocab_size) == ("NullTokenizer", model.vocab_size)
    if model.positions == "rotary":
        assert args.use_rotary_position_embeddings and args.rope_theta == int(model.rope_theta)
    if model.moe is not None:
        assert args.enable_expert_tensor_parallelism == (L.etp > 1)
        assert args.num_experts == [model.moe.num_experts] and args.topk == model.moe.top_k
    recompute = "full" if args.recompute_granularity == "full" else args.recompute_granularity or "none"
    layout = type(L)(dp=dp, tp=args.tensor_model_parallel_size, pp=args.pipeline_model_parallel_size,
                     ep=args.moe_expert_parallel_size,
                     expert_tp=0 if model.moe is None or args.enable_expert_tensor_parallelism
                     or args.tensor_model_parallel_size == 1 else 1,
                     zero_stage=ds.zero_optimization_stage, sequence_parallel=args.sequence_parallel,
                     micro_batch_size=ds.train_micro_batch_size_per_gpu,
                     num_microbatches=ds.gradient_accumulation_steps, recompute=recompute,
                     recompute_num_layers=args.recompute_num_layers if args.recompute_method == "block" else 0,
                     optimizer_offload=ds.zero_config.offload_optimizer is not None)
    training = {"global_batch_size": ds.train_batch_size, "seq_len": args.seq_length,
                "precision": "bf16" if ds.bfloat16_config.enabled else "fp16" if ds.fp16_enabled else "fp32",
                "optimizer": "sgd" if args.optimizer == "sgd" else "adamw"}
    _assert_round_trip(plan, "deepspeed", layout, training)


TORCHTITAN_BUILDS = pytest.mark.xdist_group("test_framework_matrix-torchtitan")
"""The tests reading the module fixtures that build every torchtitan job in one process (under
``--dist loadgroup`` on one worker, so no job is built twice)."""


def _torchtitan_jobs(tmp: Path, jobs: list[str], *extra: str) -> dict[str, tuple[PlanFile, Path]]:
    """{job: (plan, job directory)} of ``jobs`` planned under torchtitan (with ``extra``) and written."""
    out = {}
    for job in jobs:
        (tmp / job).mkdir()
        result, path = _plan(tmp / job, job, "torchtitan", *extra)
        assert result.exit_code == 0, f"{job}: {result.output}"
        out[job] = (read_plan_file(path), tmp / job / "job")
        write_job(out[job][0], out[job][1])
    return out


@pytest.fixture(scope="module")
def torchtitan_030_built(tmp_path_factory) -> dict[str, tuple[PlanFile, Path, dict]]:
    """{job: (plan, job directory, what torchtitan v0.3.0 built)} of every job of the matrix torchtitan
    runs, built in one ``tests/torchtitan030_build.py`` process (``test_torchtitan_030``): starting
    one with torch and torchtitan costs about 5 s of CPU."""
    from test_torchtitan_030 import build_jobs

    jobs = [job for job in sorted(JOBS) if (job, "torchtitan") not in REFUSED]
    planned = _torchtitan_jobs(tmp_path_factory.mktemp("torchtitan030"), jobs)
    built = build_jobs([directory for _, directory in planned.values()])
    return {job: (plan, directory, b) for (job, (plan, directory)), b in zip(planned.items(), built, strict=True)}


def _check_torchtitan(plan: PlanFile, job: Path, built: dict) -> None:
    """torchtitan v0.3.0 (``test_torchtitan_030``)."""
    from test_torchtitan_030 import check_built

    check_built(plan, job, built)


TORCHTITAN_022_JOBS = ["llama3-8b", "llama3-70b", "llama3-405b"]


@pytest.fixture(scope="module")
def torchtitan_022_built(tmp_path_factory) -> dict[str, tuple[PlanFile, Path, dict]]:
    """{job: (plan, job directory, what torchtitan 0.2.2 built)} of ``TORCHTITAN_022_JOBS`` planned with
    ``--runtime-version v0.2.2``, built in one ``tests/torchtitan_build.py`` process."""
    if "torchtitan" not in sys.modules and importlib.util.find_spec("torchtitan") is None:
        pytest.skip("torchtitan is not installed (scripts/setup.sh)")  # (imported: maybe without its __init__)
    planned = _torchtitan_jobs(tmp_path_factory.mktemp("torchtitan022"), TORCHTITAN_022_JOBS,
                               "--runtime-version", "v0.2.2")
    args = [str(a) for _, directory in planned.values() for a in (directory, launch_world_size(directory))]
    run = subprocess.run([sys.executable, str(Path(__file__).parent / "torchtitan_build.py"), *args],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    built = json.loads(run.stdout)
    return {job: (plan, directory, b) for (job, (plan, directory)), b in zip(planned.items(), built, strict=True)}


def _check_torchtitan_022(plan: PlanFile, job: Path, built: dict) -> None:
    world = launch_world_size(job)
    assert built["mesh_size"] == world
    L, n = plan.best.layout, plan.inputs.model_spec.num_layers
    assert built["fsdp_enabled"] == (L.zero_stage > 0)
    if L.pp > 1:
        stages = built["stages"]
        assert len(stages) == L.pp * L.virtual_stages
        assert stages[0][0] == "tok_embeddings" and stages[-1][-2:] == ["norm", "output"]
        assert [sum(m.startswith("layers.") for m in s) for s in stages] == list(L.chunk_layers(n))
    layout, training = torchtitan_sections_layout(built["sections"], world, n)
    _assert_round_trip(plan, "torchtitan", layout, training)


CHECKS = {"megatron": _check_megatron, "megatron-bridge": _check_bridge, "deepspeed": _check_deepspeed}
"""The frameworks checked in the test's own process; torchtitan's jobs are built in one process for all
(``torchtitan_030_built``)."""


def _cells():
    for job in sorted(JOBS):
        for runtime in RUNTIMES:
            built = runtime == "torchtitan" and (job, runtime) not in REFUSED
            yield pytest.param(job, runtime, id=f"{job}-{runtime}", marks=[TORCHTITAN_BUILDS] if built else [])


@pytest.mark.parametrize("job, runtime", list(_cells()))
def test_each_job_is_refused_at_plan_time_or_runs_on_its_framework(request, tmp_path, job, runtime):
    if runtime == "torchtitan" and (job, runtime) not in REFUSED:
        plan, directory, built = request.getfixturevalue("torchtitan_030_built")[job]  # planned as below
        assert export_problems(runtime, plan.inputs.model_spec, plan.inputs.training, plan.best.layout,
                               plan.inputs.runtime_version) == []
        _check_torchtitan(plan, directory, built)
        return
    result, out = _plan(tmp_path, job, runtime)
    if (job, runtime) in REFUSED:
        assert result.exit_code == 2, result.output
        lines = result.output.strip().splitlines()
        assert len([ln for ln in lines if ln.startswith("error:")]) == 1 and "Traceback" not in result.output
        line = next(ln for ln in lines if ln.startswith("error:"))
        assert REFUSED[job, runtime] in line and f"--runtime {runtime} cannot run" in line
        assert "plan with --runtime megatron" in line  # a runtime that runs it
        return
    assert result.exit_code == 0, result.output
    plan = read_plan_file(out)
    # launch's refusals are a second line of defence that plan never reaches
    assert export_problems(runtime, plan.inputs.model_spec, plan.inputs.training, plan.best.layout,
                           plan.inputs.runtime_version) == []
    write_job(plan, tmp_path / "job")
    CHECKS[runtime](plan, tmp_path / "job")


def test_schemas_record_the_commits_the_capability_table_names():
    megatron = capabilities("megatron")
    for version in megatron.versions:
        assert load_schema(f"megatron-lm@{version}")["ref"] == version
    assert load_schema("megatron-lm@" + megatron.commit[:12])["commit"] == megatron.commit
    assert "4efb479d" in capabilities("deepspeed").degrees[0].source  # the Megatron-DeepSpeed commit it cites
    assert load_schema("megatron-deepspeed@4efb479d5317")["commit"].startswith("4efb479d")


@TORCHTITAN_BUILDS
@pytest.mark.parametrize("job", TORCHTITAN_022_JOBS)
def test_torchtitan_022_stays_selectable(torchtitan_022_built, job):
    """``--runtime-version v0.2.2`` plans the TOML job, which torchtitan 0.2.2 builds and which round-trips."""
    plan, directory, built = torchtitan_022_built[job]
    assert plan.inputs.runtime_version == "v0.2.2"
    assert export_problems("torchtitan", plan.inputs.model_spec, plan.inputs.training, plan.best.layout, "v0.2.2") == []
    assert (directory / "torchtitan.toml").is_file()
    _check_torchtitan_022(plan, directory, built)
