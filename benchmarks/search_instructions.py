"""Search cost in instructions: what one warm ``planner.plan`` of ``benchmarks/search_speed.py``'s jobs
executes under callgrind (valgrind), a count that other jobs on the machine do not move.

Wall and CPU times on a shared machine move by 20% from run to run, more than most single changes to
the search save; the instruction count of the same code on the same input moves by well under 0.1%.
So two versions of the search compare on it where timing cannot tell them apart. It counts work, not
time: it does not see cache misses, and Python's allocator and dict sizes make it a proxy, not a clock.

The job is planned once outside the count (imports, presets, file reads), then once inside it:
valgrind counts only what runs inside ``functools.reduce``, which nothing in ``planner`` calls.
A run takes 2-4 minutes per job (valgrind runs Python about 50 times slower).

Run: ``.venv/bin/python benchmarks/search_instructions.py [--jobs 70b,1t,405b]`` (needs ``valgrind``).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOBS = {"70b": "API_CALL", "1t": "CASES['gpt-1t on 3072 x a100-sxm-80gb']",
        "405b": "CASES['llama3-405b on 16384 x h100-sxm-80gb']"}
"""Names of ``search_speed``'s reference jobs, each planned under the default runtime. Its no-fit
request is not among them: the search for a fitting GPU count stops at a wall-clock budget
(``planner.search.infeasible.NO_FIT_BUDGET_S``), which callgrind's slowdown reaches, so its count
would depend on the machine's speed."""

_INNER = """
import functools, sys
sys.path.insert(0, {root!r})
import planner
from benchmarks.search_speed import API_CALL, CASES
job = dict({job}, runtime="megatron")
planner.plan(**job)
functools.reduce(lambda _, __: planner.plan(**job), [0], None)
"""


def instructions(job: str) -> int:
    """Instructions callgrind counts in one warm ``planner.plan`` of ``job`` (a key of ``JOBS``)."""
    with tempfile.TemporaryDirectory() as scratch:
        out = subprocess.run(["valgrind", "--tool=callgrind", "--collect-atstart=no", "--toggle-collect=functools_reduce",
                              f"--callgrind-out-file={scratch}/callgrind.out", sys.executable, "-c",
                              _INNER.format(root=str(ROOT), job=JOBS[job])],
                             capture_output=True, text=True, cwd=ROOT)
    found = re.search(r"Collected : (\d+)", out.stderr)
    if out.returncode != 0 or found is None:
        raise SystemExit(f"callgrind failed on {job}: {out.stderr.strip().splitlines()[-1:]}")
    return int(found.group(1))


def _refuse(message: str) -> None:
    """Bad input or a missing tool: one line on stderr, exit 2."""
    print(message, file=sys.stderr)
    raise SystemExit(2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", default="70b,1t,405b", help=f"comma-separated, of {', '.join(JOBS)}")
    args = parser.parse_args()
    jobs = args.jobs.split(",")
    unknown = [job for job in jobs if job not in JOBS]
    if unknown:
        _refuse(f"--jobs: unknown {', '.join(unknown)}; choose from {', '.join(JOBS)}")
    if shutil.which("valgrind") is None:
        _refuse("valgrind is not installed; install it (apt install valgrind) to count instructions")
    for job in jobs:
        print(f"{job}: {instructions(job) / 1e9:.3f}e9 instructions in one warm planner.plan", flush=True)


if __name__ == "__main__":
    main()
