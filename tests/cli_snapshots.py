"""The CLI outputs frozen by ``tests/test_cli_snapshots.py``: every command's ``--help`` and the
80-column tables of ``plan``, ``models`` and ``hardware``.

Regenerate after an intended change with ``.venv/bin/python tests/cli_snapshots.py`` and review
the diff of ``tests/data/cli_snapshots/``."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from click.testing import CliRunner

SNAPSHOT_DIR = Path(__file__).parent / "data" / "cli_snapshots"
COMMANDS = ("plan", "evaluate", "explain", "models", "hardware", "profile", "launch", "trace", "shard", "validate",
            "calibrate")
TABLES = {
    "plan-table": ["plan", "--model", "tiny-llama", "--hardware", "cpu", "--gpus", "4", "--global-batch", "8",
                   "--seq-len", "128", "--precision", "fp32"],
    "models-table": ["models"],
    "hardware-table": ["hardware"],
}
_TIMING = re.compile(r" in \d+\.\d+ s;")


def cases() -> dict[str, list[str]]:
    """Snapshot name -> autoplan arguments."""
    return {**{f"{c}-help": [c, "--help"] for c in COMMANDS}, "autoplan-help": ["--help"], **TABLES}


def render(args: list[str]) -> str:
    """What ``autoplan ARGS`` prints at 80 columns, with the search's wall time taken out."""
    from planner.cli import main

    result = CliRunner().invoke(main, args, env={"COLUMNS": "80", "TERM": "dumb"}, terminal_width=80)
    return _TIMING.sub(" in 0.00 s;", result.stdout)


def main() -> None:
    SNAPSHOT_DIR.mkdir(parents=True, exist_ok=True)
    for name, args in cases().items():
        (SNAPSHOT_DIR / f"{name}.txt").write_text(render(args), encoding="utf-8")
    print(f"wrote {len(cases())} snapshots to {SNAPSHOT_DIR}", file=sys.stderr)


if __name__ == "__main__":
    main()
