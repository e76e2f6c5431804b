"""A pytest plugin that writes each test's CPU seconds, for finding where the suite's time goes.

    PYTHONPATH=tests CPU_TIMES_DIR=/tmp/cpu .venv/bin/python -m pytest -q -n 2 --dist loadgroup -p cpu_times

appends one line per test to ``$CPU_TIMES_DIR/cpu-<worker>.tsv``: node id, CPU seconds of the test
process, CPU seconds of the child processes it waited for (subprocesses, launches, and their own
waited-for children), wall seconds; setup, call and teardown together, so a shared fixture counts
for the first test that uses it. On a shared machine wall times count other jobs' time; CPU times
do not. Not loaded unless named with ``-p``.
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

import pytest


def _cpu_s() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    own, children = _cpu_s()
    began = time.monotonic()
    yield
    own_after, children_after = _cpu_s()
    folder = Path(os.environ.get("CPU_TIMES_DIR", "."))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(folder / f"cpu-{worker}.tsv", "a", encoding="utf-8") as out:
        out.write(f"{item.nodeid}\t{own_after - own:.2f}\t{children_after - children:.2f}\t"
                  f"{time.monotonic() - began:.2f}\n")
