"""Ground truth from a real GPU: measure on one device what the cost model predicts.

    python benchmarks/gpu_truth.py --device cuda --wheels .whl --out-dir OUT     # on the GPU box
    python benchmarks/gpu_truth.py --device cpu --quick --out-dir /tmp/truth      # toy sizes, < 1 min
    python benchmarks/gpu_truth.py --prepare-wheels .whl                           # where pip works

One command, all of it through autoplan's own CLI (``python -c 'from planner.cli import main'``,
so the repo need not be installed): ``autoplan profile --quick`` on the device; for each layout
of the sweep (``gpu_truth_sweep``) ``autoplan evaluate --out`` writes its plan file, ``autoplan
launch`` the job, ``autoplan evaluate --format json`` predicts it from the datasheet (with the
shipped calibration) and from the profile just measured; then one torchrun process
(``gpu_truth_runner``) trains every job with the job's own code (``planner.validate.measure``):
warm-up steps, timed steps (median), one step under the memory probe. One JSON record and a
markdown summary are written atomically to --out-dir, named by device and date.

A layout that fails (an OOM, a refusal) is an error entry; once --budget-s is spent the remaining
layouts are recorded as skipped. Bad input: one ``error:`` line and exit status 2.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The repo root, for the specs it reads in-process (hardware_specs): the GPU box has autoplan uninstalled.
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import gpu_truth_env as env_mod  # noqa: E402
import gpu_truth_jobs as jobs_mod  # noqa: E402
import gpu_truth_record as rec  # noqa: E402
from gpu_truth_sweep import cpu_sweep, gpu_sweep, heldout_sweep, large_sweep  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "benchmarks" / "data" / "gpu"
SWEEPS = {"main": gpu_sweep, "heldout": heldout_sweep, "large": large_sweep}
"""The GPU sweeps by ``--sweep`` name (``gpu_truth_sweep``)."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--quick", action="store_true", help="toy sweep (the CPU sweep; with cuda too)")
    p.add_argument("--hardware", default=None, help="hardware preset (default: from the device name)")
    p.add_argument("--out-dir", type=Path, default=DEFAULT_OUT, help="where the record goes [%(default)s]")
    p.add_argument("--workdir", type=Path, default=None, help="job directories and logs (default: a temp dir)")
    p.add_argument("--wheels", type=Path, default=None, help="install missing packages from the wheels here")
    p.add_argument("--prepare-wheels", type=Path, default=None, metavar="DIR",
                   help="download the wheels the GPU image lacks into DIR (needs pip and the network), then exit")
    p.add_argument("--budget-s", type=float, default=None, help="wall budget; default 420 (cuda), 100 (cpu)")
    p.add_argument("--profile-timeout-s", type=float, default=180.0)
    p.add_argument("--steps", type=int, default=None, help="timed steps per job (default 5; quick 3)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up steps per job (default 3; quick 1)")
    p.add_argument("--no-profile", action="store_true", help="skip the profile (datasheet predictions only)")
    p.add_argument("--profile", type=Path, default=None, metavar="FILE",
                   help="predict from this profile (one 'autoplan profile' wrote on this device) instead of "
                        "measuring one")
    p.add_argument("--only", default=None, help="comma-separated substrings: measure only matching layouts")
    p.add_argument("--sweep", choices=tuple(SWEEPS), default="main",
                   help="on cuda: the 12-job sweep, 7 jobs at shapes it does not measure (heldout), or 6 jobs "
                        "of large layers: Llama-3-70B's at tp 1 and Llama-3-8B whole (large) [%(default)s]")
    args = p.parse_args(argv)
    if args.profile is not None and args.no_profile:
        p.exit(2, "error: --profile and --no-profile exclude each other\n")
    for name in ("steps", "warmup", "budget_s"):
        value = getattr(args, name)
        if value is not None and value < (1 if name != "warmup" else 0):
            p.exit(2, f"error: --{name.replace('_', '-')} must be positive, got {value}\n")
    return args


def say(text: str) -> None:
    print(f"[gpu_truth {time.strftime('%H:%M:%S')}] {text}", flush=True)


def settings(args: argparse.Namespace) -> dict:
    quick = args.quick or args.device == "cpu"
    cases = cpu_sweep() if quick else SWEEPS[args.sweep]()
    if args.only:
        wanted = [w for w in args.only.split(",") if w]
        cases = tuple(c for c in cases if any(w in c.name for w in wanted))
    return {"quick": quick, "cases": cases, "steps": args.steps or (3 if quick else 5),
            "warmup": args.warmup if args.warmup is not None else (1 if quick else 3),
            "budget_s": args.budget_s or (100.0 if args.device == "cpu" else 420.0),
            "precision": "bf16" if args.device == "cuda" else "fp32"}


def _install(args: argparse.Namespace, notes: list[str]) -> list[Path]:
    if args.wheels is None:
        missing = env_mod.missing_modules(env_mod.REQUIRED_WHEELS)
        if missing:
            notes.append(f"not installed: {', '.join(missing)} (only 'autoplan shard' needs them); "
                         "pass --wheels DIR to install them")
        return []
    target = args.wheels.resolve() / f"site-py{sys.version_info.major}{sys.version_info.minor}"
    installed = env_mod.install_wheels(args.wheels, target)
    say(f"wheels: installed {', '.join(installed) or 'nothing (all present)'} into {target}")
    return [target]


def device_facts(args: argparse.Namespace, profile: dict, smi: dict | None) -> tuple[str, str]:
    """(device name, hardware preset): --hardware, else from the profile's or nvidia-smi's device name."""
    name = (profile.get("provenance") or {}).get("device_name") or (smi or {}).get("name") or ""
    if args.device == "cpu":
        return name or platform.processor() or "cpu", args.hardware or "cpu"
    if args.hardware:
        return name or "unknown", args.hardware
    if not name:
        raise env_mod.TruthError("cannot tell the device (no profile, no nvidia-smi); pass --hardware NAME")
    return name, env_mod.hardware_preset(name)


def _runtime_reserved_bytes(hardware: str) -> float:
    from hardware_specs import load_node

    return load_node(hardware).hardware.runtime_reserved_bytes


def _device_gib(hardware: str) -> float:
    from hardware_specs import load_node

    return load_node(hardware).hardware.memory_bytes / 2**30


def _out_paths(out_dir: Path, device_slug: str) -> tuple[Path, Path]:
    day = datetime.date.today().isoformat()
    for n in range(1, 100):
        stem = f"{device_slug}-{day}" + (f"-{n}" if n > 1 else "")
        if not (out_dir / f"{stem}.json").exists():
            return out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    raise env_mod.TruthError(f"--out-dir {out_dir}: 99 records of {device_slug} today already")


def run(args: argparse.Namespace) -> int:
    if args.prepare_wheels is not None:
        for wheel in env_mod.prepare_wheels(args.prepare_wheels):
            print(wheel)
        return 0
    started, notes = time.monotonic(), []
    opts = settings(args)
    deadline = time.time() + opts["budget_s"]
    env = env_mod.child_env(REPO, _install(args, notes), args.device)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="gpu-truth-"))
    workdir.mkdir(parents=True, exist_ok=True)
    say(f"{len(opts['cases'])} layouts on {args.device}; budget {opts['budget_s']:.0f} s; workdir {workdir}")
    smi = env_mod.nvidia_smi() if args.device == "cuda" else None
    if smi and smi.get("name"):  # an unknown device fails here, before the profile spends GPU time
        device_facts(args, {}, smi)
    if args.no_profile:
        profile = {"status": "skipped (--no-profile)"}
    elif args.profile is not None:
        profile = jobs_mod.given_profile(args.profile.resolve(), say=say)
    else:
        profile = jobs_mod.run_profile(args.device, workdir, env,
                                       timeout_s=min(args.profile_timeout_s, max(1.0, deadline - time.time())), say=say)
    name, hardware = device_facts(args, profile, smi)
    say(f"device {name!r} -> hardware preset {hardware}")
    common = {"hardware": hardware, "precision": opts["precision"], "workdir": workdir, "env": env,
              "profile_path": profile.get("path")}
    cases, too_large = jobs_mod.split_by_device_memory(opts["cases"], _device_gib(hardware))
    layouts = jobs_mod.predict_all(cases, common, reserved_bytes=_runtime_reserved_bytes(hardware), say=say)
    layouts += [jobs_mod.skipped_row(case, f"needs a device of {case.needs_device_gib:g} GiB; {hardware} has "
                                           f"{_device_gib(hardware):g}", opts["precision"]) for case in too_large]
    env_info = jobs_mod.measure_all(layouts, workdir, env, steps=opts["steps"], warmup=opts["warmup"],
                                    deadline=deadline, say=say)
    if smi is not None:  # clocks, power and temperature after the sweep, beside those before it
        smi = {**smi, "after": env_mod.nvidia_smi()}
    record = assemble(args, opts, layouts, profile, smi, env_info, name, hardware, notes, started)
    json_path, md_path = _out_paths(args.out_dir, hardware.split("-")[0])
    rec.write_atomic(json_path, rec.record_json(record))
    rec.write_atomic(md_path, rec.markdown(record))
    say(f"wrote {json_path} and {md_path.name} ({record['summary']['num_measured']}/{len(layouts)} measured, "
        f"{record['wall_s']:.0f} s)")
    return 0


def assemble(args, opts, layouts, profile, smi, env_info, name, hardware, notes, started) -> dict:
    """The record: machine, software, settings, every layout, summary, notes."""
    clocks = {k: v for k, v in (smi or {}).items() if k.startswith(("clocks", "power", "temperature", "pstate"))}
    software = {"python_version": platform.python_version(), "torch_version": env_info.get("torch_version"),
                "cuda_version": env_info.get("cuda_version"), "cudnn_version": env_info.get("cudnn_version"),
                "autoplan_commit": jobs_mod.git_commit(REPO)}
    device = {"type": args.device, "name": env_info.get("device_name") or name, "hardware_preset": hardware,
              "capability": env_info.get("capability"), "memory_bytes": env_info.get("memory_bytes"),
              "num_sms": env_info.get("num_sms"), "driver_version": (smi or {}).get("driver_version"),
              "clocks": clocks or None, "nvidia_smi": smi}
    notes = notes + jobs_mod.observations(layouts, args.device)
    record = {"schema_version": rec.SCHEMA_VERSION, "kind": "autoplan gpu truth",
              "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": shlex.join([sys.executable, *sys.argv]), "cwd": os.getcwd(), "host": platform.node(),
              "device": device, "software": software, "profile": profile,
              "settings": {k: v for k, v in opts.items() if k != "cases"}, "layouts": layouts,
              "summary": rec.summarise(layouts), "notes": notes, "wall_s": time.monotonic() - started}
    assert rec.finite(record), "a non-finite number reached the record"
    return record


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except env_mod.TruthError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
