"""Shared pieces of the CLI: error handling, atomic file writes, output formats."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, TypeVar

import click

from hardware_specs.errors import AutoplanError
from profiles.io import write_text_atomic

T = TypeVar("T")

EXIT_OK = 0
EXIT_INFEASIBLE = 1
EXIT_USAGE = 2


def run_command(work: Callable[[], T]) -> T:
    """Run ``work``; turn user-input errors into one line on stderr and exit status 2."""
    try:
        return work()
    except AutoplanError as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(EXIT_USAGE)


def write_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file and rename: never half-written.

    ``-`` writes to stdout.
    """
    if str(path) == "-":
        click.echo(text, nl=not text.endswith("\n"))
        return
    try:
        write_text_atomic(Path(path), text)
    except OSError as err:
        raise AutoplanError(f"--out: cannot write {path} ({err.strerror})") from None
