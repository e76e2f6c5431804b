"""Run training cases through ``planner.launch.torchjob.case_runner``: in one plain process (``nproc`` 1,
the single-process reference) or in one ``torchrun --standalone`` launch of ``nproc`` processes.

The loss-parity files do not launch their own: each lists its cases in ``launch_cases()`` and
reads them from the session fixture ``case_results`` (tests/conftest.py), which runs the cases
of every collected file together, each distinct case once, in one process per world size. A
launch costs far more on a small machine than the few steps of a tiny model it runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from costmodels.layout import Layout

REPO = Path(__file__).resolve().parent.parent


def run_cases(cases: list[dict], tmp: Path, nproc: int, timeout_s: int = 900) -> dict:
    """{case name: per-step results} of every case that runs at world size ``nproc``."""
    path, out = tmp / f"cases-{nproc}.json", tmp / f"results-{nproc}.json"
    path.write_text(json.dumps(cases), encoding="utf-8")
    harness = ["-m", "planner.launch.torchjob.case_runner", str(path), str(out)]
    launcher = [] if nproc == 1 else ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    proc = subprocess.run([sys.executable, *launcher, *harness], cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=timeout_s)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text(encoding="utf-8"))


def case_key(case: dict) -> str:
    """What a case computes: everything but its name (two files' equal references run once)."""
    return json.dumps({k: v for k, v in case.items() if k != "name"}, sort_keys=True)


def world_size(case: dict) -> int:
    return Layout.from_dict(case["layout"]).world_size


class CaseResults:
    """Per-step results of a set of cases, looked up by what each case computes."""

    def __init__(self, by_key: dict[str, list[dict]]) -> None:
        self._by_key = by_key

    def of(self, cases: list[dict]) -> dict[str, list[dict]]:
        """{case name: per-step results} for ``cases`` (each must have been run)."""
        return {case["name"]: self._by_key[case_key(case)] for case in cases}


def run_all(cases: list[dict], tmp: Path) -> CaseResults:
    """Every distinct case of ``cases`` once: one process per world size among them."""
    distinct: dict[str, dict] = {}
    for case in cases:
        distinct.setdefault(case_key(case), case)
    named = {f"{i}:{case['name']}": key for i, (key, case) in enumerate(distinct.items())}
    runnable = [{**distinct[key], "name": name} for name, key in named.items()]
    results: dict = {}
    for nproc in sorted({world_size(case) for case in runnable}):
        results.update(run_cases(runnable, tmp, nproc))
    return CaseResults({key: results[name] for name, key in named.items()})
