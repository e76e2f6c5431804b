"""Where the generated job's step time goes on one device: a profiler trace plus in-process A/B timings.

    PYTHONPATH=$PWD python3 benchmarks/gpu_step_trace.py --device cuda --wheels .whl --out-dir OUT   # ~1-2 min on an H100
    PYTHONPATH=$PWD python3 benchmarks/gpu_step_trace.py --device cpu --quick --out-dir /tmp/trace    # toy model, < 1 min

The 2026-11-26 H100 sweep (``benchmarks/data/gpu/superseded/h100-2026-11-26-loop-adamw.md``) measured small layouts
50-60 ms per step slower than predicted. For a few of its layouts (``gpu_truth_sweep``) this plans
the job with ``autoplan evaluate --out`` (its prediction with ``--format json``), builds it in
this process exactly as ``planner.validate.measure.run_case`` does (``setup_job`` under a
one-rank process group), and then

- times ``train_step`` (the measured step: synchronize, step, synchronize) under variants, one
  process, same weights: the job as it is now (fused AdamW), the per-tensor AdamW loop
  (``foreach=False``) the sweep ran, foreach AdamW, no gradient clipping, forward + backward
  only, and one step under the memory probe;
- traces two steps under ``torch.profiler`` (CPU + CUDA activities), the step split into
  ``record_function`` phases (``gpu_step_trace_summary.PHASES``), for the job now and for the
  per-tensor loop, and reduces each trace to wall and device-busy time per step, kernel count,
  time per phase, device idle gaps over 1 ms with the CPU op running, top kernels and CPU ops,
  the SDPA backend, and the TF32 settings.

Writes ``step-trace-<device>.json`` and ``.md`` into --out-dir, and the first layout's two
Chrome traces gzip'd when under 10 MB (4 files at most).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import gpu_step_trace_report as report  # noqa: E402
import gpu_truth_env as env_mod  # noqa: E402
from gpu_truth_jobs import AUTOPLAN, _evaluate_args  # noqa: E402
from gpu_truth_sweep import Case, cpu_sweep, gpu_sweep  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
GPU_CASES = ("qwen2.5-0.5b-s2048-mb1-none", "llama3.2-1b-s2048-mb1-none", "llama3-8b-4l-s2048-mb1-none")
"""Three layouts of the sweep with the largest gaps (64, 49 and 56 ms), 24, 16 and 4 layers."""
CPU_CASES = ("tiny-llama-s128-mb1-none",)
MAX_TRACE_BYTES = 10 * 2**20


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), required=True)
    p.add_argument("--quick", action="store_true", help="CPU toy layout (implied by --device cpu)")
    p.add_argument("--out-dir", type=Path, required=True)
    p.add_argument("--wheels", type=Path, default=None, help="install missing packages from the wheels here")
    p.add_argument("--hardware", default=None, help="hardware preset (default: from the device name)")
    p.add_argument("--only", default=None, help="comma-separated substrings of the layouts to run")
    p.add_argument("--steps", type=int, default=3, help="timed steps per variant (median)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before each variant's timed ones")
    return p.parse_args(argv)


def say(text: str) -> None:
    print(f"[step_trace {time.strftime('%H:%M:%S')}] {text}", flush=True)


def cases(args: argparse.Namespace) -> list[Case]:
    names = CPU_CASES if args.device == "cpu" else GPU_CASES
    chosen = [c for c in (cpu_sweep() if args.device == "cpu" else gpu_sweep()) if c.name in names]
    if args.only:
        chosen = [c for c in chosen if any(w in c.name for w in args.only.split(",") if w)]
    return chosen


def plan_case(case: Case, hardware: str, precision: str, workdir: Path, env: dict) -> tuple[Path, dict]:
    """(plan file, predicted {"step_time_s", "time_s"}) from ``autoplan evaluate``."""
    args = _evaluate_args(case, hardware, precision)
    plan = workdir / f"{case.name}.json"
    for extra in (["--out", str(plan)], ["--format", "json"]):
        done = subprocess.run(AUTOPLAN + args + extra, capture_output=True, text=True, env=env, timeout=300)
        if done.returncode != 0:
            raise env_mod.TruthError(f"autoplan evaluate {case.name}: {(done.stderr or done.stdout).strip()[-400:]}")
    predicted = json.loads(done.stdout)["predicted"]
    return plan, {"step_time_s": predicted["step_time_s"], "time_s": predicted["time_s"]}


def _one_rank_group() -> None:
    """A one-rank process group, as under ``torchrun --nproc-per-node 1`` (the sweep's launch)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1",
                       "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}.items():
        os.environ.setdefault(key, value)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    try:
        extra = []
        if args.wheels is not None:
            extra = [args.wheels.resolve() / f"site-py{sys.version_info.major}{sys.version_info.minor}"]
            env_mod.install_wheels(args.wheels, extra[0])
        env = env_mod.child_env(REPO, extra, args.device)
        if args.device == "cpu":
            os.environ["OMP_NUM_THREADS"] = "1"
        _one_rank_group()
        import gpu_step_trace_run as run_mod  # torch from here on

        device, name = run_mod.start(args.device)
        hardware = args.hardware or ("cpu" if args.device == "cpu" else env_mod.hardware_preset(name))
        precision = "fp32" if args.device == "cpu" else "bf16"
        workdir = Path(tempfile.mkdtemp(prefix="step-trace-"))
        args.out_dir.mkdir(parents=True, exist_ok=True)
        rows = []
        for index, case in enumerate(cases(args)):
            plan, predicted = plan_case(case, hardware, precision, workdir, env)
            say(f"{case.name}: planned; predicted step {1e3 * (predicted['step_time_s'] or 0):.1f} ms")
            traces = args.out_dir if index == 0 else None
            row = run_mod.run_case(plan, device, steps=args.steps, warmup=args.warmup, trace_dir=traces, say=say)
            rows.append({"name": case.name, "predicted": predicted, **row})
            stem = _write(args, rows, name, hardware, precision, run_mod.settings(), started)
            _shrink_traces(args.out_dir)
        shutil.rmtree(workdir, ignore_errors=True)
        run_mod.stop()
    except env_mod.TruthError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    say(f"wrote {stem}.json and .md in {time.monotonic() - started:.0f} s")
    return 0


def _write(args, rows: list, name: str, hardware: str, precision: str, torch_settings: dict, started: float) -> Path:
    """The record so far (rewritten after each layout: a crash keeps the layouts done)."""
    record = {"schema_version": 1, "device": args.device, "device_name": name, "hardware": hardware,
              "precision": precision, "settings": torch_settings, "layouts": rows,
              "command": " ".join(sys.argv), "wall_s": time.monotonic() - started}
    stem = args.out_dir / f"step-trace-{args.device}"
    stem.with_suffix(".json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    stem.with_suffix(".md").write_text(report.markdown(record), encoding="utf-8")
    return stem


def _shrink_traces(out_dir: Path) -> None:
    """gzip the Chrome traces; drop any still over ``MAX_TRACE_BYTES``."""
    for path in sorted(out_dir.glob("trace-*.json")):
        packed = path.with_suffix(".json.gz")
        with open(path, "rb") as src, gzip.open(packed, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst)
        path.unlink()
        if packed.stat().st_size > MAX_TRACE_BYTES:
            packed.unlink()


if __name__ == "__main__":
    sys.exit(main())
