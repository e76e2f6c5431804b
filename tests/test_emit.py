"""Generated job files: they compile, parse, name only real framework options, quote user values,
and the launcher refuses plans it cannot apply with one line naming the field."""

from __future__ import annotations

import json
import py_compile
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from costmodels.model_spec import model_to_dict
from costmodels.presets import load_model
from planner.cli import main
from planner.launch import frameworks
from planner.launch.job import write_job
from planner.plan.plan_file import PlanFile

NASTY = "my \"model\" $(touch PWNED) `id`; rm -rf / 'x'\nnewline"


HAND_PREDICTED = {"step_time_s": 1.0, "tokens_per_s": 1.0, "tokens_per_s_per_gpu": 1.0, "mfu": 0.5, "hfu": 0.5,
                  "peak_memory_gib": 1.0, "memory_capacity_gib": 2.0, "memory_usable_gib": 2.0,
                  "bubble_fraction": 0.0, "memory_gib": {}, "time_s": {}, "comm_gib_per_gpu": {}}
"""A hand-made plan's prediction: well-formed (the plan file checks it), read by nothing the launch writes
but the checkpoint interval, which it leaves at the job's default (no ``goodput``)."""


def make_plan(model: str = "tiny-llama", name: str | None = None, gpus: int = 4, runtime: str = "torch",
              runtime_version: str | None = None, **layout) -> dict:
    """A plan dict in the shape of the lead's plan file, built by hand, for ``runtime``'s job (of release
    ``runtime_version``, None: its latest)."""
    base = {"dp": gpus, "zero_stage": 3, "num_microbatches": 2, "micro_batch_size": 1}
    base.update(layout)
    world = base.get("dp", 1) * base.get("tp", 1) * base.get("pp", 1) * base.get("cp", 1)
    batch = base["dp"] * base["num_microbatches"] * base["micro_batch_size"]
    spec = {**model_to_dict(load_model(model)), **({"name": name} if name else {})}  # the job is named by it
    return {"schema_version": 2, "inputs_digest": "0" * 16,
            "inputs": {"model": name or model, "model_spec": spec, "hardware": "cpu",
                       "gpus": world, "gpus_per_node": 2,
                       "training": {"global_batch_size": batch, "seq_len": 32, "precision": "bf16",
                                    "optimizer": "adamw", "lora_rank": 0, "lora_targets": ["q", "k", "v", "o"],
                                    "attention": "fused", "runtime": runtime},
                       **({"runtime_version": runtime_version} if runtime_version else {})},
            "best": {"layout": base, "predicted": HAND_PREDICTED}, "candidates": [],
            "search": {"solver": "evaluate", "space_size": 1, "evaluated": 1, "rejected": {}}}


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("job dir with space")
    plan = make_plan(name=NASTY, gpus=8, dp=2, tp=2, pp=2, sequence_parallel=True, schedule="interleaved",
                     virtual_stages=2, num_microbatches=4, recompute="full", hsdp_shard_degree=0)
    write_job(PlanFile.from_dict(plan), out, python=str(out / "py $(touch PWNED2)"))
    return out


FRAMEWORK_LAYOUTS = {
    # the torch job's layout, as far as each framework runs it: Megatron's ZeRO-1 is the distributed
    # optimizer (Megatron-FSDP is not pipelined); DeepSpeed's pipeline engine runs 1F1B under ZeRO < 2
    "megatron": dict(zero_stage=1, schedule="interleaved", virtual_stages=2),
    "torchtitan": dict(zero_stage=3, schedule="interleaved", virtual_stages=2, hsdp_shard_degree=0),
    "deepspeed": dict(zero_stage=1, schedule="1f1b"),
}


@pytest.fixture(scope="module")
def framework_jobs(tmp_path_factory) -> dict[str, Path]:
    """{runtime: job directory} of the same nasty-named model under each framework runtime."""
    jobs = {}
    for runtime, layout in FRAMEWORK_LAYOUTS.items():
        out = tmp_path_factory.mktemp(f"{runtime} job dir with space")
        plan = make_plan(name=NASTY, gpus=8, runtime=runtime, dp=2, tp=2, pp=2, sequence_parallel=True,
                         num_microbatches=4, recompute="full",  # torchtitan: the TOML's release
                         runtime_version="v0.2.2" if runtime == "torchtitan" else None, **layout)
        write_job(PlanFile.from_dict(plan), out)
        jobs[runtime] = out
    return jobs


def test_python_files_compile(job):
    for path in [job / "train.py", *(job / "runtime").rglob("*.py")]:
        py_compile.compile(str(path), doraise=True)


def test_shell_files_parse(job, framework_jobs):
    paths = [job / "launch.sh", job / "slurm.sbatch", framework_jobs["megatron"] / "megatron_args.sh",
             framework_jobs["deepspeed"] / "megatron_deepspeed_args.sh"]
    paths += [d / name for d in framework_jobs.values() for name in ("launch.sh", "slurm.sbatch")]
    for path in paths:
        proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert proc.returncode == 0, (path, proc.stderr)


def test_user_values_cannot_inject(job, framework_jobs, tmp_path):
    """The python path lands in shell code quoted: running launch.sh tries that literal path."""
    proc = subprocess.run(["bash", str(job / "launch.sh"), "--steps", "1"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode != 0
    assert "py $(touch PWNED2)" in proc.stderr
    assert not list(tmp_path.glob("PWNED*")) and not list(job.glob("PWNED*"))
    texts = [(job / name).read_text() for name in ("launch.sh", "slurm.sbatch")]
    texts += [(framework_jobs["torchtitan"] / "torchtitan.toml").read_text(),
              (framework_jobs["megatron"] / "megatron_args.sh").read_text()]
    texts += [(d / name).read_text() for d in framework_jobs.values() for name in ("launch.sh", "slurm.sbatch")]
    for text in texts:
        assert "\nnewline" not in text  # the model name's newline stays escaped inside one line
    for d in (job, *framework_jobs.values()):
        assert "#SBATCH --job-name=my__model____touch_PWNED___id___rm_-rf____x__newline\n" in \
            (d / "slurm.sbatch").read_text()


def test_job_is_self_contained(job):
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import planner.launch.torchjob.main, costmodels.layout; "
            "print(costmodels.layout.__file__); print(planner.__file__); print('planner.api' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(job / "runtime")], capture_output=True, text=True,
                         check=True).stdout.split("\n")
    assert out[0].startswith(str(job / "runtime"))
    assert out[1].startswith(str(job / "runtime"))  # the bundle's stub package, not an installed autoplan
    assert out[2] == "False"


def test_bundle_is_derived_from_the_runtime_imports(job):
    """The copied runtime is what ``main`` imports (lazy imports too), and every copied module
    imports with only the bundle on the path."""
    from planner.launch.job import bundle_modules

    bundle = bundle_modules()
    job_modules = bundle["planner.launch.torchjob"]
    assert {"main", "pipelining", "tp_styles", "user_model"} <= set(job_modules)
    assert bundle["planner.plan"] == ("plan_file", "predicted_check")  # the plan file checks its predictions
    assert "harness" not in " ".join(job_modules)  # test-only module, not imported by the job
    # capabilities: plan_file reads the plan's narrowing of its runtime's space (capabilities.Narrowing)
    # runtimes: the runtime registry (CONVENTIONS) the convention module reads
    assert bundle["costmodels"] == ("capabilities", "convention", "layout", "model_spec", "moe_costs", "precision",
                                    "runtimes", "stage_split", "training")
    copied = sorted(p.stem for p in (job / "runtime" / "planner" / "launch" / "torchjob").glob("*.py"))
    assert copied == sorted(job_modules)
    names = ", ".join(f"planner.launch.torchjob.{m}" for m in job_modules if m != "__init__")
    code = (f"import sys; sys.path.insert(0, sys.argv[1]); import {names}; "
            "print(all(m.__file__.startswith(sys.argv[1]) for n, m in sys.modules.items() if n.startswith('planner')))")
    out = subprocess.run([sys.executable, "-c", code, str(job / "runtime")], capture_output=True, text=True,
                         check=True, cwd=job).stdout.strip()
    assert out == "True"


def test_emit_does_not_import_the_cli():
    code = "import sys, planner.launch.job; print(any(m.startswith('planner.cli') for m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


def test_plan_copy_is_exact(job):
    assert json.loads((job / "plan.json").read_text())["inputs"]["model"] == NASTY


def test_deepspeed_json_uses_known_keys(framework_jobs):
    config = json.loads((framework_jobs["deepspeed"] / "deepspeed.json").read_text())

    def keys(d, prefix=""):
        for k, v in d.items():
            yield prefix + k
            if isinstance(v, dict) and k != "params" or k == "params":
                yield from keys(v, prefix + k + ".") if isinstance(v, dict) else ()

    assert set(keys(config)) <= frameworks.DEEPSPEED_KEYS
    assert config["train_batch_size"] == config["train_micro_batch_size_per_gpu"] * \
        config["gradient_accumulation_steps"] * 2  # dp = 2


def test_torchtitan_toml_parses_with_known_fields(framework_jobs):
    config = tomllib.loads((framework_jobs["torchtitan"] / "torchtitan.toml").read_text())
    fields = {f"{section}.{key}" for section, values in config.items() for key in values}
    assert fields <= frameworks.TORCHTITAN_KEYS
    assert config["model"]["flavor"] == NASTY
    p = config["parallelism"]
    assert (p["tensor_parallel_degree"], p["pipeline_parallel_degree"], p["pipeline_parallel_schedule"]) == \
        (2, 2, "Interleaved1F1B")
    assert p["data_parallel_replicate_degree"] * p["data_parallel_shard_degree"] == 2


def test_megatron_args_use_known_options(framework_jobs):
    proc = subprocess.run(["bash", "-c", 'source "$1"; printf "%s\\n" "${MEGATRON_ARGS[@]}"', "_",
                           str(framework_jobs["megatron"] / "megatron_args.sh")], capture_output=True, text=True,
                          check=True)
    tokens = proc.stdout.splitlines()
    options = {t for t in tokens if t.startswith("--")}
    assert options <= frameworks.MEGATRON_OPTIONS
    value = dict(zip(tokens, tokens[1:]))
    assert value["--tensor-model-parallel-size"] == "2" and value["--pipeline-model-parallel-size"] == "2"
    # 4 layers / (pp 2 x v 2): always stated as virtual stages per rank (one form for even and uneven splits)
    assert value["--num-virtual-stages-per-pipeline-rank"] == "2"
    assert "--num-layers-per-virtual-pipeline-stage" not in options
    assert "--sequence-parallel" in options and value["--recompute-granularity"] == "full"


@pytest.mark.parametrize("plan, field", [
    (make_plan(model="tiny-mixtral", dp=4, ep=2, hsdp_shard_degree=2), "layout.hsdp_shard_degree"),
    (make_plan(dp=1, pp=4, num_microbatches=2), "layout.num_microbatches"),
])
def test_cli_refuses_what_it_cannot_apply(tmp_path, plan, field):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    result = CliRunner().invoke(main, ["launch", str(path), "--out", str(tmp_path / "job")])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}")
    assert not (tmp_path / "job").exists()


@pytest.mark.parametrize("plan", [make_plan(model="tiny-gpt", dp=2, pp=2, num_microbatches=2),
                                  make_plan(model="tiny-gpt", dp=2, tp=2), make_plan(dp=4, optimizer_offload=True)],
                         ids=["tied-pp2", "tied-tp2", "offload"])
def test_cli_launches_what_issue_13_lifted(tmp_path, plan):
    """Tied embeddings under pp and tp and optimizer offload are applied now (test_launch_features)."""
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    result = CliRunner().invoke(main, ["launch", str(path), "--out", str(tmp_path / "job")])
    assert result.exit_code == 0, result.output
    assert '--checkpoint-every 10 "$@"' in (tmp_path / "job" / "launch.sh").read_text()  # no goodput: default


def test_cli_rejects_unreadable_plan(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text("{not json")
    result = CliRunner().invoke(main, ["launch", str(path), "--out", str(tmp_path / "job")])
    assert result.exit_code == 2 and "not valid JSON" in result.output


def test_cli_writes_job(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(make_plan(dp=2, tp=2, sequence_parallel=True)))
    result = CliRunner().invoke(main, ["launch", str(path), "--out", str(tmp_path / "job")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "job" / "launch.sh").stat().st_mode & 0o111
    assert "WORLD_SIZE=4" in (tmp_path / "job" / "launch.sh").read_text()


def test_exports_say_what_does_not_map_with_the_frameworks_own_names():
    # Megatron-FSDP is not offered with pipelining (capabilities.MEGATRON); DeepSpeed's PipelineEngine
    # asserts zero_optimization_stage() < 2; Llama 3 has RoPE base 500000.
    from costmodels.layout import Layout
    from costmodels.presets import load_model
    from costmodels.training import TrainingSpec
    from planner.launch import frameworks

    from planner.plan.plan_file import PlanFileError

    model, training = load_model("llama3-8b"), TrainingSpec(global_batch_size=32, seq_len=4096)
    layout = Layout(dp=2, pp=2, zero_stage=3, num_microbatches=16)
    # what used to be exported otherwise (with a note) is refused in one line naming the field and the option
    with pytest.raises(PlanFileError, match=r"^layout\.zero_stage = 3 with pp 2: megatron runs it only without "
                                            r"pipelining \(--use-distributed-optimizer --overlap-param-gather "
                                            r"--use-megatron-fsdp") as refused:
        frameworks.megatron_args(model, training, layout, 4096)
    assert "\n" not in str(refused.value)
    with pytest.raises(PlanFileError, match=r"^layout\.zero_stage = 3 with pp 2: deepspeed runs it only without "
                                            r"pipelining \(zero_optimization\.stage=3 --no-pipeline-parallel\)"):
        frameworks.deepspeed_config(model, training, layout)
    args, _ = frameworks.megatron_args(model, training, Layout(dp=2, pp=2, zero_stage=1, num_microbatches=16), 4096)
    assert args[args.index("--rotary-base") + 1] == "500000"
    assert set(a for a in args if a.startswith("--")) <= frameworks.MEGATRON_OPTIONS
    flat = Layout(dp=4, zero_stage=3, num_microbatches=8)
    flat_args, _ = frameworks.megatron_args(model, training, flat, 4096)
    assert flat_args[flat_args.index("--data-parallel-sharding-strategy") + 1] == "optim_grads_params"
    assert "--use-megatron-fsdp" in flat_args and "--use-torch-fsdp2" not in flat_args
    assert set(a for a in flat_args if a.startswith("--")) <= frameworks.MEGATRON_OPTIONS
    assert frameworks.deepspeed_config(model, training, flat)["zero_optimization"]["stage"] == 3
    assert "--no-pipeline-parallel" in frameworks.megatron_deepspeed_args(model, training, flat)
