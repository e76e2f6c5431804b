"""The steps of ``gpu_truth.py`` that run autoplan: profile, plan + launch + predict each layout, measure.

Every autoplan call is its CLI in a subprocess (``AUTOPLAN``), and the record keeps each exact
command line. The measuring runs ``gpu_truth_runner`` under torchrun, restarted for the cases
left if the process dies (a crash costs the case that crashed, not the rest).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import gpu_truth_record as rec
from gpu_truth_env import TruthError
from gpu_truth_sweep import Case

AUTOPLAN = [sys.executable, "-c", "import sys; from planner.cli import main; sys.exit(main())"]
"""``autoplan`` without the console script (the repo is on PYTHONPATH, not installed)."""
RUNNER = Path(__file__).resolve().parent / "gpu_truth_runner.py"
GRACE_S = 60.0
"""How long the runner may go on past the deadline (the case in flight finishes) before it is killed."""
Say = Callable[[str], None]


def shown(command: list[str]) -> str:
    """The command as one would type it: ``autoplan ...`` for the CLI, else the argv."""
    if command[: len(AUTOPLAN)] == AUTOPLAN:
        return shlex.join(["autoplan", *command[len(AUTOPLAN):]])
    return shlex.join(command)


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:400] if lines else ""


def git_commit(repo: Path) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


def run_profile(device: str, workdir: Path, env: dict, *, timeout_s: float, say: Say) -> dict:
    """``autoplan profile --quick`` on one device; {"status", "path", "command", "wall_s", "provenance"}."""
    path = workdir / "profile.json"
    command = AUTOPLAN + ["profile", "--device", device, "--nproc", "1", "--quick", "--out", str(path)]
    say(f"profile: {shown(command)} (timeout {timeout_s:.0f} s)")
    began = time.monotonic()
    out = {"command": shown(command)}
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {**out, "status": "error", "error": f"timed out after {timeout_s:.0f} s", "wall_s": timeout_s}
    out["wall_s"] = time.monotonic() - began
    (workdir / "profile.log").write_text(done.stdout + done.stderr, encoding="utf-8")
    if done.returncode != 0 or not path.exists():
        say(f"profile failed ({done.returncode}): {_last_line(done.stderr)}")
        return {**out, "status": "error", "error": _last_line(done.stderr or done.stdout)}
    raw = json.loads(path.read_text(encoding="utf-8"))
    say(f"profile done in {out['wall_s']:.0f} s")
    return {**out, "status": "measured", "path": str(path), "provenance": raw.get("provenance", {}),
            "calibration": raw.get("calibration") or {}}


def given_profile(path: Path, *, say: Say) -> dict:
    """A profile measured before (``--profile``), in ``run_profile``'s form; its command is the one
    its provenance names. Unreadable or not a profile: ``TruthError``."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise TruthError(f"--profile {path}: {err}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("provenance"), dict):
        raise TruthError(f"--profile {path}: not a profile (no provenance); 'autoplan profile' writes one")
    provenance = raw["provenance"]
    say(f"profile: {path} (given; measured by {provenance.get('command', 'an unrecorded command')})")
    return {"command": provenance.get("command", ""), "status": "measured", "path": str(path), "given": True,
            "provenance": provenance, "calibration": raw.get("calibration") or {}}


def _evaluate_args(case: Case, hardware: str, precision: str) -> list[str]:
    mb = str(case.micro_batch_size)
    return ["evaluate", "--model", case.model, "--hardware", hardware, "--gpus", "1", "--gpus-per-node", "1",
            "--global-batch", mb, "--seq-len", str(case.seq_len), "--dp", "1", "--tp", "1", "--pp", "1",
            "--micro-batch", mb, "--recompute", case.recompute, "--runtime", "torch", "--precision", precision]


def _call(command: list[str], env: dict) -> tuple[bool, str]:
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    return done.returncode == 0, done.stdout if done.returncode == 0 else _last_line(done.stderr or done.stdout)


def predict_one(case: Case, common: dict, reserved_bytes: float) -> dict:
    """Plan file, job directory and both predictions of one case; an error entry if any step fails."""
    base = common["workdir"] / case.name
    args = _evaluate_args(case, common["hardware"], common["precision"])
    launch = ["launch", str(base / "plan.json"), "--out", str(base / "job")]
    launch += ["--allow-no-fit"] if case.allow_no_fit else []
    commands = {"plan": AUTOPLAN + args + ["--out", str(base / "plan.json")], "launch": AUTOPLAN + launch,
                "predict_datasheet": AUTOPLAN + args + ["--format", "json"]}
    if common["profile_path"]:
        commands["predict_profile"] = AUTOPLAN + args + ["--profile", common["profile_path"], "--format", "json"]
    row = {"name": case.name, "model": case.model_label, "model_source": case.model, "seq_len": case.seq_len,
           "micro_batch_size": case.micro_batch_size, "recompute": case.recompute,
           "precision": common["precision"], "job_dir": str(base / "job"),
           "commands": {k: shown(v) for k, v in commands.items()}, "predicted": {}}
    base.mkdir(parents=True, exist_ok=True)
    for stage, command in commands.items():
        ok, text = _call(command, common["env"])
        if not ok:
            return {**row, "status": "error", "error": f"{stage}: {text}"}
        if stage == "plan":
            row["model_spec"] = json.loads((base / "plan.json").read_text(encoding="utf-8"))["inputs"]["model_spec"]
        if stage.startswith("predict_"):
            row["predicted"][stage.removeprefix("predict_")] = rec.prediction(json.loads(text), reserved_bytes)
    return {**row, "status": "pending"}


def split_by_device_memory(cases, device_gib: float) -> tuple[list[Case], list[Case]]:
    """(the cases this device can hold, those needing more, ``Case.needs_device_gib``)."""
    return [c for c in cases if c.needs_device_gib <= device_gib], [c for c in cases if c.needs_device_gib > device_gib]


def skipped_row(case: Case, why: str, precision: str) -> dict:
    """The record's entry of a case not measured on this device."""
    return {"name": case.name, "model": case.model_label, "model_source": case.model, "seq_len": case.seq_len,
            "micro_batch_size": case.micro_batch_size, "recompute": case.recompute, "precision": precision,
            "commands": {}, "predicted": {}, "status": "skipped", "error": why}


def predict_all(cases, common: dict, *, reserved_bytes: float, say: Say) -> list[dict]:
    """``predict_one`` for every case, a few at a time (each is a short CPU-bound subprocess)."""
    say(f"plan, launch and predict {len(cases)} layouts")
    with ThreadPoolExecutor(max_workers=4) as pool:
        rows = list(pool.map(lambda c: predict_one(c, common, reserved_bytes), cases))
    for row in rows:
        if row["status"] == "error":
            say(f"{row['name']}: {row['error']}")
    return rows


def _runner_command(cases_path: Path, results_path: Path) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
            str(RUNNER), str(cases_path), str(results_path)]


def _copy_lines(stream, log) -> None:
    """The runner's output into its log, and its own progress lines (``[runner]``) onto stdout."""
    for line in stream:
        log.write(line)
        if line.startswith("[runner]"):
            print(line, end="", flush=True)


def _launch_runner(pending: list[dict], workdir: Path, env: dict, *, attempt: int, steps: int, warmup: int,
                   deadline: float) -> tuple[list[dict], str, int]:
    """One torchrun process over ``pending``; (result lines, its command, exit status)."""
    cases = [{"name": r["name"], "plan_file": f"{r['job_dir']}/plan.json", "log_dir": f"{r['job_dir']}/logs",
              "steps": steps, "warmup": warmup, "world_size": 1} for r in pending]
    cases_path, results_path = workdir / f"cases-{attempt}.json", workdir / f"results-{attempt}.jsonl"
    cases_path.write_text(json.dumps({"deadline_unix_s": deadline, "cases": cases}, indent=1), encoding="utf-8")
    results_path.unlink(missing_ok=True)
    command = _runner_command(cases_path, results_path)
    with open(workdir / f"runner-{attempt}.log", "w", encoding="utf-8") as log:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
                                start_new_session=True)
        copier = threading.Thread(target=_copy_lines, args=(proc.stdout, log), daemon=True)
        copier.start()
        try:
            code = proc.wait(timeout=max(10.0, deadline - time.time() + GRACE_S))
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        copier.join(timeout=5)
    lines = results_path.read_text(encoding="utf-8").splitlines() if results_path.exists() else []
    return [json.loads(line) for line in lines], shown(command), code


def measure_all(rows: list[dict], workdir: Path, env: dict, *, steps: int, warmup: int, deadline: float,
                say: Say) -> dict:
    """Measure every pending row in place (status measured / error / skipped); returns the
    measuring process's environment report."""
    info: dict = {}
    for attempt in range(1, len(rows) + 1):
        pending = [r for r in rows if r["status"] == "pending"]
        if not pending:
            break
        if time.time() > deadline:
            for r in pending:
                r.update(status="skipped", error="time budget spent before it ran")
            break
        say(f"measuring {len(pending)} layouts in one torchrun process (attempt {attempt})")
        results, command, code = _launch_runner(pending, workdir, env, attempt=attempt, steps=steps,
                                                warmup=warmup, deadline=deadline)
        info = next((r["environment"] for r in results if "environment" in r), info)
        _apply(pending, {r["name"]: r for r in results if "name" in r}, command, say)
        left = [r for r in pending if r["status"] == "pending"]
        if left:  # the process died inside left[0]: it is the one to blame
            left[0].update(status="error", error=f"the measuring process exited with status {code} during this "
                           f"layout; log {workdir}/runner-{attempt}.log")
            say(f"{left[0]['name']}: {left[0]['error']}")
    return info


def _apply(pending: list[dict], results: dict[str, dict], command: str, say: Say) -> None:
    for row in pending:
        result = results.get(row["name"])
        if result is None:
            continue
        row["commands"]["measure"] = f"{command}  # case {row['name']}"
        if result["status"] != "measured":
            row.update(status=result["status"], error=result.get("error", ""), error_kind=result.get("error_kind"))
            say(f"{row['name']}: {row['status']}: {row['error'][:120]}")
            continue
        row["measured"] = rec.measurement(result)
        row["errors"] = {src: rec.errors(p, row["measured"]) for src, p in row["predicted"].items()}
        row["status"] = "measured"
        say(f"{row['name']}: step {row['measured']['step_time_s'] * 1e3:.1f} ms; error "
            + ", ".join(f"{s} {e['step_time']:+.0%}" for s, e in row["errors"].items()))


def observations(rows: list[dict], device: str) -> list[str]:
    """What the run shows about the model's assumptions, from the data (item 5 of the issue)."""
    notes = []
    if device == "cpu":
        notes.append("CPU: measured peak is the process max RSS (interpreter, torch and gloo included); "
                     "jobs and profile run with OMP_NUM_THREADS=1, as the 'cpu' preset (one core per process) assumes")
    measured = [r for r in rows if r["status"] == "measured"]
    for source in ("datasheet", "profile"):
        for key in ("step_time", "params", "grads", "optimizer", "activations", "peak_allocated", "peak_reserved",
                    "peak_rss"):
            values = [r["errors"][source][key] for r in measured
                      if source in r["errors"] and r["errors"][source].get(key) is not None]
            if len(values) >= 2 and sorted(map(abs, values))[len(values) // 2] > 0.15:
                lo, hi = min(values), max(values)
                notes.append(f"{source} {key}: predicted/measured - 1 ranges {lo:+.0%} .. {hi:+.0%} over "
                             f"{len(values)} layouts (median |error| above 15%)")
    on = [r["errors"]["datasheet"]["activations"] for r in measured if r["recompute"] != "none"
          and r["errors"].get("datasheet", {}).get("activations") is not None]
    if on:
        notes.append("activations with recomputation on: the model's term includes the working set of the layer "
                     "being recomputed and of the loss backward, which the probe's saved-tensor hooks do not see "
                     f"(errors {min(on):+.0%} .. {max(on):+.0%})")
    return notes
