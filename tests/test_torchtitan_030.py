"""torchtitan 0.3.0, the capability table's latest torchtitan release: each exported job is the command
line its ``torchtitan.train`` parses, and torchtitan's own code takes it.

``tests/torchtitan030_build.py`` (its own process: it starts a fake process group) parses each job's
``torchtitan_args.sh`` with 0.3.0's ``ConfigManager``, builds ``ParallelDims`` on a fake process group of
the plan's world size and the pipeline split on the meta device with 0.3.0's pipelining code. Here:
every stage's modules exist (the first holds the embedding, the last the norm and the ``lm_head``), and
the layout rebuilt from the parsed config evaluates to the plan's peak and step. torchtitan 0.3.0 is
installed by ``scripts/setup.sh`` into ``.venv/torchtitan-0.3.0``, beside the venv's 0.2.2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from planner.cli import main
from planner.launch.job import write_job
from planner.launch.readback import bash_array, launch_world_size, torchtitan_030_sections_layout
from planner.plan.plan_file import read_plan_file
from test_framework_matrix import _assert_round_trip

TORCHTITAN_030 = Path(sys.prefix) / "torchtitan-0.3.0"
"""Where ``scripts/setup.sh`` installs torchtitan 0.3.0 and spmd-types (``pip install --target``)."""

REFERENCE = {"llama3-8b": ("llama3-8b", "h100-sxm-80gb", 8, 64, 4096),
             "llama3-70b": ("llama3-70b", "h100-sxm-80gb", 64, 512, 8192),
             "llama3-405b": ("llama3-405b", "h100-sxm-80gb", 16384, 2048, 8192),
             "gpt3-175b": ("gpt3-175b", "a100-sxm-80gb", 1024, 1536, 2048),
             "mixtral-8x7b": ("mixtral-8x7b", "h100-sxm-80gb", 64, 512, 4096)}
"""The five reference jobs (``test_framework_jobs.CASES``)."""
BUILT = {"llama3-8b": ("llama3-8b", []), "llama3-70b": ("llama3-70b", []), "llama3-405b": ("llama3-405b", []),
         # pipelines: even stages (layers per stage), uneven stages (module names per chunk), interleaved
         "llama3-70b-pp4": ("llama3-70b", ["--pp", "4"]),
         "llama3-8b-uneven": ("llama3-8b", ["--pp", "2", "--layers-per-chunk", "15,17"]),
         "llama3-8b-interleaved": ("llama3-8b", ["--pp", "2", "--virtual-stages", "2", "--schedules", "interleaved"])}
"""Jobs built: the reference picks torchtitan 0.3.0 runs, and pipelined picks of the same models."""
REFUSED = {"gpt3-175b": "LayerNorm", "mixtral-8x7b": "qwen3_30b_a3b"}
"""Reference jobs ``plan`` refuses under torchtitan 0.3.0, with what the line must say."""


def _plan(out: Path, job: str, *extra: str):
    model, hardware, gpus, batch, seq = REFERENCE[job]
    return CliRunner().invoke(main, ["plan", "--model", model, "--hardware", hardware, "--gpus", str(gpus),
                                     "--global-batch", str(batch), "--seq-len", str(seq), "--runtime", "torchtitan",
                                     *extra, "--out", str(out)])


def build_jobs(jobs: list[Path]) -> list[dict]:
    """``tests/torchtitan030_build.py`` on each job directory at its launch.sh world size."""
    if not (TORCHTITAN_030 / "torchtitan").is_dir():
        pytest.skip(f"torchtitan 0.3.0 is not installed in {TORCHTITAN_030} (scripts/setup.sh)")
    args = [str(a) for job in jobs for a in (job, launch_world_size(job))]
    run = subprocess.run([sys.executable, str(Path(__file__).parent / "torchtitan030_build.py"), *args],
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "TORCHTITAN_030": str(TORCHTITAN_030)})
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


def check_built(plan, job: Path, built: dict) -> None:
    """The mesh, FSDP, the stages and the round trip of one job as torchtitan 0.3.0 built it."""
    world, L, n = launch_world_size(job), plan.best.layout, plan.inputs.model_spec.num_layers
    assert built["mesh_size"] == world and built["fsdp_enabled"] == (L.zero_stage > 0)
    assert built["sections"]["model"] == {"name": "llama3", "flavor": {32: "8B", 80: "70B", 126: "405B"}[n],
                                          "num_layers": n}
    stages = built["stages"]
    if L.pp > 1:
        assert len(stages) == L.pp * L.virtual_stages
        assert stages[0][0] == "tok_embeddings" and stages[-1][-2:] == ["norm", "lm_head"]
        assert [sum(m.startswith("layers.") for m in s) for s in stages] == list(L.chunk_layers(n))
        held = [m for s in stages for m in s]
        assert sorted(held) == sorted(["tok_embeddings", "norm", "lm_head", *(f"layers.{i}" for i in range(n))])
    else:
        assert stages == []
    layout, training = torchtitan_030_sections_layout(built["sections"], world, n)
    _assert_round_trip(plan, "torchtitan", layout, training)


@pytest.mark.slow
def test_torchtitan_030_builds_each_job_and_round_trips(tmp_path):
    plans, jobs = [], []
    for name, (job, extra) in BUILT.items():
        result = _plan(tmp_path / f"{name}.json", job, *extra)
        assert result.exit_code == 0, result.output
        plan = read_plan_file(tmp_path / f"{name}.json")
        assert plan.inputs.runtime_version == "v0.3.0"
        write_job(plan, tmp_path / name)
        plans.append(plan)
        jobs.append(tmp_path / name)
    assert any(p.best.layout.pp > 1 and len(set(p.best.layout.chunk_layers(p.inputs.model_spec.num_layers))) > 1
               for p in plans)  # an uneven split is built from module names
    for plan, job, built in zip(plans, jobs, build_jobs(jobs)):
        check_built(plan, job, built)


def test_launch_sh_runs_the_command_line_with_the_subcommand_last(tmp_path):
    """launch.sh passes its own arguments before the activation-checkpoint subcommand: tyro applies
    every option after a subcommand to that subcommand."""
    assert _plan(tmp_path / "plan.json", "llama3-8b").exit_code == 0
    write_job(read_plan_file(tmp_path / "plan.json"), tmp_path / "job")
    text = (tmp_path / "job" / "torchtitan_args.sh").read_text(encoding="utf-8")
    options, subcommand = bash_array(text, "TORCHTITAN_ARGS"), bash_array(text, "TORCHTITAN_AC")
    assert options[:4] == ["--module", "llama3", "--config", "llama3_8b"]
    assert subcommand == ["activation-checkpoint:selective"]  # the pick recomputes op-level SAC
    launch = (tmp_path / "job" / "launch.sh").read_text(encoding="utf-8")
    assert launch.rstrip().endswith('-m torchtitan.train "${TORCHTITAN_ARGS[@]}" --dump_folder "$HERE"/outputs "$@" '
                                    '"${TORCHTITAN_AC[@]}"')
    assert not (tmp_path / "job" / "torchtitan.toml").exists()


@pytest.mark.parametrize("job", sorted(REFUSED))
def test_what_torchtitan_030_cannot_build_is_refused_at_plan_time(tmp_path, job):
    result = _plan(tmp_path / "plan.json", job)
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.strip().splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in result.output
    assert "--runtime torchtitan cannot run" in lines[0] and REFUSED[job] in lines[0]
    assert "plan with --runtime megatron" in lines[0]


def test_the_405b_job_brings_its_own_config_registry(tmp_path):
    """torchtitan's registered llama3_405b trains in Float8 (its model spec's converter): the job's own
    registry, beside launch.sh and on its PYTHONPATH, gives the bf16 405B the plan costed."""
    assert _plan(tmp_path / "plan.json", "llama3-405b").exit_code == 0
    write_job(read_plan_file(tmp_path / "plan.json"), tmp_path / "job")
    options = bash_array((tmp_path / "job" / "torchtitan_args.sh").read_text(encoding="utf-8"), "TORCHTITAN_ARGS")
    assert options[:4] == ["--module", "torchtitan_job", "--config", "llama3_405b_bf16"]
    registry = (tmp_path / "job" / "torchtitan_job.py").read_text(encoding="utf-8")
    assert 'model_registry("405B")' in registry and "converters" not in registry.split('"""')[-1]
    assert 'export PYTHONPATH="$HERE' in (tmp_path / "job" / "launch.sh").read_text(encoding="utf-8")


def test_fp8_is_refused_naming_torchtitan_022_which_runs_it(tmp_path):
    """0.3.0 sets FP8 in a registered config's model spec, not on its command line; 0.2.2's TOML sets it,
    and ``--runtime-version v0.2.2`` stays selectable."""
    result = _plan(tmp_path / "plan.json", "llama3-8b", "--precision", "fp8", "--fp8-recipe", "tensorwise")
    assert result.exit_code == 2 and "--runtime torchtitan --runtime-version v0.2.2" in result.output
    result = _plan(tmp_path / "plan.json", "llama3-405b", "--runtime-version", "v0.2.2")
    assert result.exit_code == 0, result.output
    write_job(read_plan_file(tmp_path / "plan.json"), tmp_path / "job")
    assert (tmp_path / "job" / "torchtitan.toml").exists() and not (tmp_path / "job" / "torchtitan_args.sh").exists()
