"""``python -m planner.cli``: the same command as ``autoplan``."""

from planner.cli import main

main(prog_name="autoplan")
