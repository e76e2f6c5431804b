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


def make_plan(model: str = "tiny-llama", name: str | None = None, gpus: int = 4, **layout) -> dict:
    """A plan dict in the shape of the lead's plan file, built by hand."""
    base = {"dp": gpus, "zero_stage": 3, "num_microbatches": 2, "micro_batch_size": 1}
    base.update(layout)
    world = base.get("dp", 1) * base.get("tp", 1) * base.get("pp", 1) * base.get("cp", 1)
    batch = base["dp"] * base["num_microbatches"] * base["micro_batch_size"]
    return {"schema_version": 2, "inputs_digest": "0" * 16,
            "inputs": {"model": name or model, "model_spec": model_to_dict(load_model(model)), "hardware": "cpu",
                       "gpus": world, "gpus_per_node": 2,
                       "training": {"global_batch_size": batch, "seq_len": 32, "precision": "bf16",
                                    "optimizer": "adamw", "lora_rank": 0, "lora_targets": ["q", "k", "v", "o"],
                                    "attention": "fused", "runtime": "torch"}},
            "best": {"layout": base, "predicted": {}}, "candidates": [],
            "search": {"solver": "evaluate", "space_size": 1, "evaluated": 1, "rejected": {}}}


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("job dir with space")
    plan = make_plan(name=NASTY, gpus=8, dp=2, tp=2, pp=2, sequence_parallel=True, schedule="interleaved",
                     virtual_stages=2, num_microbatches=4, recompute="full", hsdp_shard_degree=0)
    write_job(PlanFile.from_dict(plan), out, python=str(out / "py $(touch PWNED2)"))
    return out


def test_python_files_compile(job):
    for path in [job / "train.py", *(job / "runtime").rglob("*.py")]:
        py_compile.compile(str(path), doraise=True)


def test_shell_files_parse(job):
    for name in ("launch.sh", "slurm.sbatch", "exports/megatron_args.sh"):
        proc = subprocess.run(["bash", "-n", str(job / name)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr


def test_user_values_cannot_inject(job, tmp_path):
    """The python path lands in shell code quoted: running launch.sh tries that literal path."""
    proc = subprocess.run(["bash", str(job / "launch.sh"), "--steps", "1"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode != 0
    assert "py $(touch PWNED2)" in proc.stderr
    assert not list(tmp_path.glob("PWNED*")) and not list(job.glob("PWNED*"))
    for name in ("launch.sh", "slurm.sbatch", "exports/torchtitan.toml"):
        text = (job / name).read_text()
        assert "\nnewline" not in text  # the model name's newline stays escaped inside one line
    assert "#SBATCH --job-name=my__model____touch_PWNED___id___rm_-rf____x__newline\n" in (job / "slurm.sbatch").read_text()


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
    assert bundle["planner.plan"] == ("plan_file",)
    assert "harness" not in " ".join(job_modules)  # test-only module, not imported by the job
    assert bundle["costmodels"] == ("convention", "layout", "model_spec", "moe_costs", "precision", "stage_split", "training")
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


def test_deepspeed_json_uses_known_keys(job):
    config = json.loads((job / "exports" / "deepspeed.json").read_text())

    def keys(d, prefix=""):
        for k, v in d.items():
            yield prefix + k
            if isinstance(v, dict) and k != "params" or k == "params":
                yield from keys(v, prefix + k + ".") if isinstance(v, dict) else ()

    assert set(keys(config)) <= frameworks.DEEPSPEED_KEYS
    assert config["train_batch_size"] == config["train_micro_batch_size_per_gpu"] * \
        config["gradient_accumulation_steps"] * 2  # dp = 2


def test_torchtitan_toml_parses_with_known_fields(job):
    config = tomllib.loads((job / "exports" / "torchtitan.toml").read_text())
    fields = {f"{section}.{key}" for section, values in config.items() for key in values}
    assert fields <= frameworks.TORCHTITAN_KEYS
    assert config["model"]["flavor"] == NASTY
    p = config["parallelism"]
    assert (p["tensor_parallel_degree"], p["pipeline_parallel_degree"], p["pipeline_parallel_schedule"]) == \
        (2, 2, "Interleaved1F1B")
    assert p["data_parallel_replicate_degree"] * p["data_parallel_shard_degree"] == 2


def test_megatron_args_use_known_options(job):
    proc = subprocess.run(["bash", "-c", 'source "$1"; printf "%s\\n" "${MEGATRON_ARGS[@]}"', "_",
                           str(job / "exports" / "megatron_args.sh")], capture_output=True, text=True, check=True)
    tokens = proc.stdout.splitlines()
    options = {t for t in tokens if t.startswith("--")}
    assert options <= frameworks.MEGATRON_OPTIONS
    value = dict(zip(tokens, tokens[1:]))
    assert value["--tensor-model-parallel-size"] == "2" and value["--pipeline-model-parallel-size"] == "2"
    assert value["--num-layers-per-virtual-pipeline-stage"] == "1"  # 4 layers / (pp 2 x v 2)
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
    # Megatron-LM: use_torch_fsdp2 "is not currently working with Pipeline Parallel" (its training
    # config); DeepSpeed's PipelineEngine asserts zero_optimization_stage() < 2; Llama 3 has RoPE base 500000.
    from costmodels.layout import Layout
    from costmodels.presets import load_model
    from costmodels.training import TrainingSpec
    from planner.launch import frameworks

    model, training = load_model("llama3-8b"), TrainingSpec(global_batch_size=32, seq_len=4096)
    layout = Layout(dp=2, pp=2, zero_stage=3, num_microbatches=16)
    args, notes = frameworks.megatron_args(model, training, layout, 4096)
    assert args[args.index("--rotary-base") + 1] == "500000"
    assert "--use-torch-fsdp2" not in args and any("pipeline parallelism" in n for n in notes)
    assert set(a for a in args if a.startswith("--")) <= frameworks.MEGATRON_OPTIONS
    config, ds_notes = frameworks.deepspeed_config(training, layout)
    assert config["zero_optimization"]["stage"] == 1
    assert any("zero_optimization_stage() < 2" in n for n in ds_notes)
    flat_args, _ = frameworks.megatron_args(model, training, Layout(dp=4, zero_stage=3, num_microbatches=8), 4096)
    assert "--use-torch-fsdp2" in flat_args
