"""Session fixtures shared by several test files."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from case_launch import CaseResults, run_all

# One intra-op thread per test process and per child it starts (launched jobs set their own): the two
# xdist workers, their subprocesses and 4-process launches already oversubscribe two cores, and
# torch's OpenMP threads spin-wait at each barrier on a core another process holds, which multiplied
# the CPU time of in-process training steps up to 40-fold (tests/test_job_optimizer.py: 14 s of CPU
# in the suite, 0.35 s alone). Set before any test module imports torch.
os.environ.setdefault("OMP_NUM_THREADS", "1")
if "torch" in sys.modules:
    sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(scope="session")
def case_results(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> CaseResults:
    """The training cases of every collected test module that uses this fixture (its
    ``launch_cases()``), run together: one plain process for the single-process references and
    one torchrun launch per world size, instead of one each per file."""
    modules = {item.module for item in request.session.items
               if "case_results" in getattr(item, "fixturenames", ()) and getattr(item, "module", None)}
    cases = [case for module in sorted(modules, key=lambda m: m.__name__) for case in module.launch_cases()]
    return run_all(cases, tmp_path_factory.mktemp("cases"))


@pytest.fixture(scope="session")
def quick_profile(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    """(the finished command, its output file) of one ``autoplan profile --device cpu --nproc 2 --quick``
    (about a minute of CPU, most of it bf16 GEMMs on a CPU without native bf16), read by
    tests/test_profile_run.py and given to the quick GPU-truth run (tests/test_gpu_truth.py)."""
    out = tmp_path_factory.mktemp("profile") / "quick.json"
    exe = shutil.which("autoplan", path=str(Path(sys.executable).parent)) or "autoplan"
    proc = subprocess.run([exe, "profile", "--device", "cpu", "--nproc", "2", "--out", str(out), "--quick"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "120"})
    return proc, out


SHARED_FIXTURES = ("case_results", "quick_profile")
"""Session fixtures of this file that several modules' tests share: each keeps its tests on one worker."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tiers and placement. Runs before pytest-xdist's own hook, which reads the ``xdist_group``
    markers set here into the node ids it distributes by (after it, they would be ignored and each
    worker would run the shared launches again).

    - A multi-process launch (``torchrun``) is ``slow``: ``pytest -m "not slow"`` is the fast tier.
    - Under pytest-xdist (``-n 2 --dist loadgroup``) a session fixture runs once per worker, so every
      test using ``case_results`` (one launch per world size, shared by several files) goes to one
      worker, and so does every test using ``quick_profile``; each module with a module-scoped
      launch (or a session-scoped one of its own) stays on one worker: no launch runs twice.
    - Modules with a ``slow`` test run first (each module's tests stay together and in order): the
      scheduler hands out ungrouped tests in collection order, so the minute-long ones start early
      and the last tests to hand out are quick ones, and both workers finish at about the same time.
    """
    for item in items:
        if item.get_closest_marker("torchrun"):
            item.add_marker(pytest.mark.slow)
        shared = [name for name in SHARED_FIXTURES if name in getattr(item, "fixturenames", ())]
        if shared:
            item.add_marker(pytest.mark.xdist_group(shared[0]))
        elif item.get_closest_marker("slow") and _uses_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
    slow_modules = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_modules)


def _uses_a_module_fixture(item: pytest.Item) -> bool:
    """A module-scoped fixture, or a session-scoped one the test's own module defines (a session
    fixture runs once per worker, so its module's tests share it only on one worker)."""
    info = getattr(item, "_fixtureinfo", None)
    module = getattr(item, "module", None)
    return bool(info) and any(
        d.scope == "module" or (d.scope == "session" and module is not None
                                and getattr(d.func, "__module__", None) == module.__name__)
        for defs in info.name2fixturedefs.values() for d in defs)
