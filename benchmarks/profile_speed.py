"""How long ``autoplan profile`` takes on this machine, quick and full (prints figures, asserts nothing).

    .venv/bin/python benchmarks/profile_speed.py [--nproc 2] [--device cpu] [--only quick|full]

Each run is the real command (torchrun, 2 gloo processes by default) writing into a temporary
folder; the wall time includes torchrun start-up. The load average is printed alongside: other
work on the machine slows the profile down and spoils its numbers.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_profile(device: str, nproc: int, quick: bool, out: Path) -> tuple[float, int]:
    """Wall seconds and exit status of one ``autoplan profile`` run."""
    exe = shutil.which("autoplan", path=str(Path(sys.executable).parent)) or "autoplan"
    cmd = [exe, "profile", "--device", device, "--nproc", str(nproc), "--out", str(out)] + ["--quick"] * quick
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stderr[-2000:], file=sys.stderr)
    return time.perf_counter() - started, proc.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--only", choices=("quick", "full"), default=None)
    args = parser.parse_args()
    modes = [args.only] if args.only else ["quick", "full"]
    print(f"autoplan profile --device {args.device} --nproc {args.nproc}, {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as tmp:
        for mode in modes:
            load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
            seconds, code = run_profile(args.device, args.nproc, mode == "quick", Path(tmp) / f"{mode}.json")
            status = "ok" if code == 0 else f"FAILED (exit {code})"
            print(f"  {mode:<5}  {seconds:7.1f} s  {status}  (load average before: {load:.2f})", flush=True)


if __name__ == "__main__":
    main()
