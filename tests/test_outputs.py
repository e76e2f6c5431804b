"""What the commands write: --out does not echo, files honour the umask, slurm.sbatch finds its
job and asks for the right resources (issue #17)."""

import json
import os
import stat

from click.testing import CliRunner

from planner.cli import main

JOB = ["--model", "tiny-llama", "--hardware", "cpu", "--gpus", "4", "--global-batch", "8", "--seq-len", "128",
       "--precision", "fp32"]


def _invoke(args):
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    return result


def test_out_keeps_stdout_empty_and_says_the_path_on_stderr(tmp_path):
    for fmt in ("json", "table"):
        path = tmp_path / f"plan-{fmt}.json"
        result = _invoke(["plan", *JOB, "--format", fmt, "--out", str(path)])
        assert result.stdout == ""
        assert result.stderr.count("\n") == 1 and f"wrote {path}: dp " in result.stderr
        assert json.loads(path.read_text())["best"]["layout"]["dp"] >= 1


def test_out_dash_prints_the_plan_file_only(tmp_path):
    result = _invoke(["plan", *JOB, "--format", "json", "--out", "-"])
    assert set(json.loads(result.stdout)) >= {"schema_version", "inputs", "best"}


def test_files_honour_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        _invoke(["plan", *JOB, "--launchable", "--out", str(tmp_path / "plan.json")])
        _invoke(["launch", str(tmp_path / "plan.json"), "--out", str(tmp_path / "job")])
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "plan.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "job" / "plan.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "job" / "launch.sh").stat().st_mode) == 0o755


def test_slurm_script_finds_its_job_dir_from_slurms_record_and_asks_cpus_for_a_cpu_plan(tmp_path, monkeypatch):
    """sbatch runs a spooled copy from wherever it was typed: the script reads its submitted path back
    from ``scontrol show job`` (or AUTOPLAN_JOB_DIR), never an absolute path written at launch."""
    monkeypatch.chdir(tmp_path)
    _invoke(["plan", *JOB, "--launchable", "--out", "plan.json"])
    _invoke(["launch", "plan.json", "--out", "job"])
    text = (tmp_path / "job" / "slurm.sbatch").read_text()
    assert 'HERE="${AUTOPLAN_JOB_DIR:-$(dirname "$(scontrol show job "$SLURM_JOB_ID"' in text
    assert str(tmp_path) not in text and "SLURM_SUBMIT_DIR" not in text
    assert "--gpus-per-node" not in text and "#SBATCH --cpus-per-task=2" in text


def test_slurm_script_asks_gpus_for_a_gpu_plan():
    from planner.launch.scripts import slurm_sbatch

    text = slurm_sbatch(world_size=16, gpus_per_node=8, name="x", summary="s", on_gpus=True)
    assert "#SBATCH --nodes=2" in text and "#SBATCH --gpus-per-node=8" in text and "#SBATCH --exclusive" in text


def test_nothing_fits_names_the_smallest_gpu_count_that_fits_and_it_does():
    import re

    import planner

    request = dict(model="llama3-70b", hardware="a100-sxm-40gb", global_batch=8, seq_len=2048)
    report = planner.plan(gpus=4, **request)
    assert report.best is None
    suggestions = report.closest_misses[0].suggestions
    assert suggestions[0].startswith("model states need ")
    count = int(re.search(r"--gpus (\d+) fits", suggestions[1]).group(1))
    assert planner.plan(gpus=count, **request).best is not None
    assert count == 8 or planner.plan(gpus=count // 2, **request).best is None


def test_the_smallest_fitting_count_is_bisected_over_whole_nodes_between_doublings():
    """Llama 3 70B at batch 512 without offload does not fit on 8 or 16 H100s; 32 (a doubling) fits
    and so does 24 (three nodes), which the bisection between 16 and 32 finds."""
    import planner

    request = dict(model="llama3-70b", hardware="h100-sxm-80gb", global_batch=512, seq_len=8192,
                   allow_offload=False)
    fit = planner.plan(gpus=8, **request).no_fit
    assert fit.smallest_fitting_gpus == 24
    assert planner.plan(gpus=16, **request).best is None and planner.plan(gpus=24, **request).best is not None
    L = fit.fitting_layout
    assert L.dp * L.tp * L.pp * L.cp == 24


def test_the_plan_json_of_nothing_fits_carries_the_no_fit_numbers_and_reads_back(tmp_path):
    """A scheduler reading the plan JSON gets why nothing fits and the smallest GPU count that does,
    with its layout, as numbers; the plan file round-trips them."""
    import json
    import subprocess
    import sys

    import planner
    from planner.plan.plan_file import read_plan_file

    out = tmp_path / "plan.json"
    args = ["plan", "--model", "llama3-70b", "--hardware", "a100-sxm-40gb", "--gpus", "4", "--global-batch", "8",
            "--seq-len", "2048"]
    run = subprocess.run([sys.executable, "-c", "from planner.cli import main; main()", *args, "--format", "json"],
                         capture_output=True, text=True)
    assert run.returncode == 1
    doc = json.loads(run.stdout)
    assert doc["best"] is None
    no_fit = doc["no_fit"]
    assert no_fit["reason"].startswith("model states need ") and no_fit["model_state_gib"] > 0
    api = planner.plan(model="llama3-70b", hardware="a100-sxm-40gb", gpus=4, global_batch=8, seq_len=2048).no_fit
    assert no_fit["smallest_fitting_gpus"] == api.smallest_fitting_gpus > 4
    assert no_fit["fitting_layout"] == api.fitting_layout.to_dict()
    assert CliRunner().invoke(main, [*args, "--out", str(out)]).exit_code == 1
    assert read_plan_file(out).no_fit.fitting_layout == api.fitting_layout
    assert "no_fit" not in json.loads(_invoke(["plan", *JOB, "--format", "json"]).stdout)


def test_predictions_say_whether_they_are_datasheet_estimates_or_measured():
    from planner.plan.render import prediction_status

    table = _invoke(["plan", *JOB]).stdout
    assert "datasheet estimates, shipped calibration" in table
    profiled = _invoke(["evaluate", "--model", "tiny-llama", "--hardware", "cpu", "--gpus", "2", "--global-batch", "4",
                        "--seq-len", "128", "--precision", "fp32", "--dp", "1", "--tp", "2", "--pp", "1",
                        "--profile", "profiles/data/cpu-gloo-2proc.json"]).stdout
    assert "datasheet estimates" not in profiled and "profile" in profiled.split("peak memory")[0]
    assert prediction_status({"compute": "profile", "dp_comm": "datasheet"}).startswith("partly measured: compute")
    assert prediction_status({"compute": "profile"}) == "predicted from the measured profile"
