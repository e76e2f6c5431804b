"""Write the lock (``constraints.txt``) from what a virtual environment has installed.

Usage: ``python scripts/write_lock.py VENV_PYTHON OUT``. torch is written as ``torch==X.Y.Z``
without the local build label (``+cpu``), so the same line admits the CPU wheel here and a CUDA
build of the same release on a cluster. The file is replaced atomically.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

HEADER = """\
# Exact versions the test suite last passed with (pip constraints file).
# scripts/setup.sh installs through it; refresh with: bash scripts/refresh-lock.sh
# (resolves the newest releases, runs the suite, rewrites this file only if it passes).
"""


def locked_lines(python: str) -> list[str]:
    """``name==version`` for every installed distribution but autoplan itself, sorted by name."""
    frozen = subprocess.run([python, "-m", "pip", "freeze", "--exclude-editable", "--disable-pip-version-check"],
                            capture_output=True, text=True, check=True).stdout
    lines = []
    for line in frozen.splitlines():
        name, sep, version = line.partition("==")
        if not sep or name.lower() == "autoplan":
            continue
        lines.append(f"{name}=={version.split('+', 1)[0]}")
    return sorted(lines, key=str.lower)


def main(python: str, out: str) -> None:
    text = HEADER + "\n".join(locked_lines(python)) + "\n"
    target = Path(out)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, target)


if __name__ == "__main__":
    main(*sys.argv[1:3])
