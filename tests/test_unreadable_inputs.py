"""A file that opens but cannot be read (``/proc/self/mem`` gives EIO) is bad input: exit 2 and one
line naming it, from every command that reads a file the user names (before: exit 3, "internal error")."""

import os

import pytest
from click.testing import CliRunner

from planner.cli import main

EIO_FILE = "/proc/self/mem"
JOB = ["--gpus", "8", "--global-batch", "8", "--seq-len", "1024"]


def _reading_fails() -> bool:
    try:
        with open(EIO_FILE, "rb") as handle:
            handle.read(1)
    except OSError:
        return True
    return False


pytestmark = pytest.mark.skipif(not os.path.exists(EIO_FILE) or not _reading_fails(),
                                reason="needs a file that opens but fails to read")


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    out = tmp_path_factory.mktemp("plan") / "plan.json"
    result = CliRunner().invoke(main, ["plan", "--model", "tiny-llama", "--hardware", "cpu", "--gpus", "2",
                                       "--global-batch", "4", "--seq-len", "64", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return str(out)


@pytest.mark.parametrize("args", [
    ["plan", "--model", EIO_FILE, "--hardware", "h100", *JOB],
    ["plan", "--model", "llama3-8b", "--hardware", EIO_FILE, *JOB],
    ["plan", "--model", "llama3-8b", "--hardware", "h100", "--profile", EIO_FILE, *JOB],
    ["evaluate", "--model", EIO_FILE, "--hardware", "h100", *JOB, "--dp", "8", "--tp", "1", "--pp", "1"],
    ["explain", EIO_FILE],
    ["launch", EIO_FILE, "--out", "{tmp}/job"],
    ["validate", EIO_FILE, "--dry-run"],
    ["profile", "show", EIO_FILE],
    ["profile", "import-nccl-tests", EIO_FILE, "--out", "{tmp}/p.json"],
    ["profile", "import-trace", EIO_FILE, "--out", "{tmp}/p.json"],
    ["validate", "{plan}", "--calibrate", "--from-log", EIO_FILE, "--profile", "{tmp}/p.json"],
])
def test_an_unreadable_input_file_exits_2_naming_it(args, tmp_path, plan_file):
    args = [a.format(tmp=tmp_path, plan=plan_file) for a in args]
    result = CliRunner().invoke(main, args)
    lines = [line for line in result.output.splitlines() if not line.endswith(("means h100-sxm-80gb",))]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: ") and EIO_FILE in lines[0], result.output
    assert "Input/output error" in lines[0]
