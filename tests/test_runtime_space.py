"""Each runtime's search space is its capability table (costmodels/capabilities.py), narrowed by the user."""

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

import planner
from planner.launch.export_problems import export_problems
from costmodels.capabilities import CAPABILITIES, Narrowing, capabilities, features_used
from costmodels.estimate import CostModel
from costmodels.job import Job
from costmodels.presets import load_model
from costmodels.training import TrainingSpec
from hardware_specs import load_node, make_cluster
from costmodels.runtimes import CONVENTIONS
from planner.search.brute_force import solve_brute_force
from planner.search.runtime_space import search_options
from planner.search.solve import solve
from planner.search.space import all_layouts

ROOT = Path(__file__).resolve().parents[1]
RUNTIMES = tuple(CAPABILITIES)


def outside_table(table, layout):
    """Why ``layout`` is outside ``table`` (None when inside)."""
    degrees = table.names("degrees")
    for name in ("tp", "pp", "cp", "ep"):
        if getattr(layout, name) > 1 and name not in degrees:
            return f"{name} {getattr(layout, name)}"
    if layout.zero_stage not in table.zero_stages:
        return f"zero {layout.zero_stage}"
    if layout.pp > 1 and layout.zero_stage not in table.pipelined_zero_stages:
        return f"zero {layout.zero_stage} with pp {layout.pp}"
    if layout.pp > 1 and layout.schedule not in table.names("schedules"):
        return f"schedule {layout.schedule}"
    if layout.recompute not in table.names("recompute"):
        return f"recompute {layout.recompute}"
    if layout.tp_comm_overlap and not table.has("tp_comm_overlap"):
        return "tp overlap"
    if layout.optimizer_offload and not table.has("optimizer_offload"):
        return "offload"
    if layout.hsdp_shard_degree and not table.hsdp:
        return "hsdp"
    return None


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_every_layout_of_a_runtime_space_is_in_its_table(runtime):
    table = capabilities(runtime)
    model = load_model("tiny-mixtral")
    training = TrainingSpec(global_batch_size=8, seq_len=256, runtime=runtime)
    options = search_options(table, Narrowing(), "cuda")
    seen = set()
    for layout in all_layouts(model, training, 8, 8, options):
        assert outside_table(table, layout) is None, layout
        seen.add((layout.zero_stage, layout.schedule if layout.pp > 1 else "-", layout.recompute))
    # and the space is not trivially small: every stage and recompute mode of the table appears
    assert {z for z, _, _ in seen} == set(table.zero_stages)
    assert {r for _, _, r in seen} == set(table.names("recompute"))


def test_megatron_offers_zero_2_and_3_only_with_megatron_fsdp_and_never_zero_bubble():
    assert capabilities("megatron", "core_v0.13.0").zero_stages == (0, 1)  # before --use-megatron-fsdp
    latest = capabilities("megatron")
    assert latest.pipelined_zero_stages == (0, 1)  # the distributed optimizer is ZeRO-1
    assert not set(latest.names("schedules")) & {"zb-h1", "interleaved-zb", "zb-v", "dualpipe-v", "gpipe"}
    assert "--use-megatron-fsdp" in next(s.option for s in latest.sharding if s.zero_stage == 3)
    report = planner.plan(model="llama3-8b", hardware="h100-sxm-80gb", gpus=8, global_batch=64, seq_len=8192,
                          runtime="megatron", runtime_version="core_v0.13.0", top_k=8)
    for entry in (report.best, *report.candidates):
        assert entry.layout.zero_stage <= 1 and entry.layout.schedule in ("1f1b", "interleaved")
    assert report.inputs.runtime_version == "core_v0.13.0"


def test_unknown_runtime_version_is_one_line_naming_the_known_ones():
    with pytest.raises(planner.SpecError, match=r"runtime_version='v9': torchtitan knows v0.2.0, v0.2.1, v0.2.2, v0.3.0"):
        planner.plan(model="tiny-llama", hardware="cpu", gpus=2, global_batch=4, seq_len=64, precision="fp32",
                     runtime="torchtitan", runtime_version="v9")


def _small_case(seed):
    rng = random.Random(seed)
    model = load_model(rng.choice(["tiny-llama", "tiny-gpt", "tiny-mixtral", "gpt3-1.3b"]))
    gpus = rng.choice([2, 4, 8])
    runtime = RUNTIMES[seed % len(RUNTIMES)]
    training = TrainingSpec(global_batch_size=rng.choice([4, 8, 16]), seq_len=rng.choice([256, 512]),
                            precision="bf16", runtime=runtime)
    cluster = make_cluster(load_node(rng.choice(["a100-sxm-40gb", "h100-sxm-80gb"])), gpus)
    return model, training, cluster, rng.choice([0.02, 0.1, 0.5, 0.95])


@pytest.mark.parametrize("seed", range(15))
def test_search_equals_brute_force_on_each_runtime_space(seed):
    model, training, cluster, fraction = _small_case(seed)
    table = capabilities(training.runtime)
    options = search_options(table, Narrowing(), cluster.hardware.device_type)

    def cm():
        return CostModel(Job(model=model, training=training, cluster=cluster, memory_fraction=fraction,
                             convention=CONVENTIONS[training.runtime]))

    fast = solve(cm(), cluster.num_gpus, cluster.gpus_per_node, options, top_k=4)
    slow = solve_brute_force(cm(), cluster.num_gpus, cluster.gpus_per_node, options, top_k=4)
    assert [b.layout for b in fast.ranked] == [b.layout for b in slow.ranked]
    assert fast.num_candidates == slow.num_candidates
    assert all(outside_table(table, b.layout) is None for b in fast.ranked)


NARROW = dict(tp=[1, 2], pp=[1, 2], schedules=["1f1b"], zero_stages=[1], recompute_modes=["full"],
              micro_batch_sizes=[1], allow_offload=False)


def test_api_narrowing_restricts_the_search_and_is_recorded():
    job = dict(model="llama3-8b", hardware="h100-sxm-80gb", gpus=8, global_batch=64, seq_len=8192, top_k=10)
    wide = planner.plan(**job)
    narrow = planner.plan(**job, **NARROW)
    assert narrow.search["space_size"] < wide.search["space_size"]
    for entry in (narrow.best, *narrow.candidates):
        L = entry.layout
        assert L.tp in (1, 2) and L.pp in (1, 2) and L.zero_stage == 1 and L.recompute == "full"
        assert L.micro_batch_size == 1 and not L.optimizer_offload and L.schedule == "1f1b"
    recorded = narrow.to_plan_file().inputs.narrowing
    assert recorded == {k: v for k, v in NARROW.items()}
    from planner.plan.plan_file import PlanFile
    again = PlanFile.from_json(narrow.to_plan_file().to_json())
    assert again.inputs.narrowing == recorded and again.inputs.runtime_version == "core_v0.19.0"


@pytest.mark.parametrize("kwargs, message", [
    (dict(zero_stages=[2], runtime="torchtitan", schedules=["zb-h1"]), r"schedules= zb-h1: torchtitan v0.3.0 runs"),
    (dict(cp=[2], runtime="deepspeed"), r"cp= 2: deepspeed v0.19.5 does not run cp > 1"),
    (dict(zero_stages=[1], runtime="torchtitan"), r"zero_stages= 1: torchtitan v0.3.0 runs 0,2,3"),
    (dict(tp=4), r"tp= expected a list of integers"),
    (dict(recompute_modes=["op-sac"]), r"recompute_modes= op-sac: megatron core_v0.19.0 runs none,selective,full"),
])
def test_api_refuses_what_the_runtime_cannot_run_naming_the_parameter(kwargs, message):
    with pytest.raises(ValueError, match=message):
        planner.plan(model="tiny-llama", hardware="h100-sxm-80gb", gpus=2, global_batch=4, seq_len=64, **kwargs)


@pytest.mark.parametrize("kwargs, message", [
    (dict(tp=[16]), r"tp= 16: no value divides the 8 GPUs; use one of 1,2,4,8"),
    (dict(tp=[3, 5]), r"tp= 3,5: no value divides the 8 GPUs"),
    (dict(tp=[8], pp=[2]), r"tp= 8 with pp= 2: no combination multiplies to a divisor of the 8 GPUs \(products 16\)"),
    (dict(tp=[4], pp=[2], cp=[2]), r"tp= 4 with pp= 2 with cp= 2: no combination .* \(products 16\)"),
    (dict(ep=[16]), r"ep= 16: no value divides the 8 GPUs"),
])
def test_a_narrowing_no_layout_on_the_gpus_can_take_is_bad_input(kwargs, message):
    """Degrees that cannot divide the GPU count are refused as bad input naming the option (not
    searched and answered "nothing fits")."""
    from planner.search.runtime_space import NarrowingError
    with pytest.raises(NarrowingError, match=message):
        planner.plan(model="llama3-8b", hardware="h100-sxm-80gb", gpus=8, global_batch=64, seq_len=4096, **kwargs)
    # a narrowing with one value that divides is searched
    report = planner.plan(model="llama3-8b", hardware="h100-sxm-80gb", gpus=8, global_batch=64, seq_len=4096,
                          tp=(3, 4))
    assert report.best.layout.tp == 4


def test_degrees_whose_product_cannot_divide_the_gpus_are_bad_input():
    """tp 4 and pp 6 each divide 36 GPUs, but 24 does not: no layout exists, so it is bad input."""
    from planner.search.runtime_space import NarrowingError
    with pytest.raises(NarrowingError, match=r"tp= 4 with pp= 6: no combination .* of the 36 GPUs \(products 24\)"):
        planner.plan(model="llama3-8b", hardware="h100-sxm-80gb", gpus=36, gpus_per_node=12, global_batch=72,
                     seq_len=4096, tp=(4,), pp=(6,))


def test_cli_refuses_a_tp_that_cannot_divide_the_gpus_with_exit_2():
    run = _cli("plan", "--model", "llama3-8b", "--hardware", "h100-sxm-80gb", "--gpus", "8", "--global-batch", "64",
               "--seq-len", "4096", "--tp", "16")
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.strip().splitlines() == ["error: --tp 16: no value divides the 8 GPUs; use one of 1,2,4,8"]


def _cli(*args):
    return subprocess.run([sys.executable, "-c", "from planner.cli import main; main()", *args], cwd=ROOT,
                          capture_output=True, text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_cli_narrowing_as_a_real_subprocess_in_json():
    run = _cli("plan", "--model", "tiny-llama", "--hardware", "h100-sxm-80gb", "--gpus", "4", "--global-batch", "8",
               "--seq-len", "256", "--tp", "1,2", "--zero-stages", "0,1", "--no-offload", "--format", "json")
    assert run.returncode == 0, run.stderr
    plan = json.loads(run.stdout)
    assert plan["inputs"]["narrowing"] == {"tp": [1, 2], "zero_stages": [0, 1], "allow_offload": False}
    assert plan["inputs"]["runtime_version"] == "core_v0.19.0"
    for entry in (plan["best"], *plan["candidates"]):
        assert entry["layout"]["tp"] in (1, 2) and entry["layout"]["zero_stage"] in (0, 1)


def test_cli_refusal_names_the_flag_and_launchable_warns_on_stderr_only():
    run = _cli("plan", "--model", "tiny-llama", "--hardware", "h100-sxm-80gb", "--gpus", "4", "--global-batch", "8",
               "--seq-len", "256", "--schedules", "zb-v")
    assert run.returncode == 2 and run.stderr.strip().splitlines() == [
        "error: --schedules zb-v: megatron core_v0.19.0 runs 1f1b,interleaved"]
    run = _cli("plan", "--model", "tiny-llama", "--hardware", "cpu", "--gpus", "2", "--global-batch", "4",
               "--seq-len", "64", "--precision", "fp32", "--launchable", "--format", "json")
    assert run.returncode == 0, run.stderr
    assert "deprecated" in run.stderr and json.loads(run.stdout)["inputs"]["training"]["runtime"] == "torch"


@pytest.mark.parametrize("layout", [
    dict(dp=8, zero_stage=0), dict(dp=8, zero_stage=1), dict(dp=2, tp=2, pp=2, zero_stage=1, sequence_parallel=True),
    dict(dp=2, tp=4, zero_stage=0, sequence_parallel=True, tp_comm_overlap=True, recompute="full"),
    dict(dp=8, zero_stage=3)])
def test_the_megatron_options_a_plan_names_are_the_ones_its_job_sets(layout):
    """The plan header's "sets ..." (``features_used``) names only flags that ``megatron_args.sh``
    writes, among them the costed DP overlap (``--overlap-param-gather`` only with the distributed
    optimizer, as Megatron requires)."""
    from planner.launch.megatron_export import megatron_args

    kwargs = dict(model="llama3-8b", hardware="h100-sxm-80gb", gpus=8, global_batch=64, seq_len=4096)
    L = planner.Layout(num_microbatches=64 // layout["dp"], **layout)
    breakdown = planner.evaluate(layout=L, **kwargs)
    job = planner.resolve_job(**kwargs)
    args, _ = megatron_args(job.model, job.training, breakdown.layout, 4096)
    named = {t for f in features_used(capabilities("megatron"), L) for t in f.option.split() if t.startswith("--")}
    assert "--overlap-grad-reduce" in named
    assert ("--overlap-param-gather" in named) == (L.zero_stage > 0)
    assert named <= set(args)


@pytest.mark.parametrize("layout", [
    dict(dp=8, zero_stage=0), dict(dp=8, zero_stage=1), dict(dp=2, tp=2, pp=2, zero_stage=1, sequence_parallel=True),
    dict(dp=2, tp=4, zero_stage=0, sequence_parallel=True, tp_comm_overlap=True, recompute="full"),
    dict(dp=2, pp=4, zero_stage=1, schedule="interleaved", virtual_stages=2)])
def test_the_bridge_fields_a_plan_names_are_the_ones_its_overrides_set(layout):
    """The Megatron-Bridge plan header's "sets ..." names fields the job's bridge_overrides.txt writes,
    with the same values; and every layout field is written, so a recipe's own defaults (the
    distributed optimizer, virtual stages) cannot run instead of the plan's."""
    from planner.launch.megatron_export import megatron_args
    from planner.launch.megatron_fields import BRIDGE_LAYOUT_DEFAULTS, bridge_override_lines

    kwargs = dict(model="llama3-8b", hardware="h100-sxm-80gb", gpus=8, global_batch=64, seq_len=4096,
                  runtime="megatron-bridge")
    L = planner.Layout(num_microbatches=64 // layout["dp"], **layout)
    breakdown = planner.evaluate(layout=L, **kwargs)
    job = planner.resolve_job(**kwargs)
    args, _ = megatron_args(job.model, job.training, breakdown.layout, 4096)
    written = dict(line.split("=", 1) for line in bridge_override_lines(args))
    assert set(BRIDGE_LAYOUT_DEFAULTS) <= set(written)
    for feature in features_used(capabilities("megatron-bridge"), L):
        for token in feature.option.split():
            key, _, value = token.partition("=")
            assert key in written, (feature.name, key)
            if value not in ("P", "V"):
                assert written[key] == json.dumps(_number_or_bool(value)), (key, written[key], value)
    assert written["ddp.use_distributed_optimizer"] == json.dumps(L.zero_stage > 0)
    assert written["ddp.overlap_param_gather"] == json.dumps(L.zero_stage > 0)
    assert written["model.virtual_pipeline_model_parallel_size"] == ("2" if L.virtual_stages == 2 else "null")


def _number_or_bool(text: str):
    if text in ("True", "False"):
        return text == "True"
    return int(text) if text.isdigit() else text


def _dp_comm_s(runtime: str, pp: int, overlap_fraction: float) -> float:
    """Llama 3 70B on 64 H100, dp · tp 4 · pp, ZeRO-1: the step's data-parallel term."""
    from dataclasses import replace

    from costmodels.assumptions import DEFAULT_ASSUMPTIONS
    from costmodels.layout import Layout

    dp = 64 // (4 * pp)
    training = TrainingSpec(global_batch_size=512, seq_len=4096, runtime=runtime)
    job = Job(model=load_model("llama3-70b"), training=training, cluster=make_cluster(load_node("h100-sxm-80gb"), 64),
              assumptions=replace(DEFAULT_ASSUMPTIONS, overlap_fraction=overlap_fraction),
              convention=CONVENTIONS[runtime])
    layout = Layout(dp=dp, tp=4, pp=pp, zero_stage=1, sequence_parallel=True, num_microbatches=512 // dp)
    return CostModel(job).estimate(layout).dp_comm_s


def test_deepspeed_pipeline_exposes_data_parallel_sync_that_megatron_overlaps():
    """DeepSpeed's pipeline engine reduces gradients after the last micro-batch (TrainSchedule appends
    ReduceTiedGrads, ReduceGrads, OptimizerStep at the last step: ``capabilities.DEEPSPEED`` dp_overlap is
    not ``pipelined``), so at pp 2 its DP term is what it is with no overlap at all (overlap_fraction 0);
    Megatron's --overlap-grad-reduce --overlap-param-gather hide part of the same traffic. Without a
    pipeline DeepSpeed's overlap_comm hides it too."""
    for runtime in RUNTIMES:  # the costing (convention) and the table say the same
        assert CONVENTIONS[runtime].pipeline_overlaps_dp_sync == capabilities(runtime).feature("dp_overlap").pipelined
    assert not capabilities("deepspeed").feature("dp_overlap").pipelined
    assert _dp_comm_s("deepspeed", 2, 1.0) == _dp_comm_s("deepspeed", 2, 0.0) > 0
    assert _dp_comm_s("megatron", 2, 1.0) < _dp_comm_s("megatron", 2, 0.0)
    assert _dp_comm_s("deepspeed", 2, 0.0) == _dp_comm_s("megatron", 2, 0.0)  # the same traffic
    assert _dp_comm_s("deepspeed", 1, 1.0) < _dp_comm_s("deepspeed", 1, 0.0)


DONE_CRITERION_JOBS = [("llama3-8b", "h100-sxm-80gb", 8, 64, 4096), ("llama3-70b", "h100-sxm-80gb", 64, 512, 8192),
                       ("gpt3-175b", "a100-sxm-80gb", 1024, 1536, 2048),
                       ("mixtral-8x7b", "h100-sxm-80gb", 64, 512, 4096),
                       ("llama3-405b", "h100-sxm-80gb", 16384, 2048, 8192)]


@pytest.mark.parametrize("job", DONE_CRITERION_JOBS, ids=lambda j: j[0])
def test_torch_runtime_keeps_the_optimizer_on_the_gpu_where_the_job_fits_without_offload(job):
    model, hardware, gpus, batch, seq = job
    report = planner.plan(model=model, hardware=hardware, gpus=gpus, global_batch=batch, seq_len=seq,
                          runtime="torch", top_k=3)
    assert report.best is not None
    assert not any(b.layout.optimizer_offload for b in (report.best, *report.candidates))


def test_offload_is_picked_when_nothing_fits_without_it():
    # Llama 3 8B on one 80 GB H100: 16 bytes of model state per parameter (128 GB) cannot stay on the GPU
    args = dict(model="llama3-8b", hardware="h100-sxm-80gb", gpus=1, global_batch=8, seq_len=4096, runtime="torch")
    assert planner.plan(**args).best.layout.optimizer_offload
    assert planner.plan(**args, allow_offload=False).best is None


def test_megatron_offloads_without_data_parallelism_under_its_distributed_optimizer():
    """Megatron runs --optimizer-cpu-offload only with the distributed optimizer (ZeRO-1), which it
    also runs at dp 1: Llama 3.1 405B on 64 H100 at batch 64 fits only as dp 1 · tp 8 · pp 8 with
    the optimizer offloaded, so that is what plan finds (it reported nothing fits while the space
    held ZeRO-0 alone at dp 1)."""
    report = planner.plan(model="llama3-405b", hardware="h100-sxm-80gb", gpus=64, global_batch=64, seq_len=8192)
    best = report.best.layout
    assert (best.dp, best.cp, best.zero_stage, best.optimizer_offload) == (1, 1, 1, True)
    job = planner.resolve_job(model="llama3-405b", hardware="h100-sxm-80gb", gpus=64, global_batch=64, seq_len=8192)
    assert export_problems("megatron", job.model, job.training, best) == []  # the exported job runs it
