"""Each framework job's launch.sh and slurm.sbatch run far enough to check without the framework:
a fake ``torchrun`` (and ``srun``/``scontrol`` for Slurm) on PATH records its argv and working
directory, and the test asserts the node count, processes per node, rendezvous, entry point, the
exported options file passed through unchanged, checkpoints and logs in the job directory from
wherever the script is started, and the user's extra arguments last."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from planner.cli import main
from planner.launch.readback import bash_array
from planner.plan.plan_file import read_plan_file

# llama3-8b on 2 nodes x 4 GPUs: dp 2 · tp 2 · pp 2, a layout every framework runs
EVALUATE = ["evaluate", "--model", "llama3-8b", "--hardware", "h100-sxm-80gb", "--gpus", "8", "--gpus-per-node", "4",
            "--global-batch", "16", "--seq-len", "1024", "--dp", "2", "--tp", "2", "--pp", "2", "--zero", "1",
            "--sequence-parallel"]
CHECKOUTS = {"MEGATRON_LM": "/opt/Megatron-LM", "MEGATRON_BRIDGE": "/opt/Megatron-Bridge",
             "MEGATRON_DEEPSPEED": "/opt/Megatron-DeepSpeed", "RECIPE": "llama3_8b_pretrain_config"}
EXTRA = ["--data-path", "my data"]
"""User arguments after launch.sh's own: they must arrive last and as given (one with a space)."""

FAKE_TORCHRUN = """#!/usr/bin/env bash
printf '%s\\0' "$@" > "$RECORD"
printf '%s' "${CUDA_DEVICE_MAX_CONNECTIONS:-unset}" > "$RECORD.env"
printf '%s' "$PWD" > "$RECORD.cwd"
"""
FAKE_SCONTROL = """#!/usr/bin/env bash
if [ "$1 $2" = "show hostnames" ] && [ "$3" = "$SLURM_JOB_NODELIST" ]; then printf 'gpu-a\\ngpu-b\\n'; exit 0; fi
if [ "$1 $2 $3" = "show job $SLURM_JOB_ID" ]; then
  printf 'JobId=%s JobName=x\\n   Command=%s\\n   WorkDir=/elsewhere\\n' "$3" "$SUBMITTED"; exit 0
fi
exit 9
"""
"""scontrol: the allocation's hosts, and the job's record, whose Command= is the script as submitted."""
FAKE_SRUN = """#!/usr/bin/env bash
while [[ "$1" == --* ]]; do shift; done
SLURM_NODEID=1 exec "$@"
"""
"""srun as the second node would run it (one task per node: the test checks that node's torchrun)."""


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> dict[str, Path]:
    """A job of each runtime, and torchtitan's TOML job (``torchtitan@v0.2.2``)."""
    jobs = {}
    for name in ("megatron", "megatron-bridge", "torchtitan", "deepspeed", "torchtitan@v0.2.2"):
        runtime, _, version = name.partition("@")
        root = tmp_path_factory.mktemp(f"{runtime} launch")
        plan = root / "plan.json"
        layout = ["--zero", "3"] if runtime == "torchtitan" else []  # torchtitan's DDP runs no pp
        result = CliRunner().invoke(main, [*EVALUATE, *layout, "--runtime", runtime, "--out", str(plan)])
        assert result.exit_code == 0, result.output
        if version:  # evaluate names no release: the plan of that release, as plan --runtime-version writes it
            written = read_plan_file(plan)
            plan.write_text(dataclasses.replace(written, inputs=dataclasses.replace(
                written.inputs, runtime_version=version)).to_json())
        launched = CliRunner().invoke(main, ["launch", str(plan), "--out", str(root / "job dir")])
        assert launched.exit_code == 0, launched.output
        jobs[name] = root / "job dir"
    return jobs


@pytest.fixture
def fake_bin(tmp_path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("torchrun", FAKE_TORCHRUN), ("scontrol", FAKE_SCONTROL), ("srun", FAKE_SRUN)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def _run(script: Path, fake_bin: Path, tmp_path: Path, args: tuple[str, ...] = tuple(EXTRA), cwd: Path | None = None,
         **env) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run ``script`` from ``cwd`` (default ``tmp_path``); its torchrun's argv (and, beside it, the
    torchrun's working directory in ``argv.cwd``) is recorded under ``tmp_path``."""
    record = tmp_path / "argv"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_", "NNODES", "GPUS_PER_NODE",
                                                                      "NODE_RANK", "MEGATRON", "RECIPE"))}
    full = clean | {"PATH": f"{fake_bin}:{os.environ['PATH']}", "RECORD": str(record)} | env
    proc = subprocess.run(["bash", str(script), *args], cwd=cwd or tmp_path, env=full, capture_output=True, text=True,
                          timeout=60)
    argv = record.read_text().split("\0")[:-1] if record.exists() else []
    return proc, argv


def _outputs(runtime: str, job: Path) -> list[str]:
    """The arguments that put the job's checkpoints and logs in its directory, as torchrun receives them."""
    if runtime == "megatron-bridge":  # JSON values, as bridge_overrides.txt writes them
        return [f'checkpoint.save="{job}/checkpoints"', f'checkpoint.load="{job}/checkpoints"',
                f'logger.tensorboard_dir="{job}/logs"']
    if runtime == "torchtitan":
        return ["--dump_folder", f"{job}/outputs"]
    return ["--save", f"{job}/checkpoints", "--load", f"{job}/checkpoints", "--tensorboard-dir", f"{job}/logs"]


def _expected_command(runtime: str, job: Path) -> list[str]:
    """What torchrun must run after its own options, built from the job's files independently of launch.sh,
    with launch.sh's arguments (``EXTRA``) where they go."""
    outputs = _outputs(runtime, job)
    if runtime == "megatron":
        tokens = bash_array((job / "megatron_args.sh").read_text(), "MEGATRON_ARGS")
        return ["/opt/Megatron-LM/pretrain_gpt.py", *tokens, *outputs, *EXTRA]  # EXTRA names data: no --mock-data
    if runtime == "megatron-bridge":
        overrides = [line for line in (job / "bridge_overrides.txt").read_text().splitlines()
                     if not line.startswith("#")]
        return ["/opt/Megatron-Bridge/scripts/training/run_recipe.py", "--recipe", "llama3_8b_pretrain_config",
                "--dataset", "mock", *overrides, *outputs, *EXTRA]
    if runtime == "torchtitan":  # torchtitan 0.3.0: the activation-checkpoint subcommand last
        text = (job / "torchtitan_args.sh").read_text()
        return ["-m", "torchtitan.train", *bash_array(text, "TORCHTITAN_ARGS"), *outputs, *EXTRA,
                *bash_array(text, "TORCHTITAN_AC")]
    tokens = bash_array((job / "megatron_deepspeed_args.sh").read_text(), "MEGATRON_DS_ARGS")
    return ["/opt/Megatron-DeepSpeed/pretrain_gpt.py", *tokens, "--deepspeed_config", str(job / "deepspeed.json"),
            *outputs, *EXTRA]


def _torchrun_options(nnodes: int, nproc: int, rank: int, addr: str) -> list[str]:
    return ["--nnodes", str(nnodes), "--nproc-per-node", str(nproc), "--node-rank", str(rank),
            "--master-addr", addr, "--master-port", "29500"]


@pytest.mark.parametrize("runtime", ["megatron", "megatron-bridge", "torchtitan", "deepspeed"])
def test_launch_sh_runs_torchrun_on_the_plans_world(jobs, fake_bin, tmp_path, runtime):
    job = jobs[runtime]
    assert subprocess.run(["bash", "-n", str(job / "launch.sh")]).returncode == 0
    proc, argv = _run(job / "launch.sh", fake_bin, tmp_path, **CHECKOUTS)
    assert proc.returncode == 0, proc.stderr
    # 8 GPUs, 4 a node: 2 nodes; this is node 0 of a local rendezvous
    assert argv == _torchrun_options(2, 4, 0, "localhost") + _expected_command(runtime, job)
    assert "" not in argv  # no empty argument (a blank overrides line, an unset variable)
    assert Path(tmp_path / "argv.env").read_text() == "1"  # CUDA_DEVICE_MAX_CONNECTIONS for TP overlap


OUTPUT_PLACES = {
    "megatron": {"--save": "checkpoints", "--load": "checkpoints", "--tensorboard-dir": "logs"},
    "deepspeed": {"--save": "checkpoints", "--load": "checkpoints", "--tensorboard-dir": "logs"},
    "megatron-bridge": {"checkpoint.save": "checkpoints", "checkpoint.load": "checkpoints",
                        "logger.tensorboard_dir": "logs"},
    "torchtitan": {"--dump_folder": "outputs"},
    "torchtitan@v0.2.2": {"--job.dump_folder": "outputs"},
}
"""Each job's options that say where it writes, and the directory each names inside the job directory:
checkpoints and TensorBoard logs (torchtitan: its dump folder, which holds both)."""


def _written_places(name: str, argv: list[str]) -> dict[str, str]:
    """{option: the path it names} in torchrun's argv, for the options of ``OUTPUT_PLACES[name]``."""
    wanted = OUTPUT_PLACES[name]
    if name == "megatron-bridge":  # KEY=VALUE overrides, values as JSON
        pairs = [arg.split("=", 1) for arg in argv if arg.split("=", 1)[0] in wanted]
        return {key: json.loads(value) for key, value in pairs}
    return {arg: argv[i + 1] for i, arg in enumerate(argv) if arg in wanted}


@pytest.mark.parametrize("name", ["megatron", "megatron-bridge", "torchtitan", "deepspeed", "torchtitan@v0.2.2"])
def test_checkpoints_and_logs_go_in_the_job_directory_from_any_directory(jobs, fake_bin, tmp_path, name):
    """The jobs wrote checkpoints/ and logs/ (torchtitan: ./outputs) in whatever directory launch.sh was
    started from, while slurm.sbatch and the Kubernetes manifest's header say they go in the job
    directory. Started from two other directories, every place the job writes is inside the job
    directory; launch.sh keeps the caller's working directory, so paths in the user's arguments (and
    torchtitan's tokenizer, which it reads from its checkout) mean what they meant."""
    job = jobs[name]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for start in (elsewhere, job.parent):
        proc, argv = _run(job / "launch.sh", fake_bin, tmp_path, cwd=start, **CHECKOUTS)
        assert proc.returncode == 0, proc.stderr
        cwd = Path((tmp_path / "argv.cwd").read_text())
        assert cwd.resolve() == start.resolve()
        places = _written_places(name, argv)
        assert places.keys() == OUTPUT_PLACES[name].keys()
        for option, path in places.items():
            assert (cwd / path).resolve() == (job / OUTPUT_PLACES[name][option]).resolve(), option


@pytest.mark.parametrize("data", [["--data-path", "/data/tokens_text_document"], ["--data-path=/data/x"],
                                  ["--train-data-path", "/data/train"], ["--lr", "1e-4"]])
def test_deepspeed_launch_sh_never_passes_mock_data_and_stops_without_data(jobs, fake_bin, tmp_path, data):
    """Megatron-DeepSpeed has no --mock-data ('unrecognized arguments'): launch.sh passes none, and
    without a data argument stops before torchrun with one line saying what to pass."""
    proc, argv = _run(jobs["deepspeed"] / "launch.sh", fake_bin, tmp_path, args=tuple(data), **CHECKOUTS)
    if any(a.startswith(("--data-path", "--train-data-path")) for a in data):
        assert proc.returncode == 0, proc.stderr
        assert argv[-len(data):] == data and "--mock-data" not in argv
    else:
        assert proc.returncode == 2 and argv == []
        assert "Megatron-DeepSpeed has no synthetic data" in proc.stderr and "--data-path" in proc.stderr


@pytest.mark.parametrize("runtime", ["megatron"])
@pytest.mark.parametrize("data", [["--data-path", "/data/tokens_text_document"], ["--data-path=/data/x"],
                                  ["--train-data-path", "/data/train"], ["--mock-data"], ["--lr", "1e-4"]])
def test_launch_sh_gives_mock_data_only_when_no_data_is_named(jobs, fake_bin, tmp_path, runtime, data):
    """Megatron's --mock-data wins over --data-path, so launch.sh passes it only when the arguments
    name no data (else the job would train on random tokens whatever data it was given)."""
    proc, argv = _run(jobs[runtime] / "launch.sh", fake_bin, tmp_path, args=tuple(data), **CHECKOUTS)
    assert proc.returncode == 0, proc.stderr
    assert argv[-len(data):] == data
    real_data = any(a.startswith(("--data-path", "--train-data-path")) for a in data)
    assert argv.count("--mock-data") == (0 if real_data else 1)  # once: ours, or the user's own


@pytest.mark.parametrize("runtime, variable", [("megatron", "MEGATRON_LM"), ("megatron-bridge", "MEGATRON_BRIDGE"),
                                               ("megatron-bridge", "RECIPE"), ("deepspeed", "MEGATRON_DEEPSPEED")])
def test_launch_sh_stops_before_torchrun_without_the_framework_checkout(jobs, fake_bin, tmp_path, runtime, variable):
    env = {k: v for k, v in CHECKOUTS.items() if k != variable}
    proc, argv = _run(jobs[runtime] / "launch.sh", fake_bin, tmp_path, **env)
    assert proc.returncode != 0 and f"set {variable} to a" in proc.stderr
    assert argv == []


@pytest.mark.parametrize("runtime", ["megatron", "torchtitan"])
def test_launch_sh_takes_the_world_from_the_environment(jobs, fake_bin, tmp_path, runtime):
    env = CHECKOUTS | {"NNODES": "4", "GPUS_PER_NODE": "2", "SLURM_NODEID": "3", "MASTER_ADDR": "head",
                       "MASTER_PORT": "29500"}
    proc, argv = _run(jobs[runtime] / "launch.sh", fake_bin, tmp_path, **env)
    assert proc.returncode == 0, proc.stderr
    assert argv[:10] == _torchrun_options(4, 2, 3, "head")


@pytest.mark.parametrize("runtime", ["megatron", "megatron-bridge", "torchtitan", "deepspeed"])
def test_slurm_sbatch_starts_launch_sh_on_each_node_with_the_first_as_rendezvous(jobs, fake_bin, tmp_path, runtime):
    job = jobs[runtime]
    text = (job / "slurm.sbatch").read_text()
    assert "#SBATCH --nodes=2\n" in text and "#SBATCH --gpus-per-node=4\n" in text
    assert all(f"#SBATCH {o}\n" in text for o in ("--time=24:00:00", "--exclusive"))
    assert "srun --kill-on-bad-exit=1 " in text and str(job) not in text  # no absolute path: the job can move
    spool = tmp_path / "spool"  # sbatch runs a copy of the script, from the submission directory
    spool.mkdir()
    (spool / "slurm_script").write_text(text)
    proc, argv = _run(spool / "slurm_script", fake_bin, tmp_path, SLURM_JOB_NODELIST="gpu-[a-b]", SLURM_JOB_ID="42",
                      SUBMITTED=str(job / "slurm.sbatch"), **CHECKOUTS)
    assert proc.returncode == 0, proc.stderr
    assert argv == _torchrun_options(2, 4, 1, "gpu-a") + _expected_command(runtime, job)


def test_slurm_sbatch_stops_when_it_cannot_find_its_job_directory(jobs, fake_bin, tmp_path):
    proc, argv = _run(jobs["megatron"] / "slurm.sbatch", fake_bin, tmp_path, SLURM_JOB_NODELIST="gpu-[a-b]",
                      SLURM_JOB_ID="42", SUBMITTED="/nowhere/slurm.sbatch", **CHECKOUTS)
    assert proc.returncode == 2 and argv == [] and "set AUTOPLAN_JOB_DIR" in proc.stderr


def test_launch_prints_the_line_that_submits_the_job_and_takes_slurm_options(tmp_path):
    plan = tmp_path / "plan.json"
    assert CliRunner().invoke(main, [*EVALUATE, "--out", str(plan)]).exit_code == 0
    result = CliRunner().invoke(main, ["launch", str(plan), "--out", str(tmp_path / "job"), "--scheduler", "slurm",
                                       "--slurm-time", "2-00:00:00", "--no-slurm-exclusive",
                                       "--slurm-partition", "h100", "--slurm-account", "llm"])
    assert result.exit_code == 0, result.output
    assert result.output.strip().endswith(f"run: sbatch {tmp_path / 'job'}/slurm.sbatch")
    text = (tmp_path / "job" / "slurm.sbatch").read_text()
    assert "#SBATCH --time=2-00:00:00\n" in text and "--exclusive" not in text
    assert "#SBATCH --partition=h100\n" in text and "#SBATCH --account=llm\n" in text
    bad = CliRunner().invoke(main, ["launch", str(plan), "--out", str(tmp_path / "job2"), "--slurm-time", "soon"])
    assert bad.exit_code == 2 and "--slurm-time 'soon'" in bad.output and not (tmp_path / "job2").exists()


@pytest.mark.parametrize("time", ["0", "90", "90:30", "48:00:00", "2-12", "2-12:30", "2-12:30:15", "10000"])
def test_slurm_time_takes_each_of_sbatchs_forms(jobs, tmp_path, time):
    result = CliRunner().invoke(main, ["launch", str(jobs["megatron"].parent / "plan.json"), "--out",
                                       str(tmp_path / "job"), "--slurm-time", time])
    assert result.exit_code == 0, result.output
    assert f"#SBATCH --time={time}\n" in (tmp_path / "job" / "slurm.sbatch").read_text()


@pytest.mark.parametrize("time, problem", [
    ("99:99:99", "minutes 99 is out of range (0-59 after another field)"), ("90:60", "seconds 60"),
    ("1:60:00", "minutes 60"), ("1:00:60", "seconds 60"), ("2-24", "hours 24 is out of range (0-23"),
    ("2-00:60", "minutes 60"), ("2-00:00:60", "seconds 60"), ("1:2:3:4", "not a time limit"),
    ("1-2-3", "not a time limit"), ("-1", "not a time limit"), ("1:", "not a time limit"),
    ("\u0663", "not a time limit"), ("24:00:00\n", "not a time limit"), ("", "not a time limit")])
def test_slurm_time_outside_sbatchs_forms_is_one_line_exit_2(jobs, tmp_path, time, problem):
    """sbatch adds the fields up without checking them (Slurm's time_str2secs), so 99:99:99 would be
    100:40:39: a field after another must be within its unit, digits ASCII, the whole value one form."""
    result = CliRunner().invoke(main, ["launch", str(jobs["megatron"].parent / "plan.json"), "--out",
                                       str(tmp_path / "job"), "--slurm-time", time])
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"error: --slurm-time {time!r}: {problem}") and "days-hours:minutes:seconds" in line
    assert not (tmp_path / "job").exists()


@pytest.mark.parametrize("flag", ["partition", "account"])
def test_slurm_names_refuse_a_final_newline(flag):
    """``#SBATCH --partition=h100\\n`` would end the directive early: the whole value is checked."""
    from autoplan_base.errors import AutoplanError
    from planner.launch.slurm import SlurmOptions

    assert getattr(SlurmOptions(**{flag: "h100"}), flag) == "h100"
    with pytest.raises(AutoplanError, match=f"--slurm-{flag} 'h100\\\\n'"):
        SlurmOptions(**{flag: "h100\n"})


@pytest.mark.parametrize("runtime", ["megatron", "megatron-bridge", "torchtitan", "deepspeed"])
def test_launch_rewrites_its_own_framework_job_directory(jobs, runtime):
    # an earlier job of any runtime is a place launch may write again (the README launches the
    # default plan, then the same plan with --scheduler kubernetes into the same directory)
    job = jobs[runtime]
    again = CliRunner().invoke(main, ["launch", str(job / "plan.json"), "--out", str(job),
                                      "--scheduler", "kubernetes"])
    assert again.exit_code == 0, again.output
    assert (job / "jobset.yaml").is_file()


def test_launch_refuses_a_plan_that_does_not_fit_unless_allowed(tmp_path):
    # evaluate --out writes any layout, marked "fits": false when it does not fit; launching it would
    # write a job that runs out of memory: exit 1 (valid, but it does not fit) in one line, nothing written
    plan = tmp_path / "plan.json"
    result = CliRunner().invoke(main, ["evaluate", "--model", "llama3-70b", "--hardware", "h100-sxm-80gb", "--gpus",
                                       "8", "--global-batch", "64", "--seq-len", "4096", "--dp", "8", "--tp", "1",
                                       "--pp", "1", "--out", str(plan)])
    assert result.exit_code == 0, result.output
    refused = CliRunner().invoke(main, ["launch", str(plan), "--out", str(tmp_path / "job")])
    assert refused.exit_code == 1
    lines = refused.output.strip().splitlines()
    assert len(lines) == 1 and "predicted not to fit" in lines[0] and "--allow-no-fit" in lines[0]
    assert not (tmp_path / "job").exists()
    allowed = CliRunner().invoke(main, ["launch", str(plan), "--out", str(tmp_path / "job"), "--allow-no-fit"])
    assert allowed.exit_code == 0, allowed.output
    assert (tmp_path / "job" / "launch.sh").is_file()


@pytest.mark.parametrize("evaluate, degrees", [
    (["--model", "mixtral-8x7b", "--hardware", "h100-sxm-80gb", "--gpus", "8", "--global-batch", "16", "--seq-len",
      "1024", "--dp", "4", "--tp", "1", "--pp", "1", "--cp", "2", "--ep", "4", "--zero", "1"],
     ["dp 4", "tp 1", "pp 1", "cp 2", "ep 4"]),
    (["--model", "tiny-llama", "--hardware", "cpu", "--gpus", "4", "--global-batch", "4", "--seq-len", "32",
      "--precision", "fp32", "--runtime", "torch", "--dp", "2", "--tp", "1", "--pp", "1", "--cp", "2"],
     ["dp 2", "tp 1", "pp 1", "cp 2"]),
])
def test_job_headers_name_every_degree_the_plan_names(tmp_path, evaluate, degrees):
    """launch.sh, slurm.sbatch (the torch job's; a framework job's names no layout) and the manifest
    said "dp 2 tp 4 pp 4" of a cp 2 plan: each header names the degrees the plan's own summary names."""
    plan = tmp_path / "plan.json"
    made = CliRunner().invoke(main, ["evaluate", *evaluate, "--out", str(plan)])
    assert made.exit_code == 0, made.output
    assert " · ".join(degrees) + " · ZeRO-" in made.output  # the plan's summary
    result = CliRunner().invoke(main, ["launch", str(plan), "--out", str(tmp_path / "job"), "--scheduler",
                                       "kubernetes", "--allow-no-fit"])
    assert result.exit_code == 0, result.output
    files = ["launch.sh", "jobset.yaml"] + (["slurm.sbatch"] if "torch" in evaluate else [])
    for file in files:
        header = (tmp_path / "job" / file).read_text().splitlines()[:2]
        assert any(f": {' '.join(degrees)} zero " in line for line in header), (file, header)
