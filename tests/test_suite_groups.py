"""The suite's placement rule holds: tests that ``tests/conftest.py`` puts in one xdist group run on
one worker under ``-n 2 --dist loadgroup`` (the command README and .ci/run use), so a shared launch
runs once. pytest-xdist 3.8 groups by renaming node ids, which pytest 9.2 ignores; this test is
what notices such a change."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

GROUPED = '''
import os, pytest

@pytest.fixture(scope="module")
def shared():
    return os.environ["PYTEST_XDIST_WORKER"]

@pytest.mark.torchrun
@pytest.mark.parametrize("i", range(6))
def test_grouped(shared, i, tmp_path_factory):
    out = os.environ["GROUPS_OUT"]
    with open(out, "a") as f:
        f.write(f"{shared} {os.environ['PYTEST_XDIST_WORKER']}\\n")
'''


def test_a_module_with_a_shared_launch_runs_on_one_worker(tmp_path):
    (tmp_path / "conftest.py").write_text((TESTS / "conftest.py").read_text().replace(
        "from case_launch import CaseResults, run_all\n", ""))  # the hook only; no launch fixture needed
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    (tmp_path / "test_other.py").write_text("def test_a(): pass\n\ndef test_b(): pass\n")
    out = tmp_path / "workers.txt"
    env = {**os.environ, "GROUPS_OUT": str(out)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p",
                           "no:cacheprovider", "-o", "markers=torchrun", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = out.read_text().split("\n")[:-1]
    assert len(lines) == 6
    assert len(set(lines)) == 1, lines  # one worker ran the module fixture and every test of the module
