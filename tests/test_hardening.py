"""Regression tests for issue #16: every failure class the fuzz campaign found, reproduced first.

Each test names its class (1-9 in the issue). The CLI is driven through CliRunner, which runs the
same top-level handler (``planner.cli.OneLineErrors.main``) as the installed command.
"""

import json
import math
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

import planner
from costmodels.layout import Layout
from costmodels.model_spec import ModelSpec, MoESpec
from costmodels.training import TrainingSpec
from hardware_specs import load_node
from planner.cli import main
from planner.search.factors import divisors, prime_factors

JOB = ["--model", "tiny-llama", "--hardware", "cpu", "--gpus", "2", "--global-batch", "8", "--seq-len", "128"]
ROOT = Path(__file__).resolve().parents[1]
SMALL = dict(name="m", num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, num_kv_heads=4,
             vocab_size=100)


def run(args):
    return CliRunner().invoke(main, args)


def one_line_error(result, code=2):
    """The result exited ``code`` with exactly one line on stderr and no traceback."""
    assert result.exit_code == code, (result.exit_code, result.output)
    assert "Traceback" not in result.output
    assert result.stderr.count("\n") == 1, result.stderr
    return result.stderr


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    assert run(["plan", *JOB, "--launchable", "--out", str(path)]).exit_code == 0
    return path


# 1. Non-finite numbers
@pytest.mark.parametrize("field, bad", [("memory_gib", "nan"), ("memory_gib", "inf"), ("gpus_per_node", "inf"),
                                        ("bf16_tflops", "nan")])
def test_1_non_finite_hardware_numbers_are_refused(tmp_path, field, bad):
    text = (ROOT / "hardware_specs/data/cpu.toml").read_text()
    toml = tmp_path / "hw.toml"
    toml.write_text("\n".join(f"{field} = {bad}" if line.startswith(f"{field} = ") else line
                              for line in text.splitlines()))
    out = tmp_path / "plan.json"
    result = run(["plan", *JOB[:2], "--hardware", str(toml), *JOB[4:], "--out", str(out)])
    assert field.split("_")[0] in one_line_error(result)
    assert not out.exists()


@pytest.mark.parametrize("value", [float("nan"), float("-inf")])
def test_1_launch_refuses_non_finite_plan_files(tmp_path, plan_file, value):
    doc = json.loads(plan_file.read_text())
    doc["best"]["layout"]["sequence_parallel"] = value
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    err = one_line_error(run(["launch", str(bad), "--out", str(tmp_path / "job")]))
    assert "JSON allows" in err
    assert not (tmp_path / "job").exists()


# 2. Undecodable or pathological input files
@pytest.mark.parametrize("content, words", [
    ("latin1", "not UTF-8"), ("deep", "nested"), ("digits", "not valid JSON"), ("overflow", "not valid JSON")])
def test_2_pathological_model_files_get_one_line(tmp_path, content, words):
    path = tmp_path / "config.json"
    if content == "latin1":
        path.write_bytes('{"model_type": "caf\xe9"}'.encode("latin-1"))
    elif content == "deep":
        path.write_text("[" * 200_000 + "]" * 200_000)
    elif content == "digits":
        path.write_text('{"vocab_size": ' + "1" * 5000 + "}")
    else:
        path.write_text('{"vocab_size": 1e400}')
    assert words in one_line_error(run(["plan", "--model", str(path), *JOB[2:]]))


def test_2_hardware_toml_that_is_not_utf8(tmp_path):
    path = tmp_path / "hw.toml"
    path.write_bytes('name = "caf\xe9"\n'.encode("latin-1"))
    assert "not UTF-8" in one_line_error(run(["plan", *JOB[:2], "--hardware", str(path), *JOB[4:]]))


def test_2_explain_dev_zero_and_a_fifo_return_at_once(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in ("/dev/zero", str(fifo)):
        assert "not a regular file" in one_line_error(run(["explain", path]))


# 3. Plan files checked at every level, bad fields named by dotted path
@pytest.mark.parametrize("mutate, named", [
    (lambda d: d["best"].update(layout=1), "best.layout"),
    (lambda d: d["best"]["layout"].update(zero_stage="x"), "best.layout.zero_stage"),
    (lambda d: d["inputs"].pop("gpus"), "inputs.gpus"),
    (lambda d: d["search"].update(evaluated=-1), "search.evaluated"),
    (lambda d: d["inputs"].update(training=None), "inputs.training"),
    (lambda d: d["best"]["layout"].update(layers_per_chunk=-1), "best.layout.layers_per_chunk"),
    (lambda d: d["inputs"]["model_spec"].update(head_dim="x"), "inputs.model_spec"),
])
@pytest.mark.parametrize("verb", ["explain", "launch"])
def test_3_plan_file_fields_are_named(tmp_path, plan_file, mutate, named, verb):
    doc = json.loads(plan_file.read_text())
    mutate(doc)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    extra = ["--out", str(tmp_path / "job")] if verb == "launch" else []
    assert named in one_line_error(run([verb, str(bad), *extra]))


# 4. Output places
@pytest.mark.parametrize("place", ["/proc/autoplan-x/job", "FILE/under", "/"])
def test_4_launch_refuses_bad_output_places(tmp_path, plan_file, place):
    place = place.replace("FILE", str(plan_file))
    before = sorted(os.listdir("/"))
    err = one_line_error(run(["launch", str(plan_file), "--out", place]))
    assert "--out" in err and json.dumps(place) in err
    assert sorted(os.listdir("/")) == before


@pytest.mark.parametrize("verb", ["plan", "launch"])
def test_4_an_output_path_with_a_line_break_is_refused(tmp_path, plan_file, verb):
    # every line that names the path ('wrote ...', the run command) would split in two
    place = tmp_path / ("a\nb.json" if verb == "plan" else "a\nb")
    args = ["plan", *JOB, "--out", str(place)] if verb == "plan" else ["launch", str(plan_file), "--out", str(place)]
    result = run(args)
    assert result.exit_code == 2 and "a\\nb" in one_line_error(result) and "line break" in one_line_error(result)
    assert not place.exists()


def test_4_the_run_command_quotes_a_job_directory_with_a_space(tmp_path, plan_file):
    job = tmp_path / "my job"
    result = run(["launch", str(plan_file), "--out", str(job)])
    assert result.exit_code == 0
    assert f"run: '{job}/launch.sh'" in result.output


def test_4_launch_needs_force_for_a_foreign_non_empty_directory(tmp_path, plan_file):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep\n")
    assert "--force" in one_line_error(run(["launch", str(plan_file), "--out", str(foreign)]))
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
    assert run(["launch", str(plan_file), "--out", str(foreign), "--force"]).exit_code == 0
    job = tmp_path / "job"
    assert run(["launch", str(plan_file), "--out", str(job)]).exit_code == 0
    assert run(["launch", str(plan_file), "--out", str(job)]).exit_code == 0  # an earlier job is reused


@pytest.mark.parametrize("args", [["plan", *JOB, "--plot", "/proc/x"], ["plan", *JOB, "--out", "/proc/x/p.json"],
                                  ["validate", "PLAN", "--dry-run", "--workdir", "/proc/x"]])
def test_4_plot_out_and_workdir_under_proc_are_refused(plan_file, args):
    args = [str(plan_file) if a == "PLAN" else a for a in args]
    assert "/proc" in one_line_error(run(args))


def test_4_read_only_directory_is_refused(tmp_path, plan_file):
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only directories")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    assert "not writable" in one_line_error(run(["launch", str(plan_file), "--out", str(locked / "job")]))


def test_4_profile_out_under_proc_fails_before_measuring():
    started = time.monotonic()
    proc = subprocess.run([str(Path(sys.executable).parent / "autoplan"), "profile", "--device", "cpu", "--nproc",
                           "1", "--quick", "--out", "/proc/x/p.json"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "/proc" in proc.stderr
    assert time.monotonic() - started < 10  # nothing was measured (a quick profile takes tens of seconds)


# 5. Hangs
def test_5_divisors_by_factorisation():
    assert divisors(10**25)[:5] == [1, 2, 4, 5, 8] and len(divisors(10**25)) == 26 * 26
    assert prime_factors(9999999999999999999999999) == {3: 2, 41: 1, 271: 1, 21401: 1, 25601: 1, 182521213001: 1}
    assert all(divisors(n) == [d for d in range(1, n + 1) if n % d == 0] for n in range(1, 600))


@pytest.mark.parametrize("flag, value", [("--global-batch", "9999999999999999999999999"), ("--gpus", str(2**40)),
                                         ("--seq-len", str(2**40))])
def test_5_huge_numbers_are_refused_at_once_with_the_limit(flag, value):
    err = one_line_error(run(["plan", *JOB, flag, value]))
    assert flag in err or flag.strip("-").replace("-", "_") in err


# 6. shard
def test_6_shard_input_shape_is_bounded():
    err = one_line_error(run(["shard", "--model", "tiny-llama", "--tp", "2", "--input-shape", "1,99999999999999999999"]))
    assert "--input-shape" in err


# 7. Messages
def test_7_bare_autoplan_prints_help_and_exits_0():
    proc = subprocess.run([str(Path(sys.executable).parent / "autoplan")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "Usage:" in proc.stdout and "Exit codes" in proc.stdout and proc.stderr == ""


def test_7_click_messages_are_one_line():
    err = one_line_error(run(["profile", "--nproc", "1", "--out", "x.json"]))
    assert "--device" in err and "cpu, cuda" in err


def test_7_newline_in_a_path_is_quoted(tmp_path):
    err = one_line_error(run(["explain", str(tmp_path / "a\nb.json")]))
    assert "a\\nb.json" in err


def test_7_batch_smaller_than_dp_says_nothing_was_searched():
    result = run(["plan", "--model", "tiny-llama", "--hardware", "cpu", "--gpus", "64", "--global-batch", "1",
                  "--seq-len", "7"])
    err = one_line_error(result, code=1)
    assert "no layout fits in memory" not in err and "nothing to search" in err and "--global-batch" in err


def test_7_calibrate_with_nothing_measured(tmp_path, plan_file):
    err = one_line_error(run(["validate", str(plan_file), "--calibrate", "--profile", str(tmp_path / "p.json"),
                              "--nproc", "3", "--workdir", str(tmp_path / "wd")]))
    assert "--calibrate" in err and "nothing" not in err.split(":")[0]


def test_7_internal_error_exits_3_in_one_line_and_debug_shows_the_traceback(monkeypatch):
    import planner.api

    def broken(**_):
        raise ZeroDivisionError("boom")
    monkeypatch.setattr(planner.api, "plan", broken)
    quiet = run(["plan", *JOB])
    assert quiet.exit_code == 3 and quiet.stderr.count("\n") == 1
    assert quiet.stderr.startswith("internal error: ZeroDivisionError: boom; rerun with --debug")
    loud = run(["--debug", "plan", *JOB])
    assert loud.exit_code == 3 and "Traceback" in loud.stderr


# 8. Exports
def test_8_torchtitan_toml_reads_back_for_an_emoji_name(tmp_path):
    config = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_attention_heads": 4,
              "num_hidden_layers": 4, "num_key_value_heads": 2, "vocab_size": 1000}
    source = tmp_path / 'llama 🦙 "q" \\.json'
    source.write_text(json.dumps(config))
    plan = tmp_path / "plan.json"
    planned = run(["plan", "--model", str(source), *JOB[2:], "--runtime", "torchtitan", "--runtime-version", "v0.2.2",
                   "--out", str(plan)])  # the TOML's release: v0.3.0 registers no config of this model
    assert planned.exit_code == 0, planned.output
    launched = run(["launch", str(plan), "--out", str(tmp_path / "job")])
    assert launched.exit_code == 0, launched.output
    toml = tomllib.loads((tmp_path / "job/torchtitan.toml").read_text(encoding="utf-8"))
    name = 'llama 🦙 "q" \\'  # the model's own name (the config file's), not its path
    assert toml["model"]["flavor"] == name and name in toml["job"]["description"]


# 9. The API raises only ValueError subclasses
@pytest.mark.parametrize("make", [
    lambda: Layout(layers_per_chunk=-1), lambda: Layout(layers_per_chunk=(0,)), lambda: Layout(zero_stage=True),
    lambda: Layout(sequence_parallel="yes"), lambda: Layout(hsdp_shard_degree=-1),
    lambda: ModelSpec(**SMALL, head_dim="x"), lambda: ModelSpec(**SMALL, moe=97), lambda: ModelSpec(**{**SMALL, "name": 7}),
    lambda: ModelSpec(**{**SMALL, "hidden_size": 10**30}), lambda: ModelSpec(**SMALL, activation="relu"),
    lambda: MoESpec(num_experts=4, top_k=1, expert_ffn_hidden_size=8, capacity_factor=math.nan),
    lambda: MoESpec(num_experts=4, top_k=1, expert_ffn_hidden_size=8, capacity_factor="x"),
    lambda: TrainingSpec(global_batch_size=8, seq_len=8, lora_targets=5),
    lambda: TrainingSpec(global_batch_size=2**40, seq_len=2),
    lambda: planner.plan(model="tiny-llama", hardware="cpu", gpus=2, global_batch=8, seq_len=128, profile=7),
    lambda: planner.plan(model="tiny-llama", hardware="cpu", gpus=2, global_batch=8, seq_len=128, gpus_per_node="x"),
    lambda: planner.plan(model="tiny-llama", hardware="cpu", gpus=2, global_batch=8, seq_len=128, bogus=1),
    lambda: planner.plan(model="tiny-llama", hardware="cpu", gpus=2, global_batch=8, seq_len=128, launchable="x"),
    lambda: planner.plan(model=7, hardware="cpu", gpus=2, global_batch=8, seq_len=128),
    lambda: planner.evaluate(model="tiny-llama", hardware="cpu", gpus=2, global_batch=8, seq_len=128, layout=None),
    lambda: planner.api.layout_for_batch(8, dp=0),
])
def test_9_api_raises_only_value_errors(make):
    with pytest.raises(ValueError):
        make()


def test_9_plan_accepts_gpus_per_node_none():
    report = planner.plan(model="tiny-llama", hardware="cpu", gpus=2, global_batch=8, seq_len=128, gpus_per_node=None)
    assert report.best is not None


def test_9_node_with_zero_bandwidth_is_refused(tmp_path):
    text = (ROOT / "hardware_specs/data/cpu.toml").read_text().replace("bandwidth_gb_per_s = 2", "bandwidth_gb_per_s = 0")
    path = tmp_path / "hw.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match="bandwidth"):
        load_node(str(path))
