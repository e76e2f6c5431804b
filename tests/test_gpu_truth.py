"""benchmarks/gpu_truth.py (issue #29) and benchmarks/gpu_records.py: the sweep covers what the issue
asks, every GPU layout is one ``autoplan launch`` accepts and fits an 80 GB device, the CPU quick run
writes a complete record (torchrun), and kept records read back as rows of their own family."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_records  # noqa: E402
import gpu_truth_env  # noqa: E402
import gpu_truth_jobs  # noqa: E402
import gpu_truth_record as rec  # noqa: E402
from gpu_truth_sweep import cpu_sweep, gpu_sweep, heldout_sweep, large_sweep  # noqa: E402

GIB = 2**30


def _env() -> dict[str, str]:
    return gpu_truth_env.child_env(ROOT, [], "cpu")


@pytest.fixture
def in_process(monkeypatch):
    """``gpu_truth_jobs._call`` through click's CliRunner in this process: the prediction tests check
    what each ``autoplan`` command of a layout says, not the interpreter it runs in (the quick run,
    ``test_cpu_quick_run_writes_a_complete_record``, runs them as subprocesses), and a subprocess
    costs about 0.5 s of CPU in imports alone. CliRunner swaps ``sys.stdout``: one command at a time."""
    import threading

    from click.testing import CliRunner

    from planner.cli import main

    one_at_a_time = threading.Lock()

    def call(command: list[str], env: dict) -> tuple[bool, str]:
        assert command[:len(gpu_truth_jobs.AUTOPLAN)] == gpu_truth_jobs.AUTOPLAN, command
        with one_at_a_time:
            result = CliRunner().invoke(main, command[len(gpu_truth_jobs.AUTOPLAN):])
        ok = result.exit_code == 0
        return ok, result.stdout if ok else gpu_truth_jobs._last_line(result.stderr or result.stdout)

    monkeypatch.setattr(gpu_truth_jobs, "_call", call)


def test_gpu_sweep_covers_the_issue():
    cases = gpu_sweep()
    assert len(cases) >= 8 and len({c.name for c in cases}) == len(cases)
    assert len({c.model for c in cases}) == 3
    assert {c.micro_batch_size for c in cases} == {1, 2, 4}
    assert {c.recompute for c in cases} == {"none", "selective", "full"}
    assert {c.seq_len for c in cases} == {2048, 8192}
    assert len(cpu_sweep()) >= 8 and {c.recompute for c in cpu_sweep()} == {"none", "selective", "full"}


def test_heldout_sweep_measures_shapes_the_gpu_sweep_does_not():
    shape = lambda c: (c.model, c.seq_len, c.micro_batch_size)  # noqa: E731
    held = heldout_sweep()
    assert len(held) >= 6 and not {shape(c) for c in held} & {shape(c) for c in gpu_sweep()}
    assert {c.model for c in held} == {c.model for c in gpu_sweep()}


def test_fit_rows_are_the_published_runs_and_each_records_layouts(tmp_path):
    from published import DATA

    from planner.published import load_rows

    assert gpu_records.fit_rows(DATA, tmp_path / "absent") == load_rows(DATA)
    kept = [row for path, record in gpu_records.load_records() for row in gpu_records.record_rows(record, path)]
    rows = gpu_records.fit_rows(DATA)
    assert rows[-len(kept):] == kept and len(rows) == len(load_rows(DATA)) + len(kept)
    assert {row["source_family"] for row in kept} == {"gpu_truth"}


@pytest.mark.parametrize(("name", "preset"), [
    ("NVIDIA H100 80GB HBM3", "h100-sxm-80gb"), ("NVIDIA H100 PCIe", "h100-pcie-80gb"),
    ("NVIDIA H200", "h200-sxm-141gb"), ("NVIDIA A100-SXM4-40GB", "a100-sxm-40gb"),
    ("NVIDIA A100-SXM4-80GB", "a100-sxm-80gb"), ("NVIDIA B200", "b200"), ("NVIDIA GB200", "gb200-nvl72")])
def test_device_name_to_preset(name, preset):
    assert gpu_truth_env.hardware_preset(name) == preset


@pytest.mark.parametrize("name", ["NVIDIA H100 NVL", "NVIDIA A100 80GB PCIe", "Some New GPU"])
def test_device_without_a_preset_asks_for_hardware(name):
    with pytest.raises(gpu_truth_env.TruthError, match="--hardware"):
        gpu_truth_env.hardware_preset(name)


def test_every_gpu_layout_is_launched_and_fits_an_h100(tmp_path, in_process):
    """plan + launch + datasheet prediction of both GPU sweeps (no GPU needed): nothing the
    GPU run will meet is refused, and each predicted peak leaves room on an 80 GB device."""
    common = {"hardware": "h100-sxm-80gb", "precision": "bf16", "workdir": tmp_path, "env": _env(),
              "profile_path": None}
    rows = gpu_truth_jobs.predict_all(gpu_sweep() + heldout_sweep(), common, reserved_bytes=GIB, say=lambda _: None)
    assert [r.get("error") for r in rows] == [None] * len(rows)
    for row in rows:
        assert (Path(row["job_dir"]) / "train.py").is_file()
        predicted = row["predicted"]["datasheet"]
        assert predicted["fits"] and predicted["peak_memory_bytes"] < 60 * GIB, row["name"]
        assert row["commands"]["plan"].startswith("autoplan evaluate --model ")


def _fake_result(step_s=0.1, peak=4 * GIB, reserved=5 * GIB) -> dict:
    comps = {"params": GIB, "grads": GIB, "optimizer": 2 * GIB, "activations": GIB, "states": 4 * GIB,
             "states_peak": 4 * GIB, "total": 5 * GIB}
    return {"name": "x", "status": "measured", "wall_s": 2.0, "step_time_s": [step_s, step_s * 1.1, step_s * 0.9],
            "tokens_per_step": 2048, "ranks": [{"rank": 0, "pp_rank": 0, **comps, "rss_bytes": 1, "peak_bytes": peak,
                                                "memory_kind": "cuda_max_allocated"}],
            "max_memory_allocated_bytes": peak, "max_memory_reserved_bytes": reserved}


def _fake_prediction() -> dict:
    evaluate = {"predicted": {"step_time_s": 0.12, "time_s": {"compute": 0.1, "optimizer": 0.02},
                              "memory_gib": {"params": 1.0, "grads": 1.0, "optimizer": 2.0, "activations": 1.5,
                                             "buffers": 0.0, "overhead": 1.2},
                              "peak_memory_gib": 6.7, "fits": True, "mfu": 0.4, "sources": {}, "tokens_per_s": 1.0}}
    return rec.prediction(evaluate, runtime_reserved_bytes=GIB)


def test_errors_are_predicted_over_measured_minus_one():
    measured = rec.measurement(_fake_result())
    errors = rec.errors(_fake_prediction(), measured)
    assert errors["step_time"] == pytest.approx(0.12 / 0.1 - 1)
    assert errors["params"] == pytest.approx(0.0) and errors["activations"] == pytest.approx(0.5)
    assert errors["peak_allocated"] == pytest.approx(5.5 / 4 - 1)  # tensor terms 1+1+2+1.5 GiB
    assert errors["peak_reserved"] == pytest.approx(5.7 / 5 - 1)   # 6.7 GiB less the 1 GiB reserve


def test_records_read_back_as_their_own_family(tmp_path):
    layout = {"name": "m-s2048-mb1-none", "model": "m", "status": "measured", "seq_len": 2048, "micro_batch_size": 1,
              "recompute": "none", "precision": "bf16", "commands": {"measure": "torchrun ..."},
              "model_spec": None, "measured": rec.measurement(_fake_result()), "errors": {}}
    from costmodels.model_spec import model_to_dict
    from costmodels.presets import load_model

    layout["model_spec"] = model_to_dict(load_model("llama3-8b"))
    layout["errors"] = {"datasheet": rec.errors(_fake_prediction(), layout["measured"])}
    record = {"kind": gpu_records.KIND, "schema_version": 1, "created": "2026-11-26T00:00:00+00:00", "host": "h",
              "device": {"name": "NVIDIA H100 80GB HBM3", "hardware_preset": "h100-sxm-80gb", "type": "cuda"},
              "software": {"autoplan_commit": None}, "layouts": [layout, {"name": "y", "status": "error"}],
              "summary": rec.summarise([layout])}
    (tmp_path / "h100-2026-11-26.json").write_text(json.dumps(record), encoding="utf-8")
    (tmp_path / "other.json").write_text("[]", encoding="utf-8")
    found = gpu_records.load_records(tmp_path)
    assert [p.name for p, _ in found] == ["h100-2026-11-26.json"]
    rows = gpu_records.record_rows(found[0][1], found[0][0])
    assert len(rows) == 1 and rows[0]["source_family"] == "gpu_truth"
    from planner.published.runs import map_row
    from hardware_specs import load_node

    run = map_row(rows[0], load_node)
    assert run.runtime == "torch" and run.model.num_layers == 32 and run.layout.micro_batch_size == 1
    assert run.measured_tokens_per_s_per_gpu == pytest.approx(2048 / 0.1)
    assert "h100-2026-11-26.json" in gpu_records.error_lines(found)[0]


def test_no_records_is_said_not_crashed(tmp_path):
    assert gpu_records.load_records(tmp_path / "absent") == []
    assert "no GPU truth records" in gpu_records.error_lines([])[0]
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu_records.py"), "--dir", str(tmp_path),
                           "--no-published"], capture_output=True, text=True, env=_env())
    assert done.returncode == 0 and "no GPU truth records" in done.stdout


@pytest.mark.parametrize("argv", [["--steps", "0"], ["--wheels", "/nonexistent/wheels", "--device", "cpu"]])
def test_bad_input_is_one_line_and_exit_2(argv, tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu_truth.py"), *argv, "--out-dir", str(tmp_path)],
                          capture_output=True, text=True, env=_env())
    assert done.returncode == 2 and done.stderr.startswith("error: ") and len(done.stderr.splitlines()) == 1


def test_wheels_install_by_unpacking_when_pip_cannot(tmp_path, monkeypatch):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "fakepkg_gt-1.0-py3-none-any.whl", "w") as archive:
        archive.writestr("fakepkg_gt/__init__.py", "VALUE = 7\n")
    monkeypatch.setattr(gpu_truth_env, "REQUIRED_WHEELS", {"fakepkg_gt": "fakepkg_gt==1.0"})
    monkeypatch.setattr(gpu_truth_env, "OPTIONAL_WHEELS", {})
    monkeypatch.setattr(gpu_truth_env, "_pip_install", lambda files, target: False)
    monkeypatch.setattr(sys, "path", list(sys.path))
    installed = gpu_truth_env.install_wheels(wheels, tmp_path / "site")
    assert installed == ["fakepkg_gt-1.0-py3-none-any.whl"]
    import fakepkg_gt

    assert fakepkg_gt.VALUE == 7


@pytest.mark.torchrun
def test_cpu_quick_run_writes_a_complete_record(tmp_path, quick_profile):
    """The quick run predicts from the session's quick profile (``--profile``; measuring one is
    ``run_profile``'s, tested below, and the profile itself tests/test_profile_run.py's)."""
    proc, profile = quick_profile
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "out"
    # two of the CPU sweep's eight jobs (two models, selective and full recomputation): the record is
    # whole with any number of layouts, and each job costs a launch
    only = ("tiny-llama-s256-mb2-selective", "tiny-qwen-s256-mb4-full")
    command = [sys.executable, str(ROOT / "benchmarks/gpu_truth.py"), "--device", "cpu", "--quick",
               "--only", ",".join(only), "--out-dir", str(out), "--workdir", str(tmp_path / "work"),
               "--budget-s", "900", "--profile", str(profile)]
    done = subprocess.run(command, capture_output=True, text=True, env=_env(), timeout=1200)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    [path] = out.glob("*.json")
    record = json.loads(path.read_text(encoding="utf-8"))
    assert path.with_suffix(".md").is_file()
    for key in ("device", "software", "profile", "settings", "layouts", "summary", "notes", "command", "created"):
        assert key in record, key
    assert record["profile"]["status"] == "measured" and record["software"]["torch_version"]
    assert record["profile"]["path"] == str(profile) and record["profile"]["command"].startswith("autoplan profile")
    assert [(row["name"], row["status"]) for row in record["layouts"]] == [(name, "measured") for name in only]
    for row in record["layouts"]:
        assert set(row["predicted"]) == {"datasheet", "profile"}
        for source, predicted in row["predicted"].items():
            assert {"params", "grads", "optimizer", "activations"} <= set(predicted["memory_bytes"])
            assert {"compute", "optimizer"} <= set(predicted["time_s"])
            errors = row["errors"][source]
            for key in ("step_time", "params", "grads", "optimizer", "activations", "peak_rss"):
                assert errors[key] is not None and math.isfinite(errors[key]), (row["name"], source, key)
        assert set(row["commands"]) == {"plan", "launch", "predict_datasheet", "predict_profile", "measure"}
        assert len(row["measured"]["step_times_s"]) == record["settings"]["steps"]
        # the probe's exact tensor bytes: fp32 params, grads and AdamW's two moments as the model counts them
        assert row["errors"]["datasheet"]["params"] == pytest.approx(0, abs=1e-4)
        assert row["errors"]["datasheet"]["optimizer"] == pytest.approx(0, abs=1e-4)
    rows = gpu_records.record_rows(record, path)
    assert len(rows) == len(only) and all(r["extra"]["model_spec"] for r in rows)


_FAKE_PROFILER = """
import json, sys
out = sys.argv[sys.argv.index("--out") + 1]
if "--fail" in sys.argv:
    sys.exit("error: no device")
json.dump({"provenance": {"command": "autoplan " + " ".join(sys.argv[1:]), "device_name": "fake"},
           "calibration": {"gemm": 0.5}}, open(out, "w"))
"""


@pytest.mark.parametrize("device", ["cpu", "--fail"])
def test_run_profile_runs_the_quick_profile_and_reads_what_it_wrote(tmp_path, monkeypatch, device):
    """``run_profile`` runs ``autoplan profile --device D --nproc 1 --quick --out WORKDIR/profile.json``
    (a stand-in here that writes what the profiler would) and returns its file, provenance and
    calibration; a failed profile is an error entry naming its last line, and its log is kept."""
    monkeypatch.setattr(gpu_truth_jobs, "AUTOPLAN", [sys.executable, "-c", _FAKE_PROFILER])
    got = gpu_truth_jobs.run_profile(device, tmp_path, _env(), timeout_s=60, say=lambda _: None)
    assert (tmp_path / "profile.log").is_file()
    if device == "--fail":
        assert got["status"] == "error" and got["error"] == "error: no device"
        return
    assert got["status"] == "measured" and got["path"] == str(tmp_path / "profile.json")
    assert got["provenance"]["command"] == f"autoplan profile --device cpu --nproc 1 --quick --out {got['path']}"
    assert got["calibration"] == {"gemm": 0.5} and got["wall_s"] > 0


@pytest.mark.parametrize("text, needle", [(None, "No such file"), ("[]", "not a profile"), ("{", "Expecting")])
def test_a_given_profile_that_cannot_be_read_is_one_line_and_exit_2(tmp_path, text, needle):
    profile = tmp_path / "profile.json"
    if text is not None:
        profile.write_text(text)
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu_truth.py"), "--device", "cpu", "--no-profile",
                           "--profile", str(profile), "--out-dir", str(tmp_path)], capture_output=True, text=True,
                          env=_env())
    assert done.returncode == 2 and "exclude each other" in done.stderr
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu_truth.py"), "--device", "cpu", "--profile",
                           str(profile), "--out-dir", str(tmp_path), "--only", "nothing-matches"],
                          capture_output=True, text=True, env=_env())
    assert done.returncode == 2 and done.stderr.startswith("error: --profile ") and needle in done.stderr
    assert len(done.stderr.splitlines()) == 1


def test_large_sweep_holds_70b_layers_at_tp_1_and_an_8b_whole_model(tmp_path, in_process):
    """Issue #37, item 3: Llama-3-70B's layer at tp 1 (2 layers, a 32k vocabulary) in five shapes,
    each launched and predicted to fit an 80 GB device; Llama-3-8B whole, which needs an H200's
    memory, is skipped on an H100 and launched past the fit rule on an H200."""
    cases = large_sweep()
    assert {c.recompute for c in cases} == {"none", "selective", "full"}
    from costmodels.presets import load_model

    l70 = [c for c in cases if c.model.endswith("llama3-70b-2l-v32k.json")]
    spec = load_model(l70[0].model)
    assert (spec.hidden_size, spec.ffn_hidden_size, spec.num_layers, spec.vocab_size) == (8192, 28672, 2, 32000)
    fits, too_large = gpu_truth_jobs.split_by_device_memory(cases, 80.0)
    assert [c.model for c in too_large] == ["llama3-8b"] and len(fits) == 5
    common = {"hardware": "h100-sxm-80gb", "precision": "bf16", "workdir": tmp_path / "h100", "env": _env(),
              "profile_path": None}
    rows = gpu_truth_jobs.predict_all(fits, common, reserved_bytes=GIB, say=lambda _: None)
    assert [r.get("error") for r in rows] == [None] * len(rows)
    for row in rows:
        assert row["predicted"]["datasheet"]["fits"] and (Path(row["job_dir"]) / "train.py").is_file(), row["name"]
    h200 = dict(common, hardware="h200-sxm-141gb", workdir=tmp_path / "h200")
    whole = gpu_truth_jobs.predict_all(too_large, h200, reserved_bytes=GIB, say=lambda _: None)
    assert whole[0].get("error") is None and "--allow-no-fit" in whole[0]["commands"]["launch"]
    skipped = gpu_truth_jobs.skipped_row(too_large[0], "needs 130 GiB", "bf16")
    assert skipped["status"] == "skipped" and rec.summarise([skipped])["num_skipped"] == 1
