"""benchmarks/search_instructions.py: the jobs it counts are search_speed's, and bad input is one line."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import search_instructions  # noqa: E402
import search_speed  # noqa: E402


def test_each_job_is_a_reference_job_of_search_speed():
    jobs = [eval(expression, vars(search_speed)) for expression in search_instructions.JOBS.values()]  # noqa: S307
    assert jobs == [search_speed.API_CALL, *search_speed.CASES.values()]


def test_an_unknown_job_is_refused_in_one_line():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "search_instructions.py"), "--jobs", "70b,8b"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.strip() == "--jobs: unknown 8b; choose from 70b, 1t, 405b"
